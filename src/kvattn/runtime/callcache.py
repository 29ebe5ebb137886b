"""Eager calls replayed from their metadata: validation, planning and launch binding skipped.

A serving engine calls each public function with the same shapes, strides, dtypes, devices and
scalar arguments step after step; only the data (and so the data pointers) changes. Everything
a call does on the host but launch its kernels is a function of that *metadata*: the checks at
the API boundary read shapes, strides, dtypes, devices, pointer alignment and scalars (never
device values: those are ``KVATTN_DEBUG``'s), and so do the planners. So a call whose metadata
was seen before needs only its kernels launched again, with the new pointers.

How. A :class:`CallCache` per public function keys calls on :func:`_flatten`: per tensor argument
its shape, strides, dtype, device and data pointer modulo 16 (Triton specialises on 16-byte
alignment; the checks read no finer alignment); per other argument its value and type (so that
``True`` and ``1``, ``1`` and ``1.0`` differ); the raw values of kvattn's environment switches.
On a miss the call runs as always, while :mod:`.fast_launch` records every launch it
makes. The record becomes an entry only if nothing in the call escapes replay:

* every launch went through the fast path to an already compiled kernel (the first call of each
  launch compiles through Triton and is never recorded), none through ``kernel[grid]``;
* the call ran no device op but views, allocations and fills before its first launch (a
  :class:`~torch.utils._python_dispatch.TorchDispatchMode` watches the recorded call): no copy. A
  fill of a whole argument or allocation with a constant (prefill's LSE at ``-inf``) is replayed
  as such, before the launches. An allocation (``torch.empty``, ``empty_like``,
  ``empty_strided``, ``new_empty``: the output or LSE of a call that gives none) is recorded by
  its shape, strides, dtype and device, functions of the key's metadata, and made again with
  ``torch.empty_strided`` on every replay (only those a launch reads, the call fills or returns);
* every pointer a launch received lies in exactly one tensor argument's or allocation's storage
  (it is then that tensor's data pointer plus an offset fixed by the metadata), or is a buffer
  kvattn keeps per stream (single decode's merge counters, :mod:`.workspace`): such an
  entry is valid on its stream only. A TMA tensor descriptor counts by its base pointer; a replay
  rebuilds it on the new pointer with the recorded shape, strides and block (functions of the
  key's metadata);
* the call returned its arguments, its allocations (or None), and no error was raised: an error
  is never cached.

A key is recorded the second time it is seen, not the first: recording costs more than the call
(the dispatch mode sees every view), and a key that never comes back (a single decode whose
length grows every step) would otherwise pay it on every call. The first call of a kernel
compiles through Triton and could not be recorded anyway.

A hit does not build the key: each cache keeps, per tuple of argument types, the entries those
types last replayed (``hot``, at most ``MAX_HOT``), and takes the first whose scalars, switches
and alignment compare equal to the call's and whose tensors pass one C++ check of shapes,
strides, dtypes and devices (:func:`.native_checks.tensor_guard`, stricter than the key: it also
compares dispatch keys and ``requires_grad``); the key is built only where none passes. The
switches' raw values are read again only after ``os.environ`` changed (its dict version).
A hit checks what the key does not hold (the fast path still on: no Triton launch hooks, the same
Triton debug knobs, each launch's compiled kernel still current, the same CUDA device; the
current stream is read afresh), makes the recorded allocations (their 16-byte alignment must be
the recorded one: compiled kernels specialise on it), then launches each recorded launch with
the new pointers, and fills what the call filled. Calls bypass the cache while ``torch.compile``
traces, while a config override is active (tuning), with ``KVATTN_DEBUG=1`` (its device-value
checks then run on every call), while a CUDA graph is being captured where the entry's function
is capture-sensitive, and for tensor subclasses and argument types the key does not model. See
``lab/notes/host-path.md``, "Host path: calls replayed from their metadata" and "Host path: every
call form replayed".

A check added to a public function that reads anything else of a tensor (its storage size, its
pointer beyond 16-byte alignment, a device value) must add that fact to :func:`_flatten`'s key.
"""

from __future__ import annotations

import functools
import operator
import os
import threading
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import env as _env, native_checks as _native

MAX_ENTRIES = 256  # metadata signatures a function keeps; past this its cache starts over
MAX_TRIES = 3  # recordings of one signature that made no entry before its calls stop being recorded
MAX_SEEN = 4 * MAX_ENTRIES  # signatures seen a function keeps; past this it forgets them
MAX_HOT = 4  # entries the hit path checks, per argument types, before building the key

_ENV_NAMES = tuple(_env.SWITCH_NAMES)  # every switch kvattn reads (TRITON_INTERPRET included)
_OVERRIDES = _env._BATCH_INVARIANT  # kvattn.set_batch_invariant's value: [None | bool]
_DATA = getattr(os.environ, "_data", None)
if isinstance(_DATA, dict) and getattr(os.environ, "encodekey", None) is not None:
    _ENV_KEYS = tuple(map(os.environ.encodekey, _ENV_NAMES))
    _env_get = _DATA.get
else:  # pragma: no cover - a platform without os.environ._data
    _ENV_KEYS, _env_get = _ENV_NAMES, os.environ.get

_Tensor = torch.Tensor
_SCALAR_TYPES = frozenset((int, float, str, bool, type(None), torch.dtype))
_MISSING = object()
_is_compiling = torch.compiler.is_compiling
_suspended = 0  # > 0 while a config override is active (plans then depend on more than the facts)
_caches: list["CallCache"] = []
_fast_launch = _launch_replay = _tma_descriptors = _workspace = None  # kvattn.runtime's modules, once a
# call has been recorded (_load)
_forgotten = [0]  # times every recording was forgotten: a recording across one is not kept


class Bypass(Exception):
    """An argument the key does not model: the call runs the ordinary way."""


def suspend(delta: int) -> None:
    """``+1`` on entering a config override, ``-1`` on leaving it; every recording is forgotten."""
    global _suspended
    _suspended += delta
    _forget_recordings()


def clear() -> None:
    """Forget every entry and every key seen (tests, config overrides)."""
    _forget_recordings()
    for cache in _caches:
        cache.seen.clear()


def _forget_recordings() -> None:
    """Forget every entry (and failed recording), keeping the keys seen: a kept buffer was
    replaced, so recordings hold stale addresses, but a key seen is still worth recording."""
    _forgotten[0] += 1
    for cache in _caches:
        cache.entries.clear()
        cache.failures.clear()
        cache.hot.clear()


_shape_dtype = operator.attrgetter("shape", "dtype")  # (both in one read: ~0.1 us less a tensor)
_stride = _Tensor.stride
_data_ptr = _Tensor.data_ptr
_get_device = _Tensor.get_device
_low_bits = (15).__and__
_SIGNATURES: dict = {}  # tuple of argument types -> (tensor picker, other picker), or None: nested


def _signature(types: tuple):
    """Pickers of the tensor and the other arguments of a call with these argument types (None
    where an argument is a tuple or list)."""
    if tuple in types or list in types:
        got = None
    else:
        for t in types:
            if t is not _Tensor and t not in _SCALAR_TYPES:
                raise Bypass
        tensors = [i for i, t in enumerate(types) if t is _Tensor]
        others = [i for i, t in enumerate(types) if t is not _Tensor]
        got = (_getter(tensors), _getter(others))
    if len(_SIGNATURES) >= MAX_ENTRIES:
        _SIGNATURES.clear()
    _SIGNATURES[types] = got
    return got


def _getter(indices: list):
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    if indices:
        return lambda t, i=indices[0]: (t[i],)
    return lambda t: ()


_CACHE_ON: dict = {}  # raw switch values -> whether they leave the call cache on (KVATTN_CALL_CACHE)
# os.environ's dict version (None: not known) -> the switches' raw values, whether the cache is on.
# Reading the nine switches costs ~0.5 us a call; the version ~0.1 (lab/notes/host-path.md
# "Host path: a replayed call's host time").
_env_version = _native.dict_version() if _ENV_KEYS is not _ENV_NAMES else None
_switch_state: tuple = (None, (), False)


def _switches() -> tuple:
    """``(version, raw switch values, cache on)``, read afresh only after ``os.environ`` changed."""
    global _switch_state
    state = _switch_state
    version = None if _env_version is None else _env_version(_DATA)
    if version is None or version != state[0]:
        switches = tuple(map(_env_get, _ENV_KEYS))
        state = _switch_state = (version, switches, _cache_on(switches))
    return state


def _cache_on(switches: tuple) -> bool:
    on = _CACHE_ON.get(switches)
    if on is None:
        on = _env.call_cache()  # (parsed from the same raw values)
        if len(_CACHE_ON) >= MAX_ENTRIES:
            _CACHE_ON.clear()
        _CACHE_ON[switches] = on
    return on


_KEY_LEN, _KEY_BITS, _KEY_OTHERS = 8, 6, 7  # a flat call's key (_flatten): its length, where its
# pointers' alignment and its other arguments' values are


def _flatten(args: tuple, switches: tuple | None = None, types: tuple | None = None) -> tuple[tuple, list]:
    """``(key, pointers)``: the metadata key of a call's arguments and its tensors' data pointers in
    order (:func:`_tensors`' order). Raises :class:`Bypass` for an argument the key does not model.
    ``switches``: the raw values of the switches (``_ENV_KEYS``' values) where the caller has read them.

    Per tensor: shape, strides, dtype, CUDA device index (-1 off CUDA, where no call is recorded:
    only CUDA tensors take the fast path) and the data pointer modulo 16; per other argument its value, and the
    type of every argument (``types``, where the caller has them). Each fact is read for all
    tensors at once (``map``), at C speed."""
    if types is None:
        types = tuple(map(type, args))
    sig = _SIGNATURES.get(types, _MISSING)
    if sig is _MISSING:
        sig = _signature(types)
    if sig is None:  # a tuple or list among the arguments: key its items in its place
        flat = []
        for a in args:
            if type(a) is tuple or type(a) is list:
                flat += a
                flat.append(len(a))
            else:
                flat.append(a)
        key, ptrs = _flatten(tuple(flat), switches)
        return (types, key), ptrs
    tensors = sig[0](args)
    ptrs = list(map(_data_ptr, tensors))
    if switches is None:
        switches = tuple(map(_env_get, _ENV_KEYS))
    key = (types, switches, _OVERRIDES[0], tuple(map(_shape_dtype, tensors)), tuple(map(_stride, tensors)),
           tuple(map(_get_device, tensors)), tuple(map(_low_bits, ptrs)), sig[1](args))
    return key, ptrs


def _tensors(args: tuple) -> list:
    """The tensor arguments in :func:`_flatten`'s pointer order."""
    out = []
    for a in args:
        if type(a) is _Tensor:
            out.append(a)
        elif type(a) in (tuple, list):
            out.extend(b for b in a if type(b) is _Tensor)
    return out


# ---------------------------------------------------------------------------------------------
# recording a call
# ---------------------------------------------------------------------------------------------
_VIEW_FREE = {  # metadata ops that touch no device memory (besides views)
    torch.ops.aten.set_.source_Storage_storage_offset, torch.ops.aten.detach.default,
    torch.ops.aten.lift_fresh.default,
}


_ALLOCATING = {  # ops that allocate and leave the memory uninitialised (a replay makes them again)
    torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default, torch.ops.aten.empty_strided.default,
    torch.ops.aten.new_empty.default, torch.ops.aten.new_empty_strided.default,
}


class _Watch(TorchDispatchMode):
    """Notes every allocation and every fill (before the first launch) of the recorded call, and
    every other op that is not a view (:func:`_inputs.alias`'s empty tensor and ``set_`` are
    neither): such a call is not replayed."""

    def __init__(self, record: "Record"):
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func.is_view or func in _VIEW_FREE:
            return result
        if func is torch.ops.aten.empty.memory_format and args and not any(args[0]):
            return result  # (an alias's zero-size shell: set_ onto an argument's storage next)
        if func in _ALLOCATING and type(result) is _Tensor:
            self.record.allocated(result)
        elif func is torch.ops.aten.fill_.Scalar and type(args[0]) is _Tensor and not self.record.launches:
            self.record.filled(args[0], args[1])
        else:
            self.record.spoil(f"op {func}")
        return result


class Record:
    """What one ordinary call launched (filled by :mod:`.fast_launch`), and why it may not
    be replayed (``spoiled``)."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.launches: list = []  # (Launch, CallArgs, compiled-kernel key)
        self.spoiled: str | None = None
        self.devices: set = set()  # the current device at each launch
        self.allocations: list = []  # the tensors the call allocated (kept alive: no address reused)
        self.fills: list = []  # (tensor, value) of each fill_ before the first launch

    def allocated(self, t: torch.Tensor) -> None:
        if threading.get_ident() == self.thread:
            self.allocations.append(t)

    def filled(self, t: torch.Tensor, value) -> None:
        if threading.get_ident() == self.thread:
            self.fills.append((t, value))

    def launched(self, launch, call, key) -> None:
        if threading.get_ident() == self.thread:
            self.launches.append((launch, call, key))
            self.devices.add(_launch_replay.current_device())

    def spoil(self, why: str) -> None:
        if threading.get_ident() == self.thread and self.spoiled is None:
            self.spoiled = why


class _Entry:
    """A recorded call: its launches with every pointer an argument's or an allocation's plus an
    offset (or a kept buffer's), the allocations to make again, and what the call returned."""

    __slots__ = ("steps", "pick", "offsets", "rebuild", "constants", "stream", "device", "knobs", "returns",
                 "launches", "allocs", "alloc_bits", "fills", "guard", "result", "fill_at")

    def __init__(self, steps, pick, offsets, rebuild, constants, stream, device, knobs, returns, launches,
                 allocs=(), alloc_bits=(), fills=(), fill_at=None):
        self.steps = steps  # per launch: launch_replay.replay_step's tuple
        # A replay's values (launch_replay._replay_values): the pointers of the tensor arguments and
        # allocations, the constants, the stream, then each owner's pointer (pick) plus its offset.
        self.pick = pick  # values so far -> the owners of the pointers at an offset, or None
        self.offsets = offsets
        self.rebuild = rebuild  # ((index into the values, descriptor template), ...): see _build
        self.constants = constants  # kept buffers' pointers (appended to the arg pointers), or []
        self.stream = stream  # the recorded stream where constants pin it, else None
        self.device = device
        self.knobs = knobs
        self.returns = returns  # None, an index into args + allocations, or a tuple of those / None
        self.launches = launches  # the Launch objects (for tests and tools)
        self.allocs = allocs  # per allocation made again: a function making it (torch.empty_strided)
        self.alloc_bits = alloc_bits  # each recorded allocation's data pointer modulo 16
        self.fills = fills  # ((index into the tensor arguments + allocations, value), ...): fill_ first
        self.guard = None  # the check of the key's tensor facts (native_checks.tensor_guard), once made
        self.fill_at = fill_at  # fills as (index into args + allocations, value), where every one has one
        self.result = _result_picker(returns)  # args + allocations -> what the call returns


def _result_picker(returns) -> Callable[[tuple], Any]:
    """``f(args + allocations)``: the call's result, at C speed where it holds no None."""
    if returns is None:
        return lambda pool: None
    if type(returns) is int:
        return operator.itemgetter(returns)
    if None not in returns and len(returns) > 1:
        return operator.itemgetter(*returns)
    return lambda pool: tuple(None if j is None else pool[j] for j in returns)


def _load() -> None:
    """Import the launch modules (they import Triton: not before a call is recorded)."""
    global _fast_launch, _launch_replay, _tma_descriptors, _workspace
    from . import fast_launch, launch_replay, tma_descriptors, workspace

    workspace.KEPT_CHANGED.append(_forget_recordings)  # recordings hold the kept buffers' addresses
    _fast_launch, _launch_replay, _tma_descriptors, _workspace = fast_launch, launch_replay, tma_descriptors, workspace


def _kept_buffers() -> list:
    """``(start, end)`` of the buffers kvattn keeps per stream (single decode's counters and
    partials, :mod:`.workspace`)."""
    workspace = _workspace
    return [(b, b + t.untyped_storage().nbytes()) for t in workspace.kept_buffers() for b in (t.data_ptr(),)]


def _returns(result, args: tuple, allocations: list):
    """Where the call's result came from: None, the index of the argument it is (or
    ``len(args) + i`` for the call's allocation ``i``), or a tuple of those (None for a None
    element). Raises :class:`Bypass` for anything else (a view, a tensor of another kind)."""
    def index(x):
        if x is None:
            return None
        for j, a in enumerate(args):
            if a is x:
                return j
        j = _same_tensor(x, allocations)
        if j is None:
            raise Bypass
        return len(args) + j

    if type(result) is tuple:
        return tuple(map(index, result))
    if result is None:
        return None
    return index(result)


def _same_tensor(x, tensors: list) -> int | None:
    """The index of the tensor of ``tensors`` that ``x`` is: the dispatch mode hands the call
    another Python object over the same tensor, so it is recognised by its memory and geometry."""
    if type(x) is not _Tensor:
        return None
    seen = (x.data_ptr(), x.shape, x.stride(), x.dtype, x.device)
    for j, a in enumerate(tensors):
        if (a.data_ptr(), a.shape, a.stride(), a.dtype, a.device) == seen:
            return j
    return None


_call = functools.partial.__call__  # (every maker is a partial: called by map at C speed)


def _maker(t: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A function making a tensor of ``t``'s shape, strides, dtype and device (uninitialised).
    (``torch.empty_strided`` with every argument bound parses fastest of torch's factories.)"""
    return functools.partial(torch.empty_strided, tuple(t.shape), t.stride(), dtype=t.dtype, device=t.device)


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _build(record: Record, args: tuple, result) -> _Entry | None:
    """The entry a clean record makes, or None (see the module docstring)."""
    if record.spoiled is not None or not record.launches or len(record.devices) != 1:
        return None
    tensors = _tensors(args)
    allocations = record.allocations
    pool = tensors + allocations  # what a pointer may lie in: the arguments, then the allocations
    try:
        returns = _returns(result, args, allocations)
        storages = [_storage(t) for t in pool]
    except (Bypass, RuntimeError):
        return None
    ptrs = [t.data_ptr() for t in pool]
    kept = _kept_buffers()
    constants: list = []
    picks, offsets, spans, rebuild = [], [], [], []
    first = record.launches[0][1]
    for launch, call, key in record.launches:
        if call.ptrs is None or call.stream != first.stream:
            return None
        spans.append((len(picks), len(call.ptrs)))
        for p in call.ptrs:
            if type(p) is not int:
                # A tensor descriptor (TMA): rebuilt at each replay on its base's new pointer, with
                # the recorded geometry (a function of the metadata in the key, as every launch
                # argument is). lab/notes/host-path.md "Host path: calls replayed from their metadata".
                base = _tma_descriptors.descriptor_base(p)
                if base is None:
                    return None
                rebuild.append((len(picks), _tma_descriptors.descriptor_template(p)))
                p = base
            owners = [j for j, (base, size) in enumerate(storages) if base <= p < base + size]
            if len(owners) > 1:
                # Arguments sharing one storage (K and V views of one cache): the one starting at
                # the pointer, if exactly one does; otherwise whose pointer it follows is ambiguous.
                owners = [j for j in owners if ptrs[j] == p]
                if len(owners) != 1:
                    return None
            if owners:
                picks.append(owners[0])
                offsets.append(p - ptrs[owners[0]])
            elif any(start <= p < end for start, end in kept):
                if p not in constants:
                    constants.append(p)
                picks.append(len(pool) + constants.index(p))
                offsets.append(0)
            else:
                return None  # memory that no argument, allocation or kept buffer owns
    fills = []
    for t, value in record.fills:
        j = _same_tensor(t, pool)
        if j is None or type(value) not in (int, float, bool):
            return None  # (a part of a tensor, or a value the replay could not repeat)
        fills.append((j, value))
    # Only the allocations a launch reads, the call fills or returns are made again on a replay.
    returned = returns if type(returns) is tuple else (returns,)
    used = sorted({p - len(tensors) for p in picks if len(tensors) <= p < len(pool)}
                  | {j - len(args) for j in returned if j is not None and j >= len(args)}
                  | {j - len(tensors) for j, _ in fills if j >= len(tensors)})
    if len(used) != len(allocations):
        moved = {old: new for new, old in enumerate(used)}
        picks = [p if p < len(tensors) else len(tensors) + moved[p - len(tensors)] if p < len(pool)
                 else p - len(allocations) + len(used) for p in picks]
        fills = [(j if j < len(tensors) else len(tensors) + moved[j - len(tensors)], value) for j, value in fills]

        def move(j):
            return j if j is None or j < len(args) else len(args) + moved[j - len(args)]

        returns = tuple(map(move, returns)) if type(returns) is tuple else move(returns)
    made = [allocations[i] for i in used]
    # A replay's values: the pool's pointers, the kept buffers', the stream, then one slot per
    # distinct pointer at an offset and per descriptor (rebuilt in its own slot): where[i] is the
    # slot of the launches' pointer i (where[-1] the stream's).
    stream_at = len(tensors) + len(made) + len(constants)
    described = {i for i, _ in rebuild}
    slots: dict = {}
    owners, moved, where = [], [], []
    for i, (p, off) in enumerate(zip(picks, offsets)):
        if off == 0 and i not in described:
            where.append(p)
            continue
        at = None if i in described else slots.get((p, off))
        if at is None:
            at = stream_at + 1 + len(owners)
            owners.append(p)
            moved.append(off)
            if i not in described:
                slots[p, off] = at
        where.append(at)
    where.append(stream_at)
    size = stream_at + 1 + len(owners)
    steps = []
    for (launch, call, key), (start, count) in zip(record.launches, spans):
        step = _launch_replay.replay_step(launch, key, start, count, call.values[count:], where, size)
        if step is None:
            return None
        steps.append(step)
    rebuild = [(where[i], template) for i, template in rebuild]
    pick = _getter(owners) if owners else None
    return _Entry(tuple(steps), pick, tuple(moved), tuple(rebuild), constants, first.stream if constants else None,
                  next(iter(record.devices)), _launch_replay.knob_state(), returns, tuple(s[0] for s in steps),
                  tuple(map(_maker, made)), tuple(t.data_ptr() & 15 for t in made), tuple(fills),
                  _fills_in_args(fills, tensors, args))


def _fills_in_args(fills: list, tensors: list, args: tuple) -> tuple | None:
    """``fills`` (indices into ``tensors`` + allocations) as indices into ``args`` + allocations,
    or None where a filled tensor is not itself an argument (an item of a tuple argument)."""
    out = []
    for j, value in fills:
        if j >= len(tensors):
            out.append((len(args) + j - len(tensors), value))
            continue
        at = [i for i, a in enumerate(args) if a is tensors[j]]
        if not at:
            return None
        out.append((at[0], value))
    return tuple(out)


_NESTED: dict = {}  # argument types with a tuple or list among them -> _hot_pickers' pickers


def _hot_pickers(types: tuple):
    """``(tensors_of, others_of)`` for the hit path's check of calls with these argument types:
    the tensors in :func:`_tensors`' order (a tuple argument's items in its place) and the other
    arguments' values (with each tuple argument's length); None for types the key does not model."""
    sig = _SIGNATURES.get(types, _MISSING)
    if sig is not None:
        return None if sig is _MISSING else sig
    got = _NESTED.get(types)
    if got is None:
        order = [i for i, t in enumerate(types) if t is _Tensor or t is tuple or t is list]
        other_of = _getter([i for i, t in enumerate(types) if t is not _Tensor and t is not tuple and t is not list])
        seq_of = _getter([i for i, t in enumerate(types) if t is tuple or t is list])

        def tensors_of(args):
            out = []
            for i in order:
                a = args[i]
                if type(a) is _Tensor:
                    out.append(a)
                else:
                    out += a
            return out

        def others_of(args):
            return other_of(args), tuple(map(len, seq_of(args)))

        if len(_NESTED) >= MAX_ENTRIES:
            _NESTED.clear()
        got = _NESTED[types] = (tensors_of, others_of)
    return got


def _hot_entry(hot: tuple, args: tuple, switches: tuple):
    """``(entry, pointers)`` of the candidate in ``hot`` (:attr:`CallCache.hot`'s value for these
    argument types) whose key is the call's, or None: the scalars, switches and alignment compare
    equal and one C++ check passes on the tensors' shapes, strides, dtypes and devices (what the
    key holds of them), without building the key."""
    tensors_of, others_of, candidates = hot
    others = others_of(args)
    override = _OVERRIDES[0]
    tensors = ptrs = None
    for entry, check, entry_others, entry_switches, entry_override, bits in candidates:
        if entry_others != others or entry_switches != switches or entry_override is not override:
            continue
        if tensors is None:
            tensors = tensors_of(args)
        if not check(*tensors):
            continue
        if ptrs is None:
            ptrs = list(map(_data_ptr, tensors))
        if tuple(map(_low_bits, ptrs)) == bits:
            return entry, ptrs
    return None


class CallCache:
    """The replay cache of one public function (see the module docstring).

    ``capture_sensitive``: the function's launches differ inside a CUDA-graph capture (single
    decode: its merge counters and RoPE's TMA kernel), so it bypasses the cache while the current
    stream captures.
    """

    def __init__(self, name: str, *, capture_sensitive: bool = False):
        self.name = name
        self.capture_sensitive = capture_sensitive
        self.entries: dict = {}
        self.failures: dict = {}  # key -> recordings that made no entry (the first call compiles)
        self.seen: dict = {}  # keys seen before (a key is recorded when it comes back)
        self.hot: dict = {}  # argument types -> (pickers, tensor check, facts, entry): see run
        self.hits = self.misses = 0  # (tests and tools)
        _caches.append(self)

    def run(self, args: tuple, call: Callable[[], Any]):
        """The result of a call with ``args``: replayed from a recorded call of the same key, or
        ``call()`` (the ordinary call), recorded into an entry where it can be."""
        if _suspended or _is_compiling():
            return call()
        _, switches, on = _switches()  # (KVATTN_CALL_CACHE's, and the key's)
        if not on:
            return call()
        types = tuple(map(type, args))
        hot = self.hot.get(types)
        if hot is not None:
            found = _hot_entry(hot, args, switches)
            if found is not None:
                result = self._replayed(found[0], args, found[1])
                if result is _MISSING:
                    self.misses += 1
                    return call()
                return result
        try:
            key, ptrs = _flatten(args, switches, types)
        except (Bypass, RuntimeError):  # (RuntimeError: a tensor without strides or data)
            return call()
        entry = self.entries.get(key)
        if entry is not None:
            flat = key if len(key) == _KEY_LEN else key[1]  # (a key of tuple arguments: (types, flat key))
            result = self._replayed(entry, args, ptrs)
            if result is not _MISSING:
                if len(flat) == _KEY_LEN:
                    self._promote(types, flat, args, entry, hot)
                return result
        self.misses += 1
        if entry is not None:
            return call()
        # Recorded when it comes back (module docstring). A key hashes anew at every dict lookup,
        # so a first sighting costs one: setdefault, and the size tells whether it was there.
        seen = self.seen
        count = len(seen)
        seen.setdefault(key)
        if len(seen) != count:
            if count >= MAX_SEEN:
                seen.clear()
                seen[key] = None
            return call()
        # (KVATTN_DEBUG=1: its raw value is in the key, and nothing is recorded under it.)
        if self.failures.get(key, 0) >= MAX_TRIES or _env.debug_checks():
            return call()
        if _fast_launch is None:
            try:
                _load()
            except ImportError:  # pragma: no cover - no Triton: nothing launches, nothing to record
                return call()
        if self.capture_sensitive and _launch_replay.capturing():
            return call()
        record, forgotten = Record(), _forgotten[0]
        with _fast_launch.recording(record), _Watch(record):
            result = call()
        if _forgotten[0] != forgotten:
            # A kept buffer was replaced inside the call (single decode's partials, grown): its
            # allocation would be taken for one of the call's own. Recorded again next time.
            return result
        entry = _build(record, args, result)
        del record  # (its allocations: the result holds what the caller gets)
        if entry is None:
            if len(self.failures) >= MAX_ENTRIES:
                self.failures.clear()
            self.failures[key] = self.failures.get(key, 0) + 1
            return result
        if len(self.entries) >= MAX_ENTRIES:
            self.entries.clear()
            self.hot.clear()
        self.entries[key] = entry
        return result

    def _replayed(self, entry: "_Entry", args: tuple, ptrs: list):
        """``entry`` replayed for a call with ``args`` (its tensors' data pointers ``ptrs``, extended
        here): the call's result, or ``_MISSING`` where it cannot be replayed now."""
        if self.capture_sensitive and _launch_replay.capturing():
            return _MISSING
        pool = args
        allocs = entry.allocs
        if len(allocs) == 1:  # the output or LSE the call allocates, made again
            made = allocs[0]()
            ptr = _data_ptr(made)
            if ptr & 15 != entry.alloc_bits[0]:
                return _MISSING  # (another alignment: another compiled kernel, maybe)
            ptrs.append(ptr)
            pool = (*args, made)
        elif allocs:  # both
            made = (allocs[0](), allocs[1]()) if len(allocs) == 2 else tuple(map(_call, allocs))
            more = tuple(map(_data_ptr, made))
            if tuple(map(_low_bits, more)) != entry.alloc_bits:
                return _MISSING  # (another alignment: another compiled kernel, maybe)
            ptrs += more
            pool = args + made
        if entry.fills:
            if entry.fill_at is not None:
                for j, value in entry.fill_at:
                    pool[j].fill_(value)
            else:
                tensors = _tensors(args) + list(pool[len(args):])
                for j, value in entry.fills:
                    tensors[j].fill_(value)
        if not _launch_replay.replay(entry, ptrs):
            return _MISSING
        self.hits += 1
        return entry.result(pool)

    def _promote(self, types: tuple, key: tuple, args: tuple, entry: "_Entry", hot) -> None:
        """Put ``entry`` first among those the hit path checks for calls of these argument types
        (at most ``MAX_HOT``: a serving loop alternates a few call forms or shapes). ``key``: the
        call's flat key (of its arguments with tuples' items in their place)."""
        pickers = _hot_pickers(types)
        if pickers is None:
            return
        tensors = pickers[0](args)
        if any(type(t) is not _Tensor for t in tensors):
            return  # (a tuple argument holding more than tensors)
        candidates = [] if hot is None else [c for c in hot[2] if c[0] is not entry]
        check = entry.guard
        if check is None or (hot is not None and len(candidates) != len(hot[2])):
            # (None: not made yet. Already a candidate: its check failed on this call, whose key is
            # the entry's: made under another thread-local dispatch state, or requires_grad.)
            check = entry.guard = _native.tensor_guard(tensors) or False
        if check is False:
            return
        if len(self.hot) >= MAX_ENTRIES:
            self.hot.clear()
        self.hot[types] = (*pickers, ((entry, check, pickers[1](args), key[1], key[2], key[_KEY_BITS]),
                                      *candidates[:MAX_HOT - 1]))
