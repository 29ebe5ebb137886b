"""The two kernels of ragged speculative decode (:mod:`.ragged`): the packed query (and mask) rows
into the padded decode's slots, and its padded output (and LSE) rows back."""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.predicates import as_mask


@triton.jit
def _slot_source(cu_ptr, slot, total, Q_LEN: tl.constexpr):
    """``(src, valid, shift)`` of padded slot ``slot`` (request ``slot // Q_LEN``): the packed row it
    holds, whether it holds one, and the slots before its request's rows."""
    b = slot // Q_LEN
    r = slot % Q_LEN
    lo = tl.load(cu_ptr + b).to(tl.int32)
    shift = Q_LEN - (tl.load(cu_ptr + b + 1).to(tl.int32) - lo)
    src = lo + r - shift
    valid = (r >= shift) & (src >= 0) & (src < total)
    return src, valid, shift


@triton.jit
def ragged_pack_kernel(
    q_ptr,  # [total, Hq, D] packed query rows (last dim contiguous)
    cu_ptr,  # [B + 1] int32 / uint32 draft offsets
    mask_ptr,  # [total, WORDS] int16 view of the uint16 ragged mask (HAS_MASK)
    q_pad_ptr,  # [B * Q_LEN, Hq, D] padded query rows (contiguous)
    mask_pad_ptr,  # [B * Q_LEN, WORDS] int16 view of the padded uint16 mask (MAKE_MASK)
    stride_q_t, stride_q_h, stride_m_t, total, num_heads, window_left,
    Q_LEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, WORDS: tl.constexpr,
    BLOCK_W: tl.constexpr, HAS_MASK: tl.constexpr, MAKE_MASK: tl.constexpr, HAS_WINDOW: tl.constexpr,
):
    # One program a (padded slot, block of BLOCK_H heads): a program a (slot, head) made tens of
    # thousands of one-warp programs of one row each, several waves for a few MB of copies.
    slot = tl.program_id(0)
    hb = tl.program_id(1)
    src, valid, shift = _slot_source(cu_ptr, slot, total, Q_LEN)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    row = tl.where(valid, src, 0).to(tl.int64)
    in_h = offs_h[:, None] < num_heads
    x = tl.load(q_ptr + row * stride_q_t + offs_h[:, None] * stride_q_h + offs_d[None, :],
                mask=as_mask(valid & in_h & (offs_d[None, :] < HEAD_DIM)), other=0.0)
    tl.store(q_pad_ptr + (slot.to(tl.int64) * num_heads + offs_h[:, None]) * HEAD_DIM + offs_d[None, :], x,
             mask=as_mask(in_h & (offs_d[None, :] < HEAD_DIM)))
    if MAKE_MASK:
        if hb == 0:
            r = slot % Q_LEN
            # column c of the padded row: an older key of the request (c < shift), else its draft c - shift
            offs_w = tl.arange(0, BLOCK_W)
            c = offs_w[:, None] * 16 + tl.arange(0, 16)[None, :]  # [BLOCK_W, 16]
            older = c < shift
            if HAS_WINDOW:
                older = older & (r - c <= window_left)
            cr = c - shift  # the request's own draft index
            in_q = (c < Q_LEN) & (cr >= 0)
            if HAS_MASK:
                ld = in_q & valid
                word = tl.load(mask_ptr + row * stride_m_t + tl.where(ld, cr, 0) // 16, mask=as_mask(ld), other=0)
                draft = ((word.to(tl.int32) & 0xFFFF) >> (tl.where(ld, cr, 0) % 16)) & 1
            else:
                draft = (c <= r).to(tl.int32)
            bits = tl.where(c < Q_LEN, tl.where(older, 1, tl.where(in_q, draft, 0)), 0)
            words = tl.sum(bits << tl.arange(0, 16)[None, :], axis=1)  # [BLOCK_W] in [0, 65535]
            tl.store(mask_pad_ptr + slot.to(tl.int64) * WORDS + offs_w, words.to(tl.int16), mask=offs_w < WORDS)


@triton.jit
def ragged_unpack_kernel(
    out_pad_ptr,  # [B * Q_LEN, Hq, D] padded output rows (contiguous)
    lse_pad_ptr,  # [B * Q_LEN, Hq] float32 padded LSE (HAS_LSE; contiguous)
    cu_ptr,  # [B + 1] int32 / uint32 draft offsets
    out_ptr,  # [total, Hq, D] packed output rows (last dim contiguous)
    lse_ptr,  # [total, Hq] float32 packed LSE (HAS_LSE; last dim contiguous)
    stride_o_t, stride_o_h, stride_l_t, total, num_heads,
    Q_LEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, HAS_LSE: tl.constexpr,
):
    slot = tl.program_id(0)
    hb = tl.program_id(1)
    src, valid, shift = _slot_source(cu_ptr, slot, total, Q_LEN)
    if valid:
        offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, HEAD_DIM)
        in_h = offs_h < num_heads
        pad = slot.to(tl.int64) * num_heads + offs_h  # [BLOCK_H]
        tile_mask = as_mask(in_h[:, None] & (offs_d[None, :] < HEAD_DIM))
        x = tl.load(out_pad_ptr + pad[:, None] * HEAD_DIM + offs_d[None, :], mask=tile_mask)
        tl.store(out_ptr + src.to(tl.int64) * stride_o_t + offs_h[:, None] * stride_o_h + offs_d[None, :], x,
                 mask=tile_mask)
        if HAS_LSE:
            tl.store(lse_ptr + src.to(tl.int64) * stride_l_t + offs_h, tl.load(lse_pad_ptr + pad, mask=in_h),
                     mask=in_h)


__all__ = ["ragged_pack_kernel", "ragged_unpack_kernel"]
