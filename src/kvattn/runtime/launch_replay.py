"""Replaying a recorded call's launches (:mod:`.callcache`): the launches :mod:`.fast_launch`
recorded (:func:`~.fast_launch.recording`) launched again through their compiled kernels'
launchers on a call's new data pointers (:func:`replay`), once checked that the fast path would
launch them so now; and the device facts a recorded call is keyed on.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch

from . import fast_launch as _fast_launch
from .fast_launch import TRITON_SUPPORTED, Launch, no_launch_hooks

if TRITON_SUPPORTED:  # (as fast_launch imports them; a test's faked GPU replaces both modules' driver)
    from triton import knobs
    from triton.runtime.driver import driver

_add = operator.add


def current_device() -> int | None:
    """The current CUDA device's index as Triton's driver sees it (None off the fast path)."""
    if not TRITON_SUPPORTED:
        return None
    return driver.active.get_current_device()


def knob_state() -> tuple:
    """Triton's knobs that enter :func:`.fast_launch.call_key`."""
    if not TRITON_SUPPORTED:
        return ()
    return knobs.runtime.debug, knobs.compilation.instrumentation_mode


_CAPTURE_QUERY: list = []  # [torch's capture query, or None without CUDA], once asked


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    if not _CAPTURE_QUERY:
        _CAPTURE_QUERY.append(torch._C._cuda_isCurrentStreamCapturing if torch.cuda.is_available() else None)
    query = _CAPTURE_QUERY[0]
    return query is not None and torch.cuda.is_initialized() and query()


_torch_current_device = torch.cuda.current_device
_cuda_get_device = getattr(torch._C, "_cuda_getDevice", _torch_current_device)  # (less the Python init check)


def replay(entry, ptrs: list):
    """Launch a recorded call's launches (``kvattn.runtime.callcache._Entry``) for a call whose tensor
    arguments have the data pointers ``ptrs``: True, or False (nothing
    launched) where the fast path would not launch them all as recorded now.

    Only for a call whose key (``kvattn.runtime.callcache._flatten``) equals the recorded call's: the key
    holds the raw value of every switch, so ``KVATTN_FAST_LAUNCH`` and ``TRITON_INTERPRET`` read as
    they did while the call was recorded (the fast path was on: :func:`.fast_launch.fast_path_enabled`
    less its launch hooks). Checked here, what the key does not hold: no launch hooks, Triton's debug knobs,
    the current device and stream, and each launch's compiled kernel still the one Triton's path
    would pick (no pre-run hooks, the same ``debug`` flag, the cached kernel, its globals unchanged).
    """
    if _fast_launch._RECORDER is not None or knob_state() != entry.knobs or not no_launch_hooks():
        return False
    active = driver.active
    get_device = active.get_current_device
    # torch.cuda.current_device is a lazy-init check and _cuda_getDevice, which initialises itself
    device = _cuda_get_device() if get_device is _torch_current_device else get_device()
    if device != entry.device:
        return False
    stream = active.get_current_stream(device)
    if entry.stream is not None and stream != entry.stream:
        return False
    steps = entry.steps
    for launch, key, hit, _, _, _, _ in steps:
        now = launch.ready(key)
        if now is None or now[0] is not hit[0]:  # (recompiled, globals changed, hooks: Triton's path now)
            return False
    values = _replay_values(entry, ptrs, stream)
    for launch, _, hit, head, pick, inner, tail in steps:
        launch.last = hit[0]
        hit[1](*(head + pick(values + inner) + tail))
    return True


def _replay_values(entry, ptrs: list, stream: int) -> tuple:
    """Every pointer (or rebuilt descriptor) of a recorded call's launches, then the stream."""
    if entry.constants:
        ptrs = ptrs + entry.constants
    values = (*map(_add, entry.pick(ptrs), entry.offsets), stream)
    if entry.rebuild:  # tensor descriptors, rebuilt on their bases' new pointers
        values = list(values)
        for i, make in entry.rebuild:
            values[i] = make(values[i])
        values = tuple(values)
    return values


def replay_launches(entry, ptrs: list, stream: int) -> list[tuple[Callable, tuple]]:
    """``(launcher, its whole argument list)`` of each launch :func:`replay` makes for a call with the
    data pointers ``ptrs`` on ``stream``, without launching (tools time the launcher alone)."""
    values = _replay_values(entry, ptrs, stream)
    return [(hit[1], head + pick(values + inner) + tail) for _, _, hit, head, pick, inner, tail in entry.steps]


def replay_step(launch: Launch, key: int, first: int, count: int, tail: tuple, total: int) -> tuple:
    """One launch of a recorded call as :func:`replay` runs it: ``(launch, key, hit, head, pick,
    inner, tail)`` where ``head + pick(values + inner) + tail`` is the whole argument list of the
    launcher, ``values`` the call's ``total`` pointers (this launch's at ``first .. first + count``)
    and the stream. ``head`` and ``tail`` are the fixed arguments before the first and after the
    last value taken from ``values`` (grid, launcher metadata, most of the kernel's scalars and
    constexprs): tuples concatenated as they are, so that a replay picks only the span between
    them (a launcher of ~100 arguments: ~0.8 us less a launch than picking every argument). None
    where the launch would not take the fast path now."""
    hit = launch.ready(key)
    if hit is None:
        return None
    _, _, fixed = hit
    static = (*launch._grid3, *fixed, *tail, *launch._bound)
    base = total + 1
    order = [base, base + 1, base + 2, total]  # grid x, y, z; the stream
    order += range(base + 3, base + 3 + len(fixed))
    rest = base + 3 + len(fixed)
    for i in launch._indices:  # into call.values (pointers, ints, floats) + bound
        order.append(first + i if i < count else rest + i - count)
    whole = (*range(base), *static)  # (stand-ins for values, then the fixed arguments)
    dynamic = [j for j, o in enumerate(order) if o < base]
    lo, hi = dynamic[0], dynamic[-1] + 1  # (the stream is always one)
    inner_at = [o for o in order[lo:hi] if o >= base]
    inner = tuple(whole[o] for o in inner_at)
    span = []
    for o in order[lo:hi]:
        span.append(o if o < base else base + len(span) - sum(1 for x in span if x < base))
    pick = operator.itemgetter(*span) if len(span) > 1 else (lambda t, i=span[0]: (t[i],))
    return launch, key, hit, tuple(whole[o] for o in order[:lo]), pick, inner, tuple(whole[o] for o in order[hi:])
