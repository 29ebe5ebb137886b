"""Count the kernels Triton compiles during fuzz calls: the report's measure of how warm a run is.

Triton calls ``knobs.runtime.jit_post_compile_hook`` each time a kernel specialisation enters a
process's in-memory cache (compiled, or loaded from the cache on disk): a call that triggered one
was *cold*. The hook is set only while the fuzzer runs and chains to any hook set before.
"""

from __future__ import annotations

import contextlib


class CompileCounter:
    """``count`` grows by one for each kernel Triton compiles or loads while :meth:`installed`;
    ``reprs`` keeps each one's description (kernel, options, every argument's specialisation), which
    the fuzzer writes to ``KVATTN_FUZZ_COMPILE_LOG`` to show what made a call cold."""

    def __init__(self):
        self.count = 0
        self.reprs: list[str] = []

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
        before = runtime.jit_post_compile_hook

        def hook(*args, **kwargs):
            self.count += 1
            self.reprs.append(str(kwargs.get("repr", "")))
            return before(*args, **kwargs) if before is not None else None

        runtime.jit_post_compile_hook = hook
        try:
            yield self
        finally:
            runtime.jit_post_compile_hook = before
