"""Host-side pieces the decode, MLA and prefill launchers share: which config table a launch reads,
whether it may read its cache as words, what a plan knows of a cache's pages, the device guard and
lengths as the kernels read them. (The workspace layout is :mod:`.workspace`, the plan cache and
config overrides :mod:`.plans`, the torch ops' declarations :mod:`.opdecl`.)

None of them waits for the device or allocates (but the copy of a non-contiguous lengths tensor),
so launches stay capturable in CUDA graphs.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from . import device as _device
from .._formats_table import BY_DTYPE, BY_NAME

_CURRENT_DEVICE = contextlib.nullcontext()  # (reusable: it holds no state)


def arch(device: torch.device, interpreter: bool) -> str:
    """Which config table a launch reads: ``"interpreter"``, ``"sm90"`` (Hopper) or ``"default"``."""
    if interpreter:
        return "interpreter"
    return "sm90" if _device.is_hopper(device) else "default"


def words_allowed(device: torch.device, interpreter: bool, aligned: bool) -> bool:
    """Whether a launch may read a words format (``kv_format_code``'s ``words_ok``): compiled
    kernels (the interpreter cannot run their inline PTX), base pointers 4-byte aligned
    (``aligned``), and a GPU that converts fp8 pairs in one instruction (sm_89+)."""
    return aligned and not interpreter and _device.has_fp8_convert(device)


def words_aligned(k: torch.Tensor, v: torch.Tensor, k_sf, v_sf) -> bool:
    """Whether the cache has a words format (the format table's ``words_code``) and the base
    pointers of what it reads are 4-byte aligned: K and V, and a block-scaled format's scales
    (``words_allowed``'s ``aligned``)."""
    fmt = BY_DTYPE.get(k.dtype)
    if fmt is None or fmt.words_code is None:
        return False
    scales = ()
    if fmt.scale_block:
        if k_sf is None or v_sf is None:
            return False
        scales = (k_sf, v_sf)
    return all(t.data_ptr() % 4 == 0 for t in (k, v, *scales))


def kv_format_code(kv_format: str, words_ok: bool, strides: tuple, head_dim: int, sf_strides: tuple = ()) -> int:
    """The kernels' KV_FORMAT for a launch over a ``kv_format`` cache: its words code where
    ``words_ok`` (:func:`words_allowed`) and every word load is aligned (``KVFormat.code``),
    otherwise element by element. (A function of this module so that tools and tests can
    intercept the choice.)"""
    return BY_NAME[kv_format].code(words_ok, strides, head_dim, sf_strides)


class Pages(NamedTuple):
    """What a plan knows of a cache's K or V pages ``[P, page, Hkv, D]`` (an NHD view of any
    layout), without the tensor: shape, strides (elements), dtype and whether the base is 16-byte
    aligned (TMA's rule). Staged copies a plan lays out have pages of their own."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    aligned16: bool


def pages_of(t) -> Pages:
    """The :class:`Pages` of a tensor (a :class:`Pages` as it is)."""
    if isinstance(t, torch.Tensor):
        return Pages(tuple(t.shape), t.stride(), t.dtype, t.data_ptr() % 16 == 0)
    return t


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for ``n >= 1`` (that one is a constexpr_function: microseconds
    of host time a call in Triton 3.6)."""
    return 1 << (n - 1).bit_length()


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
