"""Triton kernel of the KV-cache append: new tokens' K/V rows written into their pages.

One program writes ``BLOCK_H`` heads of one new token, K then V: it reads the token's request and
position, looks its page up in the request's row of the block table, and stores the rows
(quantised to fp8 or NVFP4 on the way for such caches). Every index the program derives from
device values (request, position, page id) is checked against its range before it is used as an
address, and a token failing any check is dropped: a bad id can never write outside the cache.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import FP8_MAX, KV_FP8, KV_NVFP4, quantize_nvfp4_rows, round_to_e4m3


@triton.jit
def e4m3_bits(t):
    """float8_e4m3fn bits (int32, 0..255) of float32 ``t``, as torch's cast after a clamp to +-448
    (``formats.quantize_fp8``): nearest even, saturating, the sign kept (a negative value under
    half the smallest subnormal, or -0, gives -0), NaN -> 0x7F with its sign. Integer ops on the
    float32 bits of the rounded value, so the interpreter and every GPU agree bit for bit (no
    float8 conversion instruction, whose treatment of -0 differs between targets)."""
    sign = (t.to(tl.int32, bitcast=True) >> 31) & 1
    r = round_to_e4m3(tl.minimum(tl.maximum(t, -FP8_MAX), FP8_MAX))  # on the e4m3 grid, in float32
    rb = r.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    e32 = rb >> 23
    normal = ((e32 - 120) << 3) | ((rb >> 20) & 7)  # exponent bias 7 (float32: 127), 3 mantissa bits
    subnormal = (tl.abs(r) * 512.0).to(tl.int32)  # multiples of 2^-9 below 2^-6
    code = tl.where(e32 >= 121, normal, subnormal)
    code = tl.where(t != t, 0x7F, code)
    return code | (sign << 7)


@triton.jit
def _write_rows(
    src_ptr,  # [N, H, D] new rows (this token's, any strides; last dim contiguous)
    dst_ptr,  # [P, PAGE, H, D_STORED] pages (NHD view; uint8 for fp8 and NVFP4); D_STORED = D / 2 for NVFP4
    sf_ptr,  # [P, PAGE, H, D / 16] e4m3 block scales viewed as uint8 (NVFP4; else unused)
    scale_ptr,  # [1] float32 device factor of the dequant scale (HAS_SCALE_TENSOR; else unused)
    scale_factor,
    token, page, slot, ok,
    stride_src_n, stride_src_h,
    stride_p, stride_s, stride_h,
    stride_sf_p, stride_sf_s, stride_sf_h,
    offs_h, h_ok,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, KV_FORMAT: tl.constexpr, HAS_SCALE_TENSOR: tl.constexpr,
):
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_ok = h_ok & ok
    src = src_ptr + token * stride_src_n + offs_h[:, None] * stride_src_h + offs_d[None, :]
    x = tl.load(src, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    dst_row = dst_ptr + page * stride_p + slot * stride_s + offs_h[:, None] * stride_h  # [BLOCK_H, 1]
    scale = scale_factor  # the dequant scale (fp8 / NVFP4 caches store x / scale)
    if HAS_SCALE_TENSOR:
        scale = scale * tl.load(scale_ptr)
    if KV_FORMAT == KV_NVFP4:
        # Codes of x / scale, bit for bit formats.quantize_nvfp4(x, global_scale=scale); zero
        # columns past HEAD_DIM form whole blocks of their own (HEAD_DIM % 16 == 0), never stored.
        packed, sf = quantize_nvfp4_rows(x, scale, BLOCK_D // 16)
        offs_c = tl.arange(0, BLOCK_D // 2)
        tl.store(dst_row + offs_c[None, :], packed, mask=row_ok[:, None] & (offs_c < HEAD_DIM // 2)[None, :])
        offs_b = tl.arange(0, BLOCK_D // 16)
        sf_row = sf_ptr + page * stride_sf_p + slot * stride_sf_s + offs_h[:, None] * stride_sf_h
        tl.store(sf_row + offs_b[None, :], sf.to(tl.float8e4nv).to(tl.uint8, bitcast=True),
                 mask=row_ok[:, None] & (offs_b < HEAD_DIM // 16)[None, :])
    elif KV_FORMAT == KV_FP8:
        # The pages come as uint8 (the launcher's view): the e4m3 bits are built with integer ops.
        bits = e4m3_bits(tl.math.div_rn(x, scale))
        tl.store(dst_row + offs_d[None, :], bits.to(tl.uint8), mask=row_ok[:, None] & d_ok[None, :])
    else:
        tl.store(dst_row + offs_d[None, :], x.to(dst_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def append_kv_kernel(
    k_src_ptr,  # [N, H, D] new keys
    v_src_ptr,  # [N, H, D] new values (HAS_V; else unused)
    k_ptr,  # [P, PAGE, H, D_STORED] K pages (NHD view of any layout, any strides)
    v_ptr,  # [P, PAGE, H, D_STORED] V pages (HAS_V)
    k_sf_ptr,  # [P, PAGE, H, D / 16] K block scales as uint8 (NVFP4)
    v_sf_ptr,  # [P, PAGE, H, D / 16] V block scales as uint8 (NVFP4 and HAS_V)
    table_ptr,  # [B, pages_per_seq] int32 page ids
    batch_ptr,  # [N] int32 / int64: request of each new token
    pos_ptr,  # [N] int32 / int64: position of each new token inside its request
    k_scale_ptr,  # [1] float32 (K_SCALE_TENSOR)
    v_scale_ptr,  # [1] float32 (V_SCALE_TENSOR)
    k_scale_factor, v_scale_factor,
    stride_ksrc_n, stride_ksrc_h, stride_vsrc_n, stride_vsrc_h,
    stride_k_p, stride_k_s, stride_k_h, stride_v_p, stride_v_s, stride_v_h,
    stride_ksf_p, stride_ksf_s, stride_ksf_h, stride_vsf_p, stride_vsf_s, stride_vsf_h,
    stride_table_b, stride_table_p,
    batch, pages_per_seq, num_pages,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, KV_FORMAT: tl.constexpr, HAS_V: tl.constexpr,
    K_SCALE_TENSOR: tl.constexpr, V_SCALE_TENSOR: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < NUM_HEADS
    b = tl.load(batch_ptr + token).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    ok = (b >= 0) & (b < batch) & (pos >= 0) & (pos < pages_per_seq * PAGE_SIZE)
    # Clamped copies address the table even for a dropped token; the mask keeps its value unused.
    b_safe = tl.where(ok, b, 0)
    col = tl.where(ok, pos // PAGE_SIZE, 0)
    page = tl.load(table_ptr + b_safe * stride_table_b + col * stride_table_p, mask=ok, other=-1).to(tl.int64)
    ok = ok & (page >= 0) & (page < num_pages)
    page = tl.where(ok, page, 0)
    slot = tl.where(ok, pos % PAGE_SIZE, 0)
    _write_rows(k_src_ptr, k_ptr, k_sf_ptr, k_scale_ptr, k_scale_factor, token, page, slot, ok,
                stride_ksrc_n, stride_ksrc_h, stride_k_p, stride_k_s, stride_k_h,
                stride_ksf_p, stride_ksf_s, stride_ksf_h, offs_h, h_ok,
                HEAD_DIM, BLOCK_D, KV_FORMAT, K_SCALE_TENSOR)
    if HAS_V:
        _write_rows(v_src_ptr, v_ptr, v_sf_ptr, v_scale_ptr, v_scale_factor, token, page, slot, ok,
                    stride_vsrc_n, stride_vsrc_h, stride_v_p, stride_v_s, stride_v_h,
                    stride_vsf_p, stride_vsf_s, stride_vsf_h, offs_h, h_ok,
                    HEAD_DIM, BLOCK_D, KV_FORMAT, V_SCALE_TENSOR)
