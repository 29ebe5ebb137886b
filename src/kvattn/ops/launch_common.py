"""Host-side pieces the decode, MLA and prefill launchers share.

None of them waits for the device or allocates (but the copy of a non-contiguous lengths tensor),
so launches stay capturable in CUDA graphs.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

_CURRENT_DEVICE = contextlib.nullcontext()  # (reusable: it holds no state)
MAX_PLANS = 1024  # distinct call shapes a launcher keeps plans for; past this its cache starts over


def device_guard(device: int):
    """The tensors' GPU made current for the launch (Triton launches on the current device, and a
    multi-GPU caller's tensors may live on another one); ``device`` is ``tensor.get_device()``
    (-1 on the CPU: nothing to switch)."""
    if device >= 0 and device != torch.cuda.current_device():
        return torch.cuda.device(device)
    return _CURRENT_DEVICE


def int32_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """``[B]`` lengths as the kernels read them: contiguous (length b at ``ptr + b``) int32 (uint32
    lengths below 2^31 have the same bits)."""
    if not lengths.is_contiguous():
        lengths = lengths.contiguous()
    if lengths.dtype == torch.uint32:
        lengths = lengths.view(torch.int32)
    return lengths


def cached_plan(plans: dict, facts: tuple, build: Callable[[tuple], object], overridden: bool):
    """``plans[facts]``, built by ``build(facts)`` on a miss; plans made while a tuning override
    is active (``overridden``) are not kept, since they depend on more than the facts."""
    if overridden:
        return build(facts)
    plan = plans.get(facts)
    if plan is None:
        if len(plans) >= MAX_PLANS:
            plans.clear()
        plan = plans[facts] = build(facts)
    return plan


def config_override(state: dict, cache_clear: Callable[[], None]):
    """A ``with``-block override of a config table's fields: ``override(**fields)`` updates
    ``state`` (the family's module-level override dict) for the block, clearing the family's
    config cache on entry and exit."""

    @contextlib.contextmanager
    def override(**fields) -> Iterator[None]:
        old = dict(state)
        state.update(fields)
        cache_clear()
        try:
            yield
        finally:
            state.clear()
            state.update(old)
            cache_clear()

    return override
