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
