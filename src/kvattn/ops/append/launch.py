"""Launcher of the KV-cache append kernel.

Reads host-side facts only (shapes, strides, dtypes): nothing waits for the device and nothing is
allocated, so an append can be captured in a CUDA graph and replayed with new tokens, requests,
positions and tables written in place.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...formats import FP8_DTYPE
from ..common import KV_FP8, KV_HALF, KV_NVFP4
from ..launch_common import cdiv, device_guard, next_power_of_2
from .kernels import append_kv_kernel

# Elements of one program's [BLOCK_H, BLOCK_D] tile: a few rows of a few hundred bytes each keep
# the loads wide without spilling (the NVFP4 quantiser holds three tiles of it at once).
TILE_ELEMENTS = 2048


def kv_format_code(dtype: torch.dtype) -> int:
    if dtype == FP8_DTYPE:
        return KV_FP8.value
    if dtype == torch.uint8:
        return KV_NVFP4.value
    return KV_HALF.value


def launch_append(
    key: torch.Tensor,  # [N, H, D]
    value: Optional[torch.Tensor],  # [N, H, D] or None (K-only cache)
    k: torch.Tensor,  # [P, page, H, Ds] NHD view of the K pages
    v: Optional[torch.Tensor],  # [P, page, H, Ds] NHD view of the V pages, None with value None
    k_sf: Optional[torch.Tensor],  # [P, page, H, D/16] e4m3 (NVFP4) or None
    v_sf: Optional[torch.Tensor],
    table: torch.Tensor,  # [B, pages_per_seq] int32
    batch_indices: torch.Tensor,  # [N] int32 / int64
    positions: torch.Tensor,  # [N] int32 / int64
    *,
    k_factor: float = 1.0,
    k_tensor: Optional[torch.Tensor] = None,
    v_factor: float = 1.0,
    v_tensor: Optional[torch.Tensor] = None,
) -> None:
    """Write the rows of ``key``/``value`` into their pages, with the key's GPU current."""
    num_tokens, heads, head_dim = key.shape
    if num_tokens == 0 or heads == 0 or head_dim == 0:
        return
    has_v = value is not None
    block_d = next_power_of_2(head_dim)
    block_h = max(1, min(next_power_of_2(heads), TILE_ELEMENTS // block_d))
    grid = (num_tokens, cdiv(heads, block_h))
    nvfp4 = k.dtype == torch.uint8
    k_sf8 = k_sf.view(torch.uint8) if nvfp4 else k
    v_sf8 = v_sf.view(torch.uint8) if (nvfp4 and has_v) else k_sf8
    ksf_s = tuple(k_sf.stride()[:3]) if nvfp4 else (0, 0, 0)
    vsf_s = tuple(v_sf.stride()[:3]) if (nvfp4 and has_v) else (0, 0, 0)
    v_src = value if has_v else key
    v_dst = v if has_v else k
    kv_format = kv_format_code(k.dtype)
    if k.dtype == FP8_DTYPE:  # the kernel stores e4m3 bits (see kernels._write_rows)
        k, v_dst = k.view(torch.uint8), v_dst.view(torch.uint8)
    if not batch_indices.is_contiguous():
        batch_indices = batch_indices.contiguous()
    if not positions.is_contiguous():
        positions = positions.contiguous()
    with device_guard(key.get_device()):
        append_kv_kernel[grid](
            key, v_src, k, v_dst, k_sf8, v_sf8, table, batch_indices, positions,
            k_tensor if k_tensor is not None else key, v_tensor if v_tensor is not None else key,
            float(k_factor), float(v_factor),
            key.stride(0), key.stride(1), v_src.stride(0), v_src.stride(1),
            *k.stride()[:3], *v_dst.stride()[:3], *ksf_s, *vsf_s,
            table.stride(0), table.stride(1),
            table.shape[0], table.shape[1], k.shape[0],
            NUM_HEADS=heads, HEAD_DIM=head_dim, PAGE_SIZE=k.shape[1], BLOCK_H=block_h, BLOCK_D=block_d,
            KV_FORMAT=kv_format, HAS_V=has_v,
            K_SCALE_TENSOR=k_tensor is not None, V_SCALE_TENSOR=v_tensor is not None,
            num_warps=4,
        )
