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
    """Launch a recorded call's launches (``kvattn.runtime.call_record._Entry``) for a call whose tensor
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


def _replay_values(entry, ptrs: list, stream: int) -> list:
    """A replay's values (see ``kvattn.runtime.call_record._build``): the pointers ``ptrs``, the kept
    buffers', the stream, each pointer at an offset, each descriptor rebuilt on its new base."""
    values = ptrs + entry.constants
    values.append(stream)
    if entry.pick is not None:
        values += map(_add, entry.pick(values), entry.offsets)
    for i, make in entry.rebuild:  # tensor descriptors, rebuilt on their bases' new pointers
        values[i] = make(values[i])
    return values


def replay_launches(entry, ptrs: list, stream: int) -> list[tuple[Callable, tuple]]:
    """``(launcher, its whole argument list)`` of each launch :func:`replay` makes for a call with the
    data pointers ``ptrs`` on ``stream``, without launching (tools time the launcher alone)."""
    values = _replay_values(entry, ptrs, stream)
    return [(hit[1], head + pick(values + inner) + tail) for _, _, hit, head, pick, inner, tail in entry.steps]


def replay_step(launch: Launch, key: int, first: int, count: int, tail: tuple, where: list, size: int) -> tuple:
    """One launch of a recorded call as :func:`replay` runs it: ``(launch, key, hit, head, pick,
    inner, tail)`` where ``head + pick(values + inner) + tail`` is the whole argument list of the
    launcher, ``values`` the ``size`` values of :func:`_replay_values` (``where[first + i]`` the
    index of this launch's pointer ``i``, ``where[-1]`` the stream's). ``head`` and ``tail`` are the
    fixed arguments before the first and after the last value taken from ``values`` (grid,
    launcher metadata, most of the kernel's scalars and constexprs): tuples concatenated as they
    are, so that a replay picks only the span between them (a launcher of ~100 arguments: ~0.8 us
    less a launch than picking every argument). None where the launch would not take the fast
    path now."""
    hit = launch.ready(key)
    if hit is None:
        return None
    _, _, fixed = hit
    static = (*launch._grid3, *fixed, *tail, *launch._bound)
    # each launcher argument: (True, index into the values) or (False, index into static)
    order = [(False, 0), (False, 1), (False, 2), (True, where[-1])]  # grid x, y, z; the stream
    order += ((False, 3 + j) for j in range(len(fixed)))
    rest = 3 + len(fixed)
    for i in launch._indices:  # into call.values (pointers, ints, floats) + bound
        order.append((True, where[first + i]) if i < count else (False, rest + i - count))
    dynamic = [j for j, (is_value, _) in enumerate(order) if is_value]
    lo, hi = dynamic[0], dynamic[-1] + 1
    inner, span = [], []
    for is_value, x in order[lo:hi]:
        if is_value:
            span.append(x)
        else:
            span.append(size + len(inner))
            inner.append(static[x])
    pick = operator.itemgetter(*span) if len(span) > 1 else (lambda t, i=span[0]: (t[i],))
    return (launch, key, hit, tuple(static[x] for _, x in order[:lo]), pick, inner,
            tuple(static[x] for _, x in order[hi:]))
