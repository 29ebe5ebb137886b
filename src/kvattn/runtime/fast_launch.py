"""Launch compiled Triton kernels (3.6, 3.7) without ``JITFunction.run`` on every call.

``kernel[grid](*args, **kwargs)`` costs tens of microseconds of host time in Triton 3.6: it binds
every argument through a generated function, specialises each one natively, builds a string key,
looks the compiled kernel up, checks the kernel's globals and builds launch metadata. At batch-1
decode that is longer than the kernels themselves. Here:

1. a :class:`Launch` binds everything of one launch that a caller can fix ahead (grid,
   constexprs, options, the scalar arguments that follow from shapes, the geometry of the TMA
   descriptors it builds on a call's tensors: :class:`.tma_descriptors.Descriptor`), once, each argument by the
   kernel parameter's name; the names are resolved to positions there, once (Triton's
   ``JITFunction.params``), so a call only picks its values into place. Every kernel family
   launches through Launch objects kept in a plan cached under the call's host facts
   (docs/extending.md, "A kernel family");
2. :func:`call_args` reads a call's tensors once (data pointer, dtype, 16-byte alignment), its
   per-call ints and floats, for every launch of the call (a decode call's split and combine
   launches); a :class:`CallLayout` names those values, in the order the caller passes them;
3. a launch looks the compiled kernel up under a key of the facts Triton specialises on
   (:mod:`.arg_specs` lists them) and calls its launcher with raw pointers, as
   ``CompiledKernel.__getitem__`` does (:func:`.c_launcher.launcher`).

The first call of each key goes through ``kernel[grid](...)``, which compiles (or finds) the
kernel Triton itself picks; its return value is cached under the key.

Beside this module: :mod:`.arg_specs` (Triton's specialisation of an argument), :mod:`.tma_descriptors`
(the TMA descriptors a launch builds, and their expansion for the launcher), :mod:`.c_launcher`
(Triton's C launcher called straight) and :mod:`.launch_replay` (a recorded call's launches
replayed, for :mod:`.callcache`).

The fast path runs only on Triton 3.6 and 3.7 (the versions whose rules :mod:`.arg_specs` holds), for compiled
``JITFunction`` kernels outside the interpreter, with no launch hooks and no pre-run hooks set,
and unless ``KVATTN_FAST_LAUNCH=0``; otherwise every launch is a plain ``kernel[grid](...)``.

Raw pointers skip the launcher's ``cuPointerGetAttribute`` check that a tensor is device memory:
callers pass tensors they validated to be on the current CUDA device.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import operator
from itertools import repeat
from typing import Any, Callable, NamedTuple, Sequence

import torch
import triton

from . import device as _device, env as _env, native_checks as _native
from .arg_specs import Unspecializable, arg_spec, int_spec
from .c_launcher import launcher
from .ptx_hints import applied as ptx_hints_applied
from .tma_descriptors import Descriptor, descriptor_spec

# The Triton versions whose specialisation rules and launcher this module was verified against
# (tests/runtime/test_fast_launch.py compares its launches with Triton's own, bit for bit, on the GPU):
# 3.7 keeps 3.6's argument specialisation and ``CompiledKernel.run`` signature; its launcher's C
# entry point takes the kernel's parameters as one sequence (see :func:`.c_launcher.launcher`).
FAST_LAUNCH_VERSIONS = ("3.6", "3.7")
TRITON_SUPPORTED = triton.__version__.startswith(FAST_LAUNCH_VERSIONS)

from triton.compiler.compiler import CompiledKernel  # noqa: E402  (every version kvattn runs on)

if TRITON_SUPPORTED:  # the names this module relies on, as Triton 3.6 and 3.7 spell them
    from triton import knobs
    from triton.knobs import HookChain
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    try:  # Gluon's JIT: JITFunction's run and binder (only its AST source differs), so its rules
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:  # pragma: no cover - a Triton without Gluon
        GluonJITFunction = JITFunction
    _JIT_TYPES = (JITFunction, GluonJITFunction)

_MISSING = object()
_NO_GLOBALS = ((), (), (), (), ())  # what _remember_globals keeps for a kernel that reads no globals
# A module dict's version changes with any of its globals: the globals a kernel read are compared
# only after one of their modules changed (a decode kernel's ten: ~0.5 us a launch otherwise).
_dict_version = _native.dict_version()

_data_ptr = torch.Tensor.data_ptr
_dtype = operator.attrgetter("dtype")
_low_bits = (15).__and__  # x & 15: a pointer's (or an int's) offset from a multiple of 16


def fast_path_enabled() -> bool:
    """Whether launches may bypass ``kernel[grid]`` now (Triton 3.6 / 3.7, compiled, no launch hooks)."""
    if not TRITON_SUPPORTED or not _env.fast_launch() or _device.is_interpreter():
        return False
    return no_launch_hooks()


def no_launch_hooks() -> bool:
    """No launch enter/exit hook is set in Triton's knobs (a hook must see every launch: Triton's path)."""
    runtime = knobs.runtime
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook  # None, or a HookChain of hooks
    return (enter is None or (type(enter) is HookChain and not enter.calls)) and (
        exit_ is None or (type(exit_) is HookChain and not exit_.calls)
    )


# ---------------------------------------------------------------------------------------------
# the per-call arguments
# ---------------------------------------------------------------------------------------------
class CallLayout(NamedTuple):
    """The names of a call's per-call values, in the order the caller hands them to
    :func:`call_args`: its tensors, ints and floats. A :class:`Launch` maps kernel parameters to
    these names."""

    tensors: tuple
    ints: tuple = ()
    floats: tuple = ()

    def positions(self) -> dict[str, int]:
        """Each name's index into ``tensors + ints + floats``."""
        names = self.tensors + self.ints + self.floats
        if len(set(names)) != len(names):
            raise ValueError(f"CallLayout: names must be unique, got {names}")
        return {name: i for i, name in enumerate(names)}


class CallArgs:
    """The tensors, per-call ints and floats of one call, read once for every launch of the call.

    ``key`` is None when the fast path is off; otherwise an int standing for :func:`call_key` of
    the call (equal facts, equal ints), and ``ptrs``/``stream`` are what the launcher takes.
    ``values``: ``ptrs + ints + floats``, what a fast launch picks its per-call arguments from.
    """

    __slots__ = ("tensors", "ints", "floats", "ptrs", "key", "stream", "values")

    def __init__(self, tensors: tuple, ints: tuple = (), floats: tuple = (), ptrs: tuple | None = None,
                 key: int | None = None, stream: int = 0):
        self.tensors = tensors
        self.ints = ints
        self.floats = floats
        self.ptrs = ptrs
        self.key = key
        self.stream = stream
        self.values = None if ptrs is None else ptrs + ints + floats

    def triton_values(self) -> tuple:
        """``tensors + ints + floats`` for Triton's own path (floats through ``float()``: Triton
        specialises an int otherwise; the compiled launcher reads them as C doubles)."""
        return self.tensors + self.ints + tuple(map(float, self.floats))


def call_key(device: int, dtypes: tuple, ptrs: tuple, ints: tuple) -> tuple:
    """What a call's tensors and ints, the device and Triton's compile knobs add to a launch key.

    Raises :class:`Unspecializable` for an int Triton would not specialise as :func:`.arg_specs.int_spec` says.
    """
    return (
        device,
        dtypes,
        tuple(map(_low_bits, ptrs)),  # offsets from 16-byte alignment (finer than aligned or not)
        _int_specs(ints),
        knobs.runtime.debug,
        knobs.compilation.instrumentation_mode,
    )


# ints -> tuple(map(int_spec, ints)), for tuples of ints only (True == 1 and 5.0 == 5 as keys: a hit
# counts only when every value is an int).
_INT_SPECS: dict[tuple, tuple] = {}
_MAX_INT_SPECS = 4096


def _int_specs(ints: tuple) -> tuple:
    specs = _INT_SPECS.get(ints)
    if specs is not None:
        for value in ints:
            if type(value) is not int:
                break
        else:
            return specs
    specs = tuple(map(int_spec, ints))  # ints only, past here
    if len(_INT_SPECS) >= _MAX_INT_SPECS:
        _INT_SPECS.clear()
    _INT_SPECS[ints] = specs
    return specs


# call_key facts -> int. One int stands for them in the key of every launch of a call (hashing
# them again for each launch costs more). Ids are never reused, so a launch cache may hold stale
# ids but never ones that now mean other facts.
_KEY_IDS: dict[tuple, int] = {}
_NEXT_KEY_ID = itertools.count()
_MAX_KEY_IDS = 4096


def _on_gpu(t) -> bool:
    return t.is_cuda


def call_args(tensors: tuple, ints: tuple = (), floats: tuple = (), device: int | None = None) -> CallArgs:
    """Read a call's tensor arguments and per-call int and float arguments (see :class:`CallArgs`),
    in the order of the launches' :class:`CallLayout`.

    ``device``: the current device's index where the caller knows it (saves asking the driver).
    """
    if not (tensors and _on_gpu(tensors[0])) or not fast_path_enabled():
        # Raw pointers skip the launcher's pointer checks: host tensors (a direct torch.ops call)
        # take Triton's path, which rejects them.
        return CallArgs(tensors, ints, floats)
    ptrs = tuple(map(_data_ptr, tensors))
    active = driver.active
    if device is None:
        device = active.get_current_device()
    try:
        facts = call_key(device, tuple(map(_dtype, tensors)), ptrs, ints)
    except Unspecializable:
        return CallArgs(tensors, ints, floats)
    key = _KEY_IDS.get(facts)
    if key is None:
        if len(_KEY_IDS) >= _MAX_KEY_IDS:
            _KEY_IDS.clear()
        key = _KEY_IDS[facts] = next(_NEXT_KEY_ID)
    return CallArgs(tensors, ints, floats, ptrs, key, active.get_current_stream(device))



def with_descriptors(call: CallArgs, descriptors: dict) -> CallArgs:
    """``call`` with the tensors at the given positions replaced by tensor descriptors
    (``{position: TensorDescriptor}``, Triton's or Gluon's) for every launch of the call.

    The key becomes the call's key and each descriptor's :func:`.tma_descriptors.descriptor_spec`, so equal keys
    still mean the same compiled kernel. The fast path expands them for Triton's C launcher itself,
    keeping each encoding per pointer and geometry (:class:`.tma_descriptors.DescriptorSlot`; Triton's own
    ``wrap_handle_tensordesc`` reads ``base.data_ptr()``, ``shape``, ``strides``, ``padding``, and
    encodes on every launch); Triton's own path takes them as arguments. A recorded call keeps a
    :class:`.tma_descriptors.ReplayDescriptor` template of each, rebuilt on its base's new pointer
    (:func:`.tma_descriptors.descriptor_template`).
    """
    tensors = list(call.tensors)
    ptrs = None if call.ptrs is None else list(call.ptrs)
    for i, desc in descriptors.items():
        tensors[i] = desc
        if ptrs is not None:
            ptrs[i] = desc
    key = call.key
    if key is not None:
        facts = (key, tuple((i, descriptor_spec(d)) for i, d in sorted(descriptors.items())))
        key = _KEY_IDS.get(facts)
        if key is None:
            if len(_KEY_IDS) >= _MAX_KEY_IDS:
                _KEY_IDS.clear()
            key = _KEY_IDS[facts] = next(_NEXT_KEY_ID)
    return CallArgs(tuple(tensors), call.ints, call.floats, None if ptrs is None else tuple(ptrs), key,
                    call.stream)


# ---------------------------------------------------------------------------------------------
# launches
# ---------------------------------------------------------------------------------------------
def _picker(indices: Sequence[int]) -> Callable[[tuple], tuple]:
    """``f(t) = tuple(t[i] for i in indices)``, at C speed for two or more indices."""
    if len(indices) >= 2:
        return operator.itemgetter(*indices)
    if len(indices) == 1:
        index = indices[0]
        return lambda t: (t[index],)
    return lambda t: ()


def _grid3(grid: Sequence[int]) -> tuple[int, int, int]:
    if not 1 <= len(grid) <= 3:
        raise ValueError(f"grid: expected 1 to 3 dims, got {tuple(grid)}")
    g = tuple(int(x) for x in grid)
    return g + (1,) * (3 - len(g))


def _resolve(kernel, layout: CallLayout, per_call: dict, fixed: dict, constexprs: dict,
             tuples: dict) -> tuple[tuple, tuple]:
    """``(bound, indices)``: the fixed values and constexprs in the kernel's parameter order
    (``bound``; a tuple parameter's, the tuple of its members' values), and for each parameter its
    index into ``call values + bound``. Raises TypeError naming the parameters (or tuple members)
    nobody gave, given twice or unknown to the kernel."""
    name = getattr(getattr(kernel, "fn", None), "__name__", None) or getattr(kernel, "__name__", "kernel")
    params = _parameters(kernel)
    problems = []
    unknown = sorted(set(tuples) - {n for n, _ in params})
    if unknown:
        problems.append(f"tuples of no parameter: {unknown}")
    runtime = {m for n, is_constexpr in params if not is_constexpr for m in tuples.get(n, (n,))}
    constant = {m for n, is_constexpr in params if is_constexpr for m in tuples.get(n, (n,))}
    given = set(per_call) | set(fixed)
    if set(per_call) & set(fixed):
        problems.append(f"given twice: {sorted(set(per_call) & set(fixed))}")
    if runtime - given:
        problems.append(f"no value for {sorted(runtime - given)}")
    if given - runtime:
        problems.append(f"not arguments of the kernel: {sorted(given - runtime)}")
    if set(constexprs) != constant:
        problems.append(f"constexprs: expected {sorted(constant)}, got {sorted(constexprs)}")
    # A call's values are picked straight into place: a tuple would have to be built on every call.
    members = sorted(set(per_call) & {m for n in tuples for m in tuples[n]})
    if members:
        problems.append(f"tuple members take fixed values only: {members}")
    positions = layout.positions()
    unknown = sorted(v for v in per_call.values() if v not in positions)
    if unknown:
        problems.append(f"per-call values not in the call layout: {unknown}")
    if problems:
        raise TypeError(f"{name}: " + "; ".join(problems))
    base = len(positions)
    bound, indices = [], []
    for n, is_constexpr in params:
        if n in per_call:
            indices.append(positions[per_call[n]])
        else:
            indices.append(base + len(bound))
            values = constexprs if is_constexpr else fixed
            bound.append(tuple(values[m] for m in tuples[n]) if n in tuples else values[n])
    return tuple(bound), tuple(indices)


def _parameters(kernel) -> list[tuple[str, bool]]:
    """``(name, is_constexpr)`` of each parameter of ``kernel``, in order: a ``JITFunction``'s
    ``params``, or (the interpreter's ``InterpretedFunction``) its function's signature, where a
    constexpr is annotated ``tl.constexpr``."""
    params = getattr(kernel, "params", None)
    if params is not None:
        return [(p.name, bool(p.is_constexpr)) for p in params]
    signature = inspect.signature(kernel.fn)
    return [(p.name, "constexpr" in str(p.annotation)) for p in signature.parameters.values()]


# (id(kernel), static key) -> (kernel, {key: (CompiledKernel, launch, fixed)}): launches with equal
# bound parts share their entries. Keyed by id because a JITFunction hashes by its source.
_SHARED: dict = {}


def _shared_cache(kernel, static: tuple) -> dict:
    owner, cache = _SHARED.setdefault((id(kernel), static), (kernel, {}))
    if owner is not kernel:  # an id reused after a kernel object was freed: start afresh
        cache = {}
        _SHARED[(id(kernel), static)] = (kernel, cache)
    return cache


class Launch:
    """One launch of ``kernel`` with its grid, constexprs, options and fixed scalars bound, every
    argument by its parameter's name.

    Each non-constexpr parameter of the kernel is named once, in ``per_call`` (the call's value of
    that name: a tensor, int or float of ``layout``) or in ``fixed`` (a scalar that follows from
    the launch's shapes); ``constexprs`` names every constexpr parameter. A tuple parameter
    (``tuples``) is named by its members instead, in ``fixed`` or ``constexprs``. The names are
    resolved to positions here, once: a kernel parameter nobody names, or a name the kernel does
    not have, is a TypeError now rather than a wrong argument later. Calling the launch is
    ``kernel[grid](**arguments, **options)``, through the compiled kernel's launcher whenever it
    can (see the module docstring).

    Parameters
    ----------
    kernel : triton.runtime.jit.JITFunction (any other kernel object with ``params`` is launched
        by Triton)
    grid : tuple of 1 to 3 ints
    layout : CallLayout
        The names of the call's tensors, ints and floats (:func:`call_args`' order).
    per_call : dict
        Kernel parameter -> the name of the call's value it takes.
    fixed : dict
        Kernel parameter (or member of a tuple parameter) -> its value for every call of this launch.
    constexprs, options : dict
        The constexpr parameters (or members of constexpr tuples), and launch options such as
        ``num_warps``, ``num_stages`` or ``launch_pdl``.
    ptx_hints : bool
        The kernel marks its copies for :mod:`.ptx_hints`: every launch that goes through Triton
        (and may compile) runs inside :func:`.ptx_hints.applied`.
    descriptors : sequence of Descriptor
        Tensors of the call the kernel takes as TMA descriptors: each call replaces them by their
        descriptor (:func:`with_descriptors`) before launching.
    tuples : dict
        The kernel's tuple parameters, each by its members' names in order
        (``kvattn.ops.decode.kernels.SPLIT_TUPLES``): the launch passes the tuple of the members'
        values, which Triton hands the GPU as separate parameters. :attr:`fixed` and
        :attr:`constexprs` keep the members by name.
    """

    def __init__(
        self,
        kernel,
        grid: Sequence[int],
        *,
        layout: CallLayout,
        per_call: dict,
        fixed: dict,
        constexprs: dict,
        options: dict,
        ptx_hints: bool = False,
        descriptors: Sequence[Descriptor] = (),
        tuples: dict | None = None,
    ):
        self.kernel = kernel
        self._scope = ptx_hints_applied if ptx_hints else contextlib.nullcontext
        self.grid = tuple(grid)
        self.layout = layout
        self.per_call = dict(per_call)
        self.fixed = dict(fixed)
        self.constexprs = dict(constexprs)
        self.options = dict(options)
        self.tuples = {n: tuple(members) for n, members in (tuples or {}).items()}
        self._grid3 = _grid3(self.grid)
        self.descriptors = tuple(descriptors)
        positions = layout.positions()
        unknown = sorted(d.tensor for d in self.descriptors if d.tensor not in layout.tensors)
        if unknown:
            raise TypeError(f"descriptors of tensors not in the call layout: {unknown}")
        self._described = tuple((positions[d.tensor], d.maker()) for d in self.descriptors)
        self._bound, indices = _resolve(kernel, layout, self.per_call, self.fixed, self.constexprs, self.tuples)
        # Every parameter in the kernel's order (constexprs in place: Triton's launcher and
        # kernel[grid] both take them so), picked from the call's values followed by _bound.
        self._pick = _picker(indices)
        self._indices = indices
        self._globals = None  # what _globals_unchanged compares, once the kernel has compiled
        self._global_dicts: tuple = ()  # the module dicts those globals live in
        self._global_versions = None  # their versions when the globals last compared unchanged
        static = self.static_key()
        self.fast = static is not None
        self._compiled: dict = _shared_cache(kernel, static) if self.fast else {}
        self.last: Any = None  # the CompiledKernel of the latest call (for tests and tools)

    def argument(self, name: str, call: CallArgs):
        """The value parameter ``name`` (or a member of a tuple parameter) gets in a launch for
        ``call`` (Triton's path's view)."""
        names = [n for n, _ in _parameters(self.kernel)]
        values = self._pick(self.described(call).triton_values() + self._bound)
        for n, members in self.tuples.items():
            if name in members:
                return values[names.index(n)][members.index(name)]
        return values[names.index(name)]

    def described(self, call: CallArgs) -> CallArgs:
        """``call`` with this launch's :attr:`descriptors` in place of their tensors (``call``
        itself for a launch without descriptors)."""
        if not self._described:
            return call
        tensors = call.tensors
        return with_descriptors(call, {i: make(tensors[i]) for i, make in self._described})

    def static_key(self) -> tuple | None:
        """The bound part of the key, or None when this launch is always left to Triton."""
        if not TRITON_SUPPORTED or type(self.kernel) not in _JIT_TYPES:
            return None
        runtime = [p for p in self.kernel.params if not p.is_constexpr]
        if any(p.do_not_specialize or p.do_not_specialize_on_alignment or p.annotation_type for p in runtime):
            return None  # specialised otherwise than arg_spec models
        try:
            scalars = tuple((n, arg_spec(v)) for n, v in sorted(self.fixed.items()))
            constexprs = tuple((n, type(v), v) for n, v in sorted(self.constexprs.items()))
            options = tuple((n, type(v), v) for n, v in sorted(self.options.items()))
            key = (self._indices, len(self.layout.tensors), len(self.layout.ints), len(self.layout.floats), scalars,
                   constexprs, options, tuple(sorted(self.tuples.items())))
            hash(key)
        except (Unspecializable, TypeError):
            return None
        return key

    def __call__(self, call: CallArgs) -> None:
        if self._described:
            call = self.described(call)
        key = None  # the per-call part of the key; None: this call is left to Triton
        if call.key is not None and self.fast:
            kernel = self.kernel
            if not kernel.pre_run_hooks:
                key = call.key, kernel.debug
                hit = self._compiled.get(key)
                if hit is not None and self._globals_unchanged():
                    compiled, launch, fixed = hit
                    self.last = compiled
                    launch(*self._grid3, call.stream, *fixed, *self._pick(call.values + self._bound))
                    if _RECORDER is not None:
                        _RECORDER.launched(self, call, call.key)
                    return
        if _RECORDER is not None:
            _RECORDER.spoil(f"{self.kernel}: launched through Triton")
        with self._scope():
            compiled = self.kernel[self.grid](*self._pick(call.triton_values() + self._bound), **self.options)
        self.last = compiled
        if key is not None and isinstance(compiled, CompiledKernel) and compiled.function is not None:
            self._compiled[key] = (compiled, *launcher(compiled))
            self._remember_globals()

    def ready(self, call_key: int):
        """``(CompiledKernel, launch, fixed)`` of this launch for a call whose :func:`call_args` key
        was ``call_key``, where the fast path would launch it now; else None (Triton's path would)."""
        if not self.fast:
            return None
        kernel = self.kernel
        if kernel.pre_run_hooks:
            return None
        hit = self._compiled.get((call_key, kernel.debug))
        if hit is None or not self._globals_unchanged():
            return None
        return hit

    def warmup(self, call: CallArgs) -> None:
        """Compile this launch's kernel for ``call`` and load it onto the GPU, without launching:
        so that a later first launch (in a CUDA-graph capture, where loading a module needs a
        driver of CUDA 12.3+) finds it ready."""
        call = self.described(call)
        with self._scope():
            compiled = self.kernel.warmup(*self._pick(call.triton_values() + self._bound), grid=self.grid,
                                          **self.options)
        if isinstance(compiled, CompiledKernel):
            compiled._init_handles()

    def _remember_globals(self) -> None:
        """Triton refuses a launch once a global the kernel read at compile time has changed
        value; keep what it compares (known once the kernel has compiled)."""
        items = list(self.kernel.used_global_vals.items())
        if not items:
            self._globals = _NO_GLOBALS
            return
        dicts = tuple(g for _, (_, g) in items)
        names = tuple(name for (name, _), _ in items)
        missing = tuple(repeat(_MISSING, len(items)))
        values = tuple(v for _, (v, _) in items)  # Triton's copies, compared by value
        self._global_dicts = tuple({id(d): d for d in dicts}.values())
        self._global_versions = None
        self._globals = (dicts, names, missing, values, tuple(map(dict.get, dicts, names, missing)))

    def _globals_unchanged(self) -> bool:
        if self._globals is None:
            return False
        if self._globals is _NO_GLOBALS:
            return True
        versions = None
        if _dict_version is not None:
            # (read before the values: a change in between shows as another version next time)
            versions = tuple(map(_dict_version, self._global_dicts))
            if versions == self._global_versions:
                return True
        dicts, names, missing, values, seen = self._globals
        now = tuple(map(dict.get, dicts, names, missing))
        # Tuple equality skips __eq__ for identical items: the globals as last seen are the cheap
        # test; Triton's value comparison settles the rest.
        if now == seen:
            self._global_versions = versions
            return True
        if now == values:
            self._globals = (dicts, names, missing, values, now)
            self._global_versions = versions
            return True
        return False


# ---------------------------------------------------------------------------------------------
# recording a call's launches (kvattn.runtime.callcache; .launch_replay replays them)
# ---------------------------------------------------------------------------------------------
_RECORDER = None  # the kvattn.runtime.call_record.Record of the call being recorded, if any (.launch_replay reads it)


@contextlib.contextmanager
def recording(record):
    """Every launch inside the block is reported to ``record`` (``launched``, or ``spoil`` for a
    launch through Triton's own path). A recording inside another spoils the outer one (its
    launches would go to the inner record)."""
    global _RECORDER
    outer = _RECORDER
    if outer is not None:
        outer.spoil("a nested recorded call")
    _RECORDER = record
    try:
        yield record
    finally:
        _RECORDER = outer


