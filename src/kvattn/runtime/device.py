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


@functools.lru_cache(maxsize=None)
def _memory_bandwidth_at(index: int) -> float:
    p = _props_at(index)
    clock_khz, bus_bits = getattr(p, "memory_clock_rate", 0), getattr(p, "memory_bus_width", 0)
    if not (clock_khz and bus_bits):  # a torch without the fields: the driver's attributes, through Triton
        try:
            from triton.runtime import driver

            attrs = driver.active.utils.get_device_properties(index)
            clock_khz, bus_bits = attrs.get("mem_clock_rate", 0), attrs.get("mem_bus_width", 0)
        except Exception:  # noqa: BLE001  (unknown: the callers keep the tables of the measured GPUs)
            return 0.0
    return 2.0 * clock_khz * 1e3 * bus_bits / 8  # double data rate: two transfers a clock


def memory_bandwidth(device: torch.device) -> float:
    """Peak DRAM bandwidth in bytes/s, from the memory clock and bus width the driver reports (H100
    SXM: 2619 MHz x 5120 bits = 3.35 TB/s; an H200's driver: 3201 MHz x 6016 bits = 4.81 TB/s); 0 on the CPU or
    where the driver does not say."""
    if device.type != "cuda":
        return 0.0
    return _memory_bandwidth_at(device.index if device.index is not None else torch.cuda.current_device())


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
