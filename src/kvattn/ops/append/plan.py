"""Launcher of the KV-cache append kernel: size the tile and the grid, launch.

Host-side facts only (shapes, strides, dtypes): nothing waits for the device and nothing is
allocated (but a copy of non-contiguous ``batch_indices``/``positions``), so an append can be
captured in a CUDA graph and replayed with new tokens, requests, positions and tables written in
place. What a call derives from its facts (an :class:`AppendFacts`) is one
:class:`~..launch.fast_launch.Launch`, cached under them; a call then reads its data pointers and
launches, every kernel argument named once in :func:`_launch`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..._formats_table import BY_DTYPE, BY_NAME
from ...runtime import fast_launch
from ...runtime.common import cdiv, device_guard, next_power_of_2
from ...runtime.plans import cached_plan
from .kernels import append_kv_kernel

# Elements of one program's [BLOCK_H, BLOCK_D] tile: a few rows of a few hundred bytes each keep
# the loads wide without spilling (the NVFP4 quantiser holds three tiles of it at once).
TILE_ELEMENTS = 2048
NUM_WARPS = 4

# A call's values, by name (fast_launch.CallLayout). An absent tensor's place holds the key, which
# the kernel never reads for it.
_LAYOUT = fast_launch.CallLayout(
    ("key", "value", "k", "v", "k_sf", "v_sf", "table", "batch_indices", "positions", "k_scale", "v_scale"), (),
    ("k_factor", "v_factor"),
)


class AppendFacts(NamedTuple):
    """Every host fact an append launch reads: the key of the plan cache (built positionally from
    locals of the fields' names in :func:`launch_append`, as :class:`..decode.launch.DecodeFacts`)."""

    key_shape: tuple  # [N, H, D]
    key_stride: tuple
    value_stride: tuple | None  # None: a K-only cache (one plane)
    k_shape: tuple  # [P, page, H, Ds] NHD view of the K pages
    k_stride: tuple
    v_stride: tuple | None
    kv_dtype: torch.dtype
    ksf_stride: tuple | None  # NVFP4 block scales
    vsf_stride: tuple | None
    table_shape: tuple  # [B, pages_per_seq]
    table_stride: tuple
    has_k_scale: bool  # a device tensor factor of the K scale
    has_v_scale: bool


def kv_format_code(dtype: torch.dtype) -> int:
    """The kernel's ``KV_FORMAT`` for pages of ``dtype``: the format table's element-by-element
    code; a float32 cache (float32 rows, no format of the table) is stored as 16-bit ones are."""
    fmt = BY_DTYPE.get(dtype)
    return (fmt or BY_NAME["float16"]).kernel_code


def _launch(f: AppendFacts) -> fast_launch.Launch:
    """The launch of :func:`~.kernels.append_kv_kernel` for a call with facts ``f``: one program a
    (new token, block of ``BLOCK_H`` heads)."""
    num_tokens, heads, head_dim = f.key_shape
    has_v = f.value_stride is not None
    block_d = next_power_of_2(head_dim)
    block_h = max(1, min(next_power_of_2(heads), TILE_ELEMENTS // block_d))
    value_stride = f.value_stride if has_v else f.key_stride
    v_stride = f.v_stride if has_v else f.k_stride
    ksf = f.ksf_stride[:3] if f.ksf_stride is not None else (0, 0, 0)
    vsf = f.vsf_stride[:3] if f.vsf_stride is not None else (0, 0, 0)
    return fast_launch.Launch(
        append_kv_kernel, (num_tokens, cdiv(heads, block_h)),
        layout=_LAYOUT,
        per_call=dict(k_src_ptr="key", v_src_ptr="value", k_ptr="k", v_ptr="v", k_sf_ptr="k_sf", v_sf_ptr="v_sf",
                      table_ptr="table", batch_ptr="batch_indices", pos_ptr="positions", k_scale_ptr="k_scale",
                      v_scale_ptr="v_scale", k_scale_factor="k_factor", v_scale_factor="v_factor"),
        fixed=dict(
            stride_ksrc_n=f.key_stride[0], stride_ksrc_h=f.key_stride[1],
            stride_vsrc_n=value_stride[0], stride_vsrc_h=value_stride[1],
            stride_k_p=f.k_stride[0], stride_k_s=f.k_stride[1], stride_k_h=f.k_stride[2],
            stride_v_p=v_stride[0], stride_v_s=v_stride[1], stride_v_h=v_stride[2],
            stride_ksf_p=ksf[0], stride_ksf_s=ksf[1], stride_ksf_h=ksf[2],
            stride_vsf_p=vsf[0], stride_vsf_s=vsf[1], stride_vsf_h=vsf[2],
            stride_table_b=f.table_stride[0], stride_table_p=f.table_stride[1],
            batch=f.table_shape[0], pages_per_seq=f.table_shape[1], num_pages=f.k_shape[0],
        ),
        constexprs=dict(
            NUM_HEADS=heads, HEAD_DIM=head_dim, PAGE_SIZE=f.k_shape[1], BLOCK_H=block_h, BLOCK_D=block_d,
            KV_FORMAT=kv_format_code(f.kv_dtype), HAS_V=has_v, K_SCALE_TENSOR=f.has_k_scale,
            V_SCALE_TENSOR=f.has_v_scale,
        ),
        options=dict(num_warps=NUM_WARPS),
    )


_PLANS: dict[AppendFacts, fast_launch.Launch] = {}


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
    if 0 in key.shape:
        return
    if value is None:
        v = v_sf = None
    # Every host fact the launch reads, each in a local of its AppendFacts field's name.
    key_shape, key_stride = key.shape, key.stride()
    value_stride = value.stride() if value is not None else None
    k_shape, k_stride, kv_dtype = k.shape, k.stride(), k.dtype
    v_stride = v.stride() if v is not None else None
    ksf_stride = k_sf.stride() if k_sf is not None else None
    vsf_stride = v_sf.stride() if v_sf is not None else None
    table_shape, table_stride = table.shape, table.stride()
    has_k_scale, has_v_scale = k_tensor is not None, v_tensor is not None
    facts = AppendFacts._make((
        key_shape, key_stride, value_stride, k_shape, k_stride, v_stride, kv_dtype, ksf_stride, vsf_stride,
        table_shape, table_stride, has_k_scale, has_v_scale,
    ))
    launch = cached_plan(_PLANS, facts, _launch, False)
    if launch.constexprs["KV_FORMAT"] == BY_NAME["fp8"].kernel_code:
        # The kernel stores e4m3 bits built with integer ops (kernels.e4m3_bits): the pages as bytes.
        k, v = k.view(torch.uint8), (v.view(torch.uint8) if v is not None else None)
    device_index = key.get_device()  # -1 on the CPU
    with device_guard(device_index):
        if not batch_indices.is_contiguous():
            batch_indices = batch_indices.contiguous()
        if not positions.is_contiguous():
            positions = positions.contiguous()
        call = fast_launch.call_args(  # in _LAYOUT's order; absent tensors: the key, never read for them
            (key, value if value is not None else key, k, v if v is not None else k,
             k_sf.view(torch.uint8) if k_sf is not None else key, v_sf.view(torch.uint8) if v_sf is not None else key,
             table, batch_indices, positions, k_tensor if k_tensor is not None else key,
             v_tensor if v_tensor is not None else key),
            (), (float(k_factor), float(v_factor)), device_index,
        )
        launch(call)
