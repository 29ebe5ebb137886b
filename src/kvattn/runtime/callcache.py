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

import operator
import os
from typing import Any, Callable

import torch

from . import call_record as _record, env as _env, native_checks as _native
from .call_record import Bypass, Record, _Entry, _Watch, _build, _call, _getter, _returns, _tensors  # noqa: F401

MAX_ENTRIES = 256  # metadata signatures a function keeps; past this its cache starts over
MAX_TRIES = 3  # recordings of one signature that made no entry before its calls stop being recorded
MAX_SEEN = 4 * MAX_ENTRIES  # signatures seen a function keeps; past this it forgets them
MAX_HOT = 4  # entries the hit path checks, per argument types, before building the key
# A function whose last FRESH_RUN calls each brought a key never seen before (single decode over a
# length that grows every call, one layer at a time) skips the cache for its next SKIP_CALLS calls:
# building and remembering a key that will never come back cost such a call ~14 us (1.2x the call
# with the cache off; lab/notes/host-path.md). A hit or a key seen again ends the run.
FRESH_RUN = 64
SKIP_CALLS = 256

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
_fast_launch = _launch_replay = None  # kvattn.runtime's modules, once a call has been recorded (_load)
_forgotten = [0]  # times every recording was forgotten: a recording across one is not kept


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
        cache.fresh = cache.skip = 0


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


def _load() -> None:
    """Import the launch modules (they import Triton: not before a call is recorded)."""
    global _fast_launch, _launch_replay
    from . import fast_launch, launch_replay, workspace

    _record.load()
    workspace.KEPT_CHANGED.append(_forget_recordings)  # recordings hold the kept buffers' addresses
    _fast_launch, _launch_replay = fast_launch, launch_replay


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
        self.fresh = 0  # calls in a row that brought a new key (FRESH_RUN)
        self.skip = 0  # calls left that skip the cache (SKIP_CALLS)
        _caches.append(self)

    def run(self, args: tuple, call: Callable[[], Any]):
        """The result of a call with ``args``: replayed from a recorded call of the same key, or
        ``call()`` (the ordinary call), recorded into an entry where it can be."""
        if _suspended or _is_compiling():
            return call()
        if self.skip:
            self.skip -= 1
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
                self.fresh = 0
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
                self.fresh = 0
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
            self.fresh += 1
            if self.fresh >= FRESH_RUN:
                self.fresh, self.skip = 0, SKIP_CALLS
            return call()
        self.fresh = 0
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
