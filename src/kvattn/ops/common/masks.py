"""Masking rules (``@triton.jit``): causal with a sliding window, speculative-decode draft bits,
and attention sinks (a denominator-only term)."""

from __future__ import annotations

import triton
import triton.language as tl

from .softmax_merge import LOG2E


@triton.jit
def window_causal_allowed(row_pos, offs_n, window_left, HAS_WINDOW: tl.constexpr):
    """bool ``[M, N]``: key ``j`` is visible to a query at ``p`` iff ``j <= p`` and ``p - j <= w``."""
    dist = row_pos[:, None] - offs_n[None, :]
    ok = dist >= 0
    if HAS_WINDOW:
        ok = ok & (dist <= window_left)
    return ok


@triton.jit
def spec_draft_allowed(row_idx, row_ok, c, mask_row_ptr, stride_mask_r, q_len, HAS_MASK: tl.constexpr):
    """bool ``[M, N]``: draft key ``c`` (index among the request's ``q_len`` drafts, negative for
    older keys) visible to draft row ``row_idx``: mask bit ``c % 16`` of word ``c // 16`` of the
    row, or ``c <= row`` (causal) without a mask. False where ``c < 0``.

    ``mask_row_ptr``: the request's ``[q_len, words]`` uint16 rows (loaded as int16).
    """
    is_draft = (c >= 0) & (c < q_len)
    if HAS_MASK:
        cc = tl.where(is_draft, c, 0)
        ld = is_draft & row_ok[:, None]
        word = tl.load(mask_row_ptr + row_idx[:, None] * stride_mask_r + cc // 16, mask=ld, other=0)
        bit = (word.to(tl.int32) >> (cc % 16)) & 1
        return ld & (bit != 0)
    else:
        return is_draft & (c <= row_idx[:, None])


@triton.jit
def sink_logits2(sinks_ptr, heads, row_ok, HAS_SINKS: tl.constexpr):
    """The rows' sinks in base-2 units (float32 ``[Hq]`` in natural units), 0 without sinks."""
    if HAS_SINKS:
        return tl.load(sinks_ptr + heads, mask=row_ok, other=0.0).to(tl.float32) * LOG2E
    else:
        return tl.zeros(heads.shape, dtype=tl.float32)


@triton.jit
def causal_key_ranges(kv_len, q_len, q_rows, mt, window_left, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      HAS_WINDOW: tl.constexpr):
    """The keys of query tile ``mt`` (rows ``mt * BLOCK_M ..`` of a request's ``q_len`` new rows, the
    last of ``kv_len`` positions; ``q_rows`` of them inside the output) under the causal rule and
    the window: ``(p0, hi, start, full_lo, full_hi)``. ``p0`` the position of the tile's first
    row; keys ``[start, hi)`` in tiles of ``BLOCK_N`` from ``start``; those in ``[full_lo,
    full_hi)`` seen whole by every row of the tile (no mask). Scalars only, so the prefill family's
    Triton and Gluon kernels share it."""
    p0 = kv_len - q_len + mt * BLOCK_M
    p1 = tl.minimum(kv_len - q_len + q_rows, p0 + BLOCK_M) - 1  # the last row's position
    hi = tl.maximum(tl.minimum(p1 + 1, kv_len), 0)
    lo = p0 * 0
    if HAS_WINDOW:
        lo = tl.maximum(p0 - window_left, 0)
    start = (lo // BLOCK_N) * BLOCK_N
    full_lo = start
    if HAS_WINDOW:  # tiles from here on are inside every row's window
        full_lo = tl.maximum(tl.cdiv(tl.maximum(p1 - window_left, 0), BLOCK_N) * BLOCK_N, start)
    full_hi = tl.maximum(((p0 + 1) // BLOCK_N) * BLOCK_N, full_lo)  # tiles every row sees up to its end
    return p0, hi, start, full_lo, full_hi

