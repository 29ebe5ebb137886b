"""Merge kernel: partial attention states ``(o_s, lse_s)`` into one, exactly, through their LSEs.

A state is an output row normalised over its own keys, ``o_s = sum_j 2^(t_j - lse_s) v_j``, with
``lse_s = log2 sum_j 2^(t_j)`` over the same keys (base-2 logits ``t``). Over the union of the
keys, ``o = sum_s 2^(lse_s - lse) o_s`` and ``lse = log2 sum_s 2^(lse_s)``: computed from the
largest ``lse_s`` down, so nothing overflows, and a state with ``lse_s = -inf`` (no key) weighs 0
and its ``o_s`` is never multiplied in (it may hold anything, NaN included).

One program merges ``BLOCK_R`` rows: a first pass over the states finds each row's largest LSE,
a second folds the weighted outputs; every state's rows are read once.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import LOG2E


@triton.jit
def merge_states_kernel(
    o_ptr,  # [S, rows, D] partial outputs, any float dtype (last dim contiguous); PAIR: state a [rows, D]
    lse_ptr,  # [S, rows] float32 base-2 LSEs (-inf: an empty state); PAIR: state a [rows]
    o2_ptr,  # PAIR: state b's outputs [rows, D] (last dim contiguous)
    lse2_ptr,  # PAIR: state b's LSEs [rows] float32
    sinks_ptr,  # [num_heads] float32 sinks in natural units (HAS_SINKS); row r is head r % num_heads
    out_ptr,  # [rows, D] merged outputs, float16 / bfloat16 / float32 (last dim contiguous)
    out_lse_ptr,  # [rows] float32 merged LSE, sinks excluded (STORE_LSE)
    stride_o_s, stride_o_r, stride_lse_s, stride_lse_r, stride_o2_r, stride_lse2_r, stride_out_r, stride_out_lse_r,
    rows, num_states, num_heads, dim,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, PAIR: tl.constexpr, HAS_SINKS: tl.constexpr,
    STORE_LSE: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = offs_r < rows
    r64 = offs_r.to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    tile_ok = row_ok[:, None] & (offs_d < dim)[None, :]
    NEG_INF: tl.constexpr = float("-inf")

    # Pass 1: each row's largest LSE (-inf while every state so far is empty).
    if PAIR:
        lse_a = tl.load(lse_ptr + r64 * stride_lse_r, mask=row_ok, other=NEG_INF)
        lse_b = tl.load(lse2_ptr + r64 * stride_lse2_r, mask=row_ok, other=NEG_INF)
        m = tl.maximum(lse_a, lse_b)
    else:
        m = tl.full([BLOCK_R], NEG_INF, tl.float32)
        # (pointers step state by state: 64-bit sums, however far apart the states lie)
        lse_rows = lse_ptr + r64 * stride_lse_r
        for _ in range(num_states):
            lse_s = tl.load(lse_rows, mask=row_ok, other=NEG_INF)
            m = tl.maximum(m, lse_s)
            lse_rows += stride_lse_s
    m_safe = tl.where(m == NEG_INF, 0.0, m)

    # Pass 2: den = sum_s 2^(lse_s - m), acc = sum_s 2^(lse_s - m) o_s (empty states add nothing).
    if PAIR:
        w_a = tl.exp2(lse_a - m_safe)
        w_b = tl.exp2(lse_b - m_safe)
        o_a = tl.load(o_ptr + r64[:, None] * stride_o_r + offs_d[None, :], mask=tile_ok, other=0.0).to(tl.float32)
        o_b = tl.load(o2_ptr + r64[:, None] * stride_o2_r + offs_d[None, :], mask=tile_ok, other=0.0).to(tl.float32)
        den = w_a + w_b
        acc = tl.where((lse_a == NEG_INF)[:, None], 0.0, w_a[:, None] * o_a)
        acc += tl.where((lse_b == NEG_INF)[:, None], 0.0, w_b[:, None] * o_b)
    else:
        den = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        lse_rows = lse_ptr + r64 * stride_lse_r
        o_tile = o_ptr + r64[:, None] * stride_o_r + offs_d[None, :]
        for _ in range(num_states):
            lse_s = tl.load(lse_rows, mask=row_ok, other=NEG_INF)
            o_s = tl.load(o_tile, mask=tile_ok, other=0.0).to(tl.float32)
            w_s = tl.exp2(lse_s - m_safe)
            den += w_s
            acc += tl.where((lse_s == NEG_INF)[:, None], 0.0, w_s[:, None] * o_s)
            lse_rows += stride_lse_s
            o_tile += stride_o_s

    lse = tl.where(den > 0, m_safe + tl.log2(tl.where(den > 0, den, 1.0)), NEG_INF)
    if HAS_SINKS:
        # A sink adds 2^(sink2 - m) to the denominator once, after every state is in.
        heads = offs_r % num_heads
        sink2 = tl.load(sinks_ptr + heads, mask=row_ok, other=0.0).to(tl.float32) * LOG2E
        den = den + tl.exp2(sink2 - m_safe)
    o = acc / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(out_ptr + r64[:, None] * stride_out_r + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=tile_ok)
    if STORE_LSE:
        tl.store(out_lse_ptr + r64 * stride_out_lse_r, lse, mask=row_ok)


@triton.jit
def _tokens_held(t, page, world, rank, span_tokens, ROUND_ROBIN: tl.constexpr, LAST: tl.constexpr):
    """How many of the first ``t`` tokens of a request ``rank`` holds (kvattn.distributed.PageSharding)."""
    if ROUND_ROBIN:
        full = t // page
        held = (full + (world - 1 - rank)) // world * page
        return held + tl.where(full % world == rank, t - full * page, 0)
    else:
        held = tl.maximum(t - rank * span_tokens, 0)
        if not LAST:
            held = tl.minimum(held, span_tokens)
        return held


@triton.jit
def local_lengths_kernel(
    seq_lens_ptr,  # [B] int32 global lengths
    lens_out_ptr,  # [B] int32: the tokens this rank holds
    start_out_ptr,  # [B] int32: local index of the first key at global position >= L - 1 - window (HAS_WINDOW)
    batch, window_left, page, world, rank, span_tokens,
    ROUND_ROBIN: tl.constexpr, LAST: tl.constexpr, HAS_WINDOW: tl.constexpr, BLOCK: tl.constexpr,
):
    """A context-parallel rank's local lengths (and window starts), in one launch instead of the
    dozen elementwise ops their torch form takes (each a few microseconds even in a CUDA graph)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < batch
    lens = tl.load(seq_lens_ptr + offs, mask=ok, other=0)
    tl.store(lens_out_ptr + offs, _tokens_held(lens, page, world, rank, span_tokens, ROUND_ROBIN, LAST), mask=ok)
    if HAS_WINDOW:
        first = tl.maximum(lens - 1 - window_left, 0)
        tl.store(start_out_ptr + offs, _tokens_held(first, page, world, rank, span_tokens, ROUND_ROBIN, LAST),
                 mask=ok)


__all__ = ["merge_states_kernel", "local_lengths_kernel"]
