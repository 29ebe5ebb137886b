"""Count the kernels Triton compiles during fuzz calls: the report's measure of how warm a run is.

Triton calls ``knobs.runtime.jit_post_compile_hook`` each time a kernel specialisation enters a
process's in-memory cache (compiled, or loaded from the cache on disk): a call that triggered one
was *cold*. Its ``knobs.compilation.listener`` is told, just before, whether the compile found the
kernel in the disk cache (``cache_hit``: another process, or an earlier run, compiled it). Both are
set only while the fuzzer runs and chain to any set before.
"""

from __future__ import annotations

import contextlib
import json


def _constant(value):
    """A constexpr's value as JSON takes it (dtypes and other objects as their text)."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def describe(kwargs: dict, from_disk: bool | None) -> dict:
    """What ``KVATTN_FUZZ_COMPILE_LOG`` keeps of one compiled kernel, from the post-compile hook's
    arguments: its ``repr`` (kernel, options, each argument's specialisation), its constexprs by
    parameter name (which ``repr`` lacks), the arguments' specialisation attributes (Triton's
    ``tt.divisibility`` of the pointers and ints), and whether it was loaded from the disk cache."""
    compile_ = kwargs.get("compile") or {}
    info = kwargs.get("fn")
    params = [p.name for p in getattr(getattr(info, "jit_function", None), "params", [])]

    def name(path) -> str:
        index = path[0] if isinstance(path, tuple) and path else path
        return params[index] if isinstance(index, int) and index < len(params) else str(path)

    constants = {name(k): _constant(v) for k, v in (compile_.get("constants") or {}).items()}
    attrs = {}
    try:
        data = json.loads(compile_.get("specialization_data") or "{}")
        attrs = {name(tuple(k)): v for k, v in zip(data.get("attrs_keys", []), data.get("attrs_vals", []))}
    except (TypeError, ValueError):
        pass
    return {"repr": str(kwargs.get("repr", "")), "constants": constants, "attrs": attrs, "from_disk_cache": from_disk,
            "num_warps": compile_.get("num_warps"), "num_stages": compile_.get("num_stages")}


class CompileCounter:
    """``count`` grows by one for each kernel Triton compiles or loads while :meth:`installed`;
    ``reprs`` keeps each one's description (kernel, options, every argument's specialisation) and
    ``kernels`` the fuller :func:`describe` record, which the fuzzer writes to
    ``KVATTN_FUZZ_COMPILE_LOG`` to show what made a call cold; ``from_disk`` counts the kernels
    that came from the disk cache rather than a compile."""

    def __init__(self):
        self.count = 0
        self.from_disk = 0
        self.reprs: list[str] = []
        self.kernels: list[dict] = []
        self._hit: bool | None = None  # the listener's cache_hit for the compile under way

    @contextlib.contextmanager
    def installed(self):
        # (Triton imported here, not with the module: `kvattn check --interpret` must set
        # TRITON_INTERPRET before anything imports Triton, and the command line imports this)
        try:
            from triton import knobs
        except ImportError:  # a Triton without knobs: nothing is counted
            knobs = None
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            yield self
            return
        compilation = getattr(knobs, "compilation", None)
        listens = compilation is not None and hasattr(compilation, "listener")
        before = runtime.jit_post_compile_hook
        before_listener = compilation.listener if listens else None

        def listener(*args, **kwargs):
            self._hit = bool(kwargs.get("cache_hit"))
            return before_listener(*args, **kwargs) if before_listener is not None else None

        def hook(*args, **kwargs):
            self.count += 1
            self.from_disk += bool(self._hit)
            self.reprs.append(str(kwargs.get("repr", "")))
            self.kernels.append(describe(kwargs, self._hit))
            self._hit = None
            return before(*args, **kwargs) if before is not None else None

        runtime.jit_post_compile_hook = hook
        if listens:
            compilation.listener = listener
        try:
            yield self
        finally:
            runtime.jit_post_compile_hook = before
            if listens:
                compilation.listener = before_listener
