"""The staging kernel of :mod:`.staging`: a request's cache pages copied, converted to 16-bit, into
pages the warp-specialised Gluon kernel reads by TMA."""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.dequant import load_kv_tile
from ..common.paging import kv_token_offsets


@triton.jit
def stage_pages_kernel(
    k_ptr,  # [P, page, Hkv, Ds] K cache elements (16-bit, e4m3 bytes or NVFP4 codes), an NHD view of any layout
    v_ptr,  # [P, page, Hkv, Ds] V cache elements
    k_sf_ptr,  # [P, page, Hkv, D / 16] e4m3 block scales of K (NVFP4), else k_ptr (unread)
    v_sf_ptr,  # [P, page, Hkv, D / 16] e4m3 block scales of V (NVFP4), else v_ptr (unread)
    k_table_ptr,  # [B, pages_per_seq] int32 page ids of K
    v_table_ptr,  # [B, pages_per_seq] int32 page ids of V
    seq_lens_ptr,  # [B] int32 KV lengths
    cum_q_ptr,  # [B + 1] int32 / int64 query row offsets
    k_dst_ptr,  # [B * dst_pages, DST_PAGE, Hkv, D] staged K pages, 16-bit (STAGE_K), else v_dst_ptr (unwritten)
    v_dst_ptr,  # [B * dst_pages, DST_PAGE, Hkv, D] staged V pages, 16-bit
    dst_table_ptr,  # [B, dst_pages] int32: b * dst_pages + p at [b, p]
    stride_k_p, stride_k_s, stride_k_h, stride_v_p, stride_v_s, stride_v_h,
    stride_ksf_p, stride_ksf_s, stride_ksf_h, stride_vsf_p, stride_vsf_s, stride_vsf_h,
    stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p,
    stride_d_p, stride_d_s, stride_d_h,
    dst_pages, num_pages, capacity, window_left,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, DST_PAGE: tl.constexpr, TOKENS: tl.constexpr,
    KV_FORMAT: tl.constexpr, STAGE_K: tl.constexpr, HAS_WINDOW: tl.constexpr, KEY_ALIGN: tl.constexpr,
):
    """One program a (chunk of ``TOKENS`` tokens of a request, KV head, request); a chunk lies in
    one staged page (``TOKENS`` divides ``DST_PAGE``) and may span several cache pages (each
    token's page id read on its own)."""
    chunk = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    tok0 = chunk * TOKENS
    dst_page = b.to(tl.int64) * dst_pages + tok0 // DST_PAGE
    if (kvh == 0) & (tok0 % DST_PAGE == 0):
        tl.store(dst_table_ptr + dst_page, dst_page.to(tl.int32))
    # The attention kernel's lengths (clamped into [0, capacity], the cache table's) and its first
    # query tile's first key (masks.causal_key_ranges at tile 0; later tiles start later): nothing
    # before it is read.
    kv_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), capacity)
    first = kv_len * 0
    if HAS_WINDOW:
        q_len = tl.load(cum_q_ptr + b + 1).to(tl.int32) - tl.load(cum_q_ptr + b).to(tl.int32)
        first = (tl.maximum(kv_len - q_len - window_left, 0) // KEY_ALIGN) * KEY_ALIGN
    # A staged page holding no key of the request is never read (its tokens sit at or past kv_len,
    # where the attention kernel reads no page id); a chunk wholly before `first` is never read either.
    if ((tok0 // DST_PAGE) * DST_PAGE < kv_len) & (tok0 + TOKENS > first):
        offs_t = tok0 + tl.arange(0, TOKENS)
        tok_ok = offs_t < kv_len  # (the cache table is read for these only: kv_len <= its capacity)
        slot = (offs_t % PAGE_SIZE).to(tl.int64)
        offs_d = tl.arange(0, HEAD_DIM)
        dst_off = dst_page * stride_d_p + (offs_t % DST_PAGE).to(tl.int64) * stride_d_s + kvh.to(tl.int64) * stride_d_h
        dst = dst_off[:, None] + offs_d[None, :]
        OUT_DTYPE: tl.constexpr = v_dst_ptr.dtype.element_ty
        pid = tl.load(v_table_ptr + b.to(tl.int64) * stride_vt_b + (offs_t // PAGE_SIZE) * stride_vt_p, mask=tok_ok,
                      other=-1)
        ok = (pid >= 0) & (pid < num_pages)
        src, sf_src = kv_token_offsets(tl.maximum(pid, 0).to(tl.int64), slot, kvh, stride_v_p, stride_v_s, stride_v_h,
                                       stride_vsf_p, stride_vsf_s, stride_vsf_h, KV_FORMAT)
        vals = load_kv_tile(v_ptr, v_sf_ptr, src, sf_src, ok, 0, HEAD_DIM, KV_FORMAT, OUT_DTYPE)
        tl.store(v_dst_ptr + dst, vals)
        if STAGE_K:
            pid = tl.load(k_table_ptr + b.to(tl.int64) * stride_kt_b + (offs_t // PAGE_SIZE) * stride_kt_p,
                          mask=tok_ok, other=-1)
            ok = (pid >= 0) & (pid < num_pages)
            src, sf_src = kv_token_offsets(tl.maximum(pid, 0).to(tl.int64), slot, kvh, stride_k_p, stride_k_s,
                                           stride_k_h, stride_ksf_p, stride_ksf_s, stride_ksf_h, KV_FORMAT)
            vals = load_kv_tile(k_ptr, k_sf_ptr, src, sf_src, ok, 0, HEAD_DIM, KV_FORMAT, OUT_DTYPE)
            tl.store(k_dst_ptr + dst, vals)


__all__ = ["stage_pages_kernel"]
