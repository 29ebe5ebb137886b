"""Facts about the device a call runs on, cached per device."""

from __future__ import annotations

import functools

import torch

from . import env as _env


@functools.lru_cache(maxsize=None)
def _props_at(index: int):
    return torch.cuda.get_device_properties(index)


def _props(device: torch.device):
    return _props_at(device.index if device.index is not None else torch.cuda.current_device())


def sm_count(device: torch.device) -> int:
    """Number of streaming multiprocessors (a nominal 8 on the CPU, for the interpreter)."""
    if device.type != "cuda":
        return 8
    return _props(device).multi_processor_count


def l2_bytes(device: torch.device) -> int:
    """L2 cache size in bytes (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    return _props(device).L2_cache_size


def capability(device: torch.device) -> tuple[int, int]:
    if device.type != "cuda":
        return (0, 0)
    p = _props(device)
    return (p.major, p.minor)


def has_fp8_convert(device: torch.device) -> bool:
    """Whether the GPU converts fp8-e4m3 pairs in one instruction (``cvt.rn.f16x2.e4m3x2``, sm_89
    and later), which the kernels' words formats use through inline PTX."""
    return capability(device) >= (8, 9)


def has_tma(device: torch.device) -> bool:
    """Whether the GPU has the tensor memory accelerator (TMA descriptor loads): sm_90 and later."""
    return capability(device) >= (9, 0)


def is_hopper(device: torch.device) -> bool:
    return capability(device) == (9, 0)


def is_interpreter() -> bool:
    return _env.triton_interpret()
