"""Recording an eager call for :mod:`.callcache`: what it launched (:class:`Record`, filled by
:mod:`.fast_launch`), what else it did (:class:`_Watch`: views, allocations, fills), and the
replayable entry a clean record makes (:func:`_build`, :class:`_Entry`): every launch pointer an
argument's or an allocation's plus a fixed offset, or a buffer kvattn keeps. The rules are the
call cache's (its module docstring).
"""

from __future__ import annotations

import functools
import operator
import threading
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_Tensor = torch.Tensor
_launch_replay = _tma_descriptors = _workspace = None  # kvattn.runtime's modules, once a call is recorded (load)


class Bypass(Exception):
    """An argument the key does not model: the call runs the ordinary way."""


def _getter(indices: list):
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    if indices:
        return lambda t, i=indices[0]: (t[i],)
    return lambda t: ()


def load() -> None:
    """Import the launch modules (they import Triton: not before a call is recorded)."""
    global _launch_replay, _tma_descriptors, _workspace
    from . import launch_replay, tma_descriptors, workspace

    _launch_replay, _tma_descriptors, _workspace = launch_replay, tma_descriptors, workspace


def _tensors(args: tuple) -> list:
    """The tensor arguments in the call key's pointer order (``callcache._flatten``)."""
    out = []
    for a in args:
        if type(a) is _Tensor:
            out.append(a)
        elif type(a) in (tuple, list):
            out.extend(b for b in a if type(b) is _Tensor)
    return out


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
