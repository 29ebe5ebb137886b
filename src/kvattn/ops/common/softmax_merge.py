"""Online softmax, its finalisation, and the merge of split-KV partials (``@triton.jit``).

Conventions (every family's): logits are kept in base-2 units (``s * log2(e)``) so every
exponential is an ``exp2``; a disallowed key has logit ``-inf`` and probability exactly 0; the
running max may be ``-inf`` (no key seen yet) and every helper guards that case instead of
producing NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .predicates import as_mask


LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def online_softmax_step(m_i, l_i, s, KEYS_FIRST: tl.constexpr = False):
    """One tile of the streaming softmax.

    ``s [M, N]`` base-2 logits (-inf: disallowed), or ``[N, M]`` with ``KEYS_FIRST`` (a tile
    computed as ``K Q^T``); ``m_i, l_i [M]`` running max / denominator. Returns
    ``(m_new, l_new, p, alpha)`` (``p`` shaped like ``s``): the caller rescales its accumulator by
    ``alpha`` and adds ``p @ V``.
    """
    m_new, p, alpha = _tile_probabilities(m_i, s, KEYS_FIRST)
    l_new = l_i * alpha + tl.sum(p, 0 if KEYS_FIRST else 1)
    return m_new, l_new, p, alpha


@triton.jit
def _tile_probabilities(m_i, s, KEYS_FIRST: tl.constexpr):
    """``(m_new, p, alpha)`` of one tile of the streaming softmax (:func:`online_softmax_step`)."""
    m_new = tl.maximum(m_i, tl.max(s, 0 if KEYS_FIRST else 1))
    # A row that has seen no allowed key keeps m = -inf; subtracting 0 instead keeps p = 0, alpha = 0.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    if KEYS_FIRST:
        p = tl.exp2(s - m_safe[None, :])
    else:
        p = tl.exp2(s - m_safe[:, None])
    return m_new, p, alpha


@triton.jit
def online_softmax_step_tile(m_i, l_tile, s, KEYS_FIRST: tl.constexpr = False):
    """:func:`online_softmax_step` with the denominator kept per logit: ``l_tile`` (shaped like
    ``s``) is rescaled and gains ``p`` each tile, and the caller sums it over the keys once after
    the loop, so no tile reduces its sum across the warps that hold its keys. Returns
    ``(m_new, l_tile_new, p, alpha)``."""
    m_new, p, alpha = _tile_probabilities(m_i, s, KEYS_FIRST)
    if KEYS_FIRST:
        l_new = l_tile * alpha[None, :] + p
    else:
        l_new = l_tile * alpha[:, None] + p
    return m_new, l_new, p, alpha


@triton.jit
def full_tile_softmax(m_i, l_i, s, qk_scale):
    """:func:`online_softmax_step` for a tile of unscaled logits ``s [M, N]`` that every row sees
    whole: every logit is finite, so the new max is too; the scale ``qk_scale >= 0`` commutes with
    the max, and one FMA a logit scales and shifts it (the prefill kernels' full tiles, Triton and
    Gluon). ``(m_i, l_i, p, alpha)``, base 2.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    return m_new, l_i, p, alpha


@triton.jit
def softmax_finalize(acc, m_i, l_i, sink2, HAS_SINKS: tl.constexpr):
    """``(o, lse2)`` of a finished row: ``o = acc / (l + sink term)``, ``lse2 = m + log2(l)``.

    ``sink2 [M]``: the rows' sinks in base-2 units (denominator only, never in the max or the LSE).
    Rows without an allowed key give o = 0 and lse2 = -inf.
    """
    lse2 = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    denom = l_i
    if HAS_SINKS:
        m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
        denom = l_i + tl.exp2(sink2 - m_safe)
    o = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    return o, lse2


@triton.jit
def merge_partials(part_o_ptr, part_lse_ptr, p_row, row_ok, split_stride, num_splits,
                   HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, UNROLL: tl.constexpr):
    """``(m, den, acc)`` of rows merged from their split partials, for :func:`softmax_finalize`.

    ``p_row [R]`` int64: each row's index in split 0 of ``part_lse [num_splits, split_stride]``
    (base-2 LSEs, -inf: an empty split) and of ``part_o [num_splits, split_stride, HEAD_DIM]``
    (normalised outputs). Returns the running max ``m [R]``, ``den [R] = sum_s 2^(lse_s - m)`` and
    ``acc [R, D] = sum_s 2^(lse_s - m) o_s``: the softmax state of all the rows' keys, so
    ``softmax_finalize(acc, m, den, ...)`` gives the exact output and LSE.

    ``BLOCK_S`` splits a round, their loads issued together, in one of two forms (measured on an H100,
    lab/notes/decode.md "Decode: merging the split partials"): one ``[S, R, D]`` tile summed over S (the combine
    kernel's; at the end of the decode kernel it took ~5 us a round), or with ``UNROLL`` S separate ``[R]`` and
    ``[R, D]`` tiles folded in turn, elementwise (the decode kernel's in-kernel merge: ~one L2 round trip a
    round). 16-bit partials (MLA's warp-specialised launches) always fold: the summed tile of 16-bit
    loads changed layout through shared memory (lab/notes/mla-ragged.md "Split partials in the
    output's 16-bit dtype"). Loads go to L2 (``.cg``): a program merging other programs' partials
    must not read its SM's L1.
    """
    FOLD: tl.constexpr = UNROLL or part_o_ptr.dtype.element_ty != tl.float32
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full(p_row.shape, float("-inf"), dtype=tl.float32)
    den = tl.zeros(p_row.shape, dtype=tl.float32)
    acc = tl.zeros([p_row.shape[0], HEAD_DIM], dtype=tl.float32)
    stride64 = tl.zeros_like(p_row) + split_stride  # [R] int64: offsets past 2^31 stay exact
    for s0 in range(0, num_splits, BLOCK_S):
        if FOLD:
            m_new = m
            for j in tl.static_range(BLOCK_S):
                lse_j = tl.load(part_lse_ptr + p_row + stride64 * (s0 + j),
                                mask=as_mask((s0 + j < num_splits) & row_ok), other=float("-inf"), cache_modifier=".cg")
                m_new = tl.maximum(m_new, lse_j)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)  # 0 while m is -inf
            den = den * alpha
            acc = acc * alpha[:, None]
            for j in tl.static_range(BLOCK_S):
                row_j = p_row + stride64 * (s0 + j)
                ok_j = as_mask((s0 + j < num_splits) & row_ok)
                lse_j = tl.load(part_lse_ptr + row_j, mask=ok_j, other=float("-inf"), cache_modifier=".cg")
                o_j = tl.load(part_o_ptr + row_j[:, None] * HEAD_DIM + offs_d[None, :], mask=ok_j[:, None], other=0.0,
                              cache_modifier=".cg")
                w_j = tl.exp2(lse_j - m_safe)
                den += w_j
                acc += w_j[:, None] * o_j
        else:
            offs_s = tl.arange(0, BLOCK_S)
            rows = (s0 + offs_s).to(tl.int64)[:, None] * split_stride + p_row[None, :]  # [S, R]
            ok = (s0 + offs_s < num_splits)[:, None] & row_ok[None, :]
            lse_i = tl.load(part_lse_ptr + rows, mask=ok, other=float("-inf"), cache_modifier=".cg")
            o_i = tl.load(part_o_ptr + rows[:, :, None] * HEAD_DIM + offs_d[None, None, :], mask=ok[:, :, None],
                          other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse_i, 0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)
            w = tl.exp2(lse_i - m_safe[None, :])
            den = den * alpha + tl.sum(w, 0)
            acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o_i, 0)
        m = m_new
    return m, den, acc


@triton.jit
def split_bounds(kv_len, kv_lo, num_splits, BLOCK_N: tl.constexpr, SPLIT_SPAN: tl.constexpr = 0):
    """``chunk``: the keys ``[kv_lo, kv_len)`` cut into chunks of ``chunk`` tokens (a multiple of
    BLOCK_N), balanced for this request; split ``s`` takes ``[kv_lo + s * chunk, +chunk)``, clipped
    to ``kv_len`` (empty for the splits a short request leaves idle).

    ``SPLIT_SPAN > 0`` (batch-invariant mode, a multiple of BLOCK_N): chunks of ``SPLIT_SPAN``
    tokens whatever ``num_splits`` is, so a request's splits depend on its own length only (the
    launcher gives ``num_splits >= ceil(max length / SPLIT_SPAN)``; a longer chunk only where a
    length passes that bound, which a well-formed call never does)."""
    span = tl.maximum(kv_len - kv_lo, 0)
    chunk = tl.cdiv(tl.cdiv(span, num_splits), BLOCK_N) * BLOCK_N
    if SPLIT_SPAN > 0:
        return tl.maximum(chunk, SPLIT_SPAN)
    return tl.maximum(chunk, BLOCK_N)
