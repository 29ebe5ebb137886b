"""Quantised formats: fp8-e4m3 and NVFP4 (e2m1 values with e4m3 block scales).

NVFP4 as kvattn stores it (docs/semantics.md, "Formats"): two e2m1 codes per byte, element ``2i`` in the low
nibble and ``2i + 1`` in the high nibble; a code is a sign bit (bit 3) and an index 0..7 into
``E2M1_VALUES``. Each run of 16 consecutive elements along the last dim has one float8_e4m3fn block
scale, and a value is ``e2m1 * block_scale`` (times a global scale the caller folds elsewhere).

These helpers build caches and read outputs; the kernels dequantise on their own.

Example
-------
>>> import torch
>>> from kvattn import formats
>>> x = torch.randn(4, 32)
>>> packed, sf = formats.quantize_nvfp4(x)
>>> packed.shape, sf.shape
(torch.Size([4, 16]), torch.Size([4, 2]))
>>> err = (formats.dequantize_nvfp4(packed, sf) - x).abs().max()
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16


def _as_float(scale, like: torch.Tensor) -> torch.Tensor | float:
    if isinstance(scale, torch.Tensor):
        return scale.to(device=like.device, dtype=torch.float32).reshape(())
    return float(scale)


# ---------------------------------------------------------------------------------------------
# fp8
# ---------------------------------------------------------------------------------------------
def quantize_fp8(x: torch.Tensor, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """``x / scale`` rounded to nearest even in float8_e4m3fn, saturating at +-448.

    Parameters
    ----------
    x : torch.Tensor
        Any floating tensor.
    scale : float or torch.Tensor
        Dequant scale: ``dequantize_fp8(quantize_fp8(x, s), s) ~ x``.
    """
    y = x.to(torch.float32) / _as_float(scale, x)
    # torch's cast rounds to nearest even but does not saturate (overflow becomes NaN): clamp first.
    return y.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_fp8(x: torch.Tensor, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """float32 ``x * scale`` for a float8_e4m3fn tensor."""
    return x.to(torch.float32) * _as_float(scale, x)


# ---------------------------------------------------------------------------------------------
# e2m1 codes and nibble packing
# ---------------------------------------------------------------------------------------------
def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8, 0..15) of ``x``: round to nearest, ties to the even code, clamp +-6."""
    x = x.to(torch.float32)
    mag = x.abs().clamp(max=E2M1_MAX)
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=x.device)
    # Index of the nearest grid value; on an exact tie between i and i+1 take the even index.
    dist = (mag.unsqueeze(-1) - grid).abs()
    best = dist.min(dim=-1, keepdim=True).values
    is_best = dist == best
    idx = torch.arange(8, device=x.device)
    # Prefer an even index among the nearest ones; otherwise the (single) nearest one.
    even_pick = torch.where(is_best & (idx % 2 == 0), idx, 8).min(dim=-1).values
    any_pick = torch.where(is_best, idx, 8).min(dim=-1).values
    code = torch.where(even_pick < 8, even_pick, any_pick).to(torch.uint8)
    sign = ((x < 0) & (code > 0)).to(torch.uint8) << 3
    return code | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of 4-bit e2m1 codes (uint8 0..15)."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    codes = codes.to(torch.int64)
    mag = grid[codes & 7]
    return torch.where((codes & 8) != 0, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[..., D]`` codes -> ``[..., D/2]`` uint8, element ``2i`` in the low nibble."""
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``[..., D/2]`` uint8 -> ``[..., D]`` codes (uint8 0..15)."""
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


# ---------------------------------------------------------------------------------------------
# NVFP4 blocks
# ---------------------------------------------------------------------------------------------
def quantize_nvfp4(x: torch.Tensor, global_scale: float | torch.Tensor = 1.0):
    """Quantise the last dim of ``x`` to NVFP4 so that ``x ~ global_scale * e2m1 * block_scale``.

    Parameters
    ----------
    x : torch.Tensor ``[..., D]``
        ``D`` a multiple of 16.
    global_scale : float or torch.Tensor
        Folded by the caller into the attention scale arguments (e.g. ``bmm1_scale``).

    Returns
    -------
    packed : torch.Tensor uint8 ``[..., D/2]``
    block_scale : torch.Tensor float8_e4m3fn ``[..., D/16]``
    """
    d = x.shape[-1]
    if d % NVFP4_BLOCK:
        raise ValueError(f"x: expected a last dim that is a multiple of 16, got {d}")
    xs = x.to(torch.float32) / _as_float(global_scale, x)
    blocks = xs.reshape(*xs.shape[:-1], d // NVFP4_BLOCK, NVFP4_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    sf = (amax / E2M1_MAX).clamp(max=FP8_MAX).to(FP8_DTYPE)
    sf32 = sf.to(torch.float32)
    safe = torch.where(sf32 > 0, sf32, torch.ones_like(sf32))
    y = (blocks / safe.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX)
    y = torch.where(sf32.unsqueeze(-1) > 0, y, torch.zeros_like(y))
    codes = e2m1_encode(y).reshape(*x.shape)
    return pack_nibbles(codes), sf


def dequantize_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, global_scale: float | torch.Tensor = 1.0):
    """float32 ``[..., D]`` values of NVFP4 data ``[..., D/2]`` with block scales ``[..., D/16]``."""
    vals = e2m1_decode(unpack_nibbles(packed))
    d = vals.shape[-1]
    blocks = vals.reshape(*vals.shape[:-1], d // NVFP4_BLOCK, NVFP4_BLOCK)
    out = blocks * block_scale.to(torch.float32).unsqueeze(-1)
    return out.reshape(*vals.shape) * _as_float(global_scale, vals)


# ---------------------------------------------------------------------------------------------
# NVFP4 output tensors (context attention's ``out_dtype="nvfp4"``)
# ---------------------------------------------------------------------------------------------
def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def swizzled_scale_offset(m: torch.Tensor, k: torch.Tensor, num_cols: int) -> torch.Tensor:
    """Flat offset of scale ``(row m, column k)`` in the 128x4 swizzled layout.

    ``num_cols`` is the padded column count ``C = round_up(Hq * D / 16, 4)``.
    """
    return (
        (m // 128) * (num_cols // 4) * 512
        + (k // 4) * 512
        + (m % 32) * 16
        + ((m % 128) // 32) * 4
        + k % 4
    )


@dataclass
class FP4Tensor:
    """An NVFP4 tensor: packed e2m1 values and their 128x4-swizzled e4m3 block scales.

    Attributes
    ----------
    data : torch.Tensor uint8 ``[rows, Hq, D/2]``
    scale : torch.Tensor float8_e4m3fn ``[round_up(rows, 128), round_up(Hq * D / 16, 4)]``
        Row ``m`` of the data has its scales at row ``m + scale_start_index``.
    scale_start_index : int
    original_shape : tuple ``(rows, Hq, D)``
    """

    data: torch.Tensor
    scale: torch.Tensor
    scale_start_index: int = 0
    original_shape: tuple | None = None

    @staticmethod
    def empty(rows: int, num_heads: int, head_dim: int, device, scale_start_index: int = 0) -> "FP4Tensor":
        cols = round_up(num_heads * head_dim // NVFP4_BLOCK, 4)
        data = torch.empty(rows, num_heads, head_dim // 2, dtype=torch.uint8, device=device)
        scale = torch.zeros(round_up(rows + scale_start_index, 128), cols, dtype=torch.uint8, device=device)
        return FP4Tensor(data, scale.view(FP8_DTYPE), scale_start_index, (rows, num_heads, head_dim))


def quantize_nvfp4_output(y: torch.Tensor, o_sf_scale: float, out: FP4Tensor) -> FP4Tensor:
    """Write ``y [rows, Hq, D]`` into ``out``: codes of ``y * o_sf_scale / sf``, swizzled scales.

    Per run of 16 elements of the flattened ``Hq * D`` row: ``sf = e4m3(o_sf_scale * amax / 6)``.
    """
    rows, hq, d = y.shape
    packed, sf = quantize_nvfp4(y.reshape(rows, hq * d), global_scale=1.0 / o_sf_scale)
    out.data.copy_(packed.reshape(rows, hq, d // 2))
    cols = out.scale.shape[-1]
    m = torch.arange(rows, device=y.device).unsqueeze(1) + out.scale_start_index
    k = torch.arange(hq * d // NVFP4_BLOCK, device=y.device).unsqueeze(0)
    off = swizzled_scale_offset(m, k, cols)
    out.scale.view(torch.uint8).view(-1)[off.reshape(-1)] = sf.view(torch.uint8).reshape(-1)
    return out


def dequantize_nvfp4_output(t: FP4Tensor, o_sf_scale: float = 1.0) -> torch.Tensor:
    """float32 ``[rows, Hq, D]`` values ``code * sf / o_sf_scale`` of an NVFP4 output."""
    rows, hq, half = t.data.shape
    d = half * 2
    cols = t.scale.shape[-1]
    m = torch.arange(rows, device=t.data.device).unsqueeze(1) + t.scale_start_index
    k = torch.arange(hq * d // NVFP4_BLOCK, device=t.data.device).unsqueeze(0)
    off = swizzled_scale_offset(m, k, cols)
    # Explicit column count: a zero-row output (an empty batch) has no -1 to infer.
    sf = t.scale.view(torch.uint8).reshape(-1)[off.reshape(-1)].view(FP8_DTYPE).reshape(rows, hq * d // NVFP4_BLOCK)
    vals = dequantize_nvfp4(t.data.reshape(rows, hq * d // 2), sf)
    return (vals / o_sf_scale).reshape(rows, hq, d)
