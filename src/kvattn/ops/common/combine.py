"""The merge of split-KV partials as a kernel of its own: the decode family's combine launch, and the
MLA family's (whose split kernels write the same ``(o, lse)`` partials). The decode split kernel's
last program merges the same way in-kernel (``softmax_merge.merge_partials``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .balance import lane_request_units, request_units
from .masks import sink_logits2
from .quantize import store_scaled
from .softmax_merge import merge_partials, softmax_finalize

try:  # grid dependency control (programmatic dependent launch); absent in old Triton builds
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # pragma: no cover
    gdc_wait = None


@triton.jit
def _finish_row(acc, m, den, sink2, t, heads, row_ok, out_scale_ptr, out_ptr, lse_ptr, stride_o_t, stride_o_h,
                stride_lse_t, out_factor, HEAD_DIM: tl.constexpr, HAS_SINKS: tl.constexpr, OUT_PTR: tl.constexpr,
                OUT_FP8: tl.constexpr, STORE_LSE: tl.constexpr):
    """Both combine kernels' end: one (row ``t``, head) merged state ``(acc [1, D], m, den)``
    normalised (the sink's logit joining the denominator), scaled and stored, and its LSE."""
    o, lse2 = softmax_finalize(acc, m, den, sink2, HAS_SINKS)
    out_mult = out_factor
    if OUT_PTR:
        out_mult = out_mult * tl.load(out_scale_ptr)
    offs_d = tl.arange(0, HEAD_DIM)
    store_scaled(out_ptr + t.to(tl.int64) * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :],
                 o * out_mult, row_ok[:, None], OUT_FP8)
    if STORE_LSE:
        tl.store(lse_ptr + t.to(tl.int64) * stride_lse_t + heads, lse2, mask=row_ok)


@triton.jit
def decode_combine_kernel(
    part_o_ptr,  # [num_splits, B * Q_LEN, Hq, D] float32 or bfloat16 normalised split outputs
    part_lse_ptr,  # [num_splits, B * Q_LEN, Hq] float32 split LSEs (base 2; -inf: empty split)
    sinks_ptr,  # [Hq] float32 (HAS_SINKS)
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    out_ptr,  # [B * Q_LEN, Hq, D] q's dtype or fp8
    lse_ptr,  # [B * Q_LEN, Hq] float32 (STORE_LSE; head stride 1)
    stride_o_t, stride_o_h, stride_lse_t,
    num_rows, num_splits, out_factor,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr,
    OUT_PTR: tl.constexpr, OUT_FP8: tl.constexpr, STORE_LSE: tl.constexpr, USE_PDL: tl.constexpr,
):
    """Merge one (query row, head)'s split partials exactly through their LSEs.

    One pass, rescaling as it goes: with ``num_splits <= BLOCK_S`` (the launcher's usual choice)
    every load is issued at once, so the kernel costs one round trip to L2 after the split kernel.
    """
    t = tl.program_id(0)
    h = tl.program_id(1)
    if USE_PDL:
        gdc_wait()
    # One row, as a [1] tensor: the same merge the split kernel's last program does for its rows.
    heads = h + tl.zeros([1], dtype=tl.int32)
    row_ok = heads < NUM_HEADS
    m, den, acc = merge_partials(part_o_ptr, part_lse_ptr, t.to(tl.int64) * NUM_HEADS + heads, row_ok,
                                 num_rows * NUM_HEADS, num_splits, HEAD_DIM, BLOCK_S, False)
    sink2 = sink_logits2(sinks_ptr, heads, row_ok, HAS_SINKS)
    _finish_row(acc, m, den, sink2, t, heads, row_ok, out_scale_ptr, out_ptr, lse_ptr, stride_o_t, stride_o_h,
                stride_lse_t, out_factor, HEAD_DIM, HAS_SINKS, OUT_PTR, OUT_FP8, STORE_LSE)


@triton.jit
def balanced_combine_kernel(
    part_o_ptr,  # [num_splits * batch, NUM_HEADS, HEAD_DIM] float32 / bfloat16 unit outputs (slot u: unit u)
    part_lse_ptr,  # [num_splits * batch, NUM_HEADS] float32 unit LSEs (base 2; -inf: an empty unit)
    seq_lens_ptr,  # [batch] int32
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    out_ptr,  # [batch, NUM_HEADS, HEAD_DIM] 16-bit or float32
    lse_ptr,  # [batch, NUM_HEADS] float32 (STORE_LSE; head stride 1)
    stride_o_t, stride_o_h, stride_lse_t,
    batch, num_splits, capacity, out_factor,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_S_FEW: tl.constexpr,
    OUT_PTR: tl.constexpr, STORE_LSE: tl.constexpr, MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr, UNITS_CAP: tl.constexpr, USE_PDL: tl.constexpr,
):
    """The merge of a balanced split launch (``common.balance.launch_unit``; the MLA kernels'
    ``BALANCED``): one (request, row)'s units, the consecutive slots ``first .. first + n - 1``,
    which it derives from the lengths as the split programs did (a ragged batch's requests have
    different unit counts; an equal batch's ``num_splits`` each)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    # The plan from the lengths before the wait: the split kernel does not write them, so under a
    # programmatic dependent launch this may run beneath the split kernel's last programs.
    n_t, first = request_units(seq_lens_ptr, t, batch, capacity, num_splits, MIN_CHUNK, BLOCK_N, BLOCK_B, UNITS_CAP)
    if USE_PDL:
        gdc_wait()
    heads = h + tl.zeros([1], dtype=tl.int32)
    row_ok = heads < NUM_HEADS
    p_row = first.to(tl.int64) * NUM_HEADS + heads
    # Most requests hold at most the uniform split count of units (every request of an equal batch,
    # the short ones of a ragged one): their merge takes the uniform combine's narrow tile; a wide
    # tile for all cost an equal batch 2.5-4x the combine's time (lab/notes/mla-ragged.md).
    if n_t <= BLOCK_S_FEW:
        m, den, acc = merge_partials(part_o_ptr, part_lse_ptr, p_row, row_ok, NUM_HEADS, n_t, HEAD_DIM, BLOCK_S_FEW,
                                     False)
    else:
        m, den, acc = merge_partials(part_o_ptr, part_lse_ptr, p_row, row_ok, NUM_HEADS, n_t, HEAD_DIM, BLOCK_S,
                                     False)
    _finish_row(acc, m, den, den, t, heads, row_ok, out_scale_ptr, out_ptr, lse_ptr, stride_o_t, stride_o_h,
                stride_lse_t, out_factor, HEAD_DIM, False, OUT_PTR, False, STORE_LSE)


@triton.jit
def lanes_combine_kernel(
    part_o_ptr,  # [units, Q_LEN, Hq, D] float32 normalised unit outputs (unit u: slot u)
    part_lse_ptr,  # [units, Q_LEN, Hq] float32 unit LSEs (base 2; -inf: an empty unit)
    seq_lens_ptr,  # [batch] int32
    sinks_ptr,  # [Hq] float32 (HAS_SINKS)
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    out_ptr,  # [batch * Q_LEN, Hq, D] q's dtype or fp8
    lse_ptr,  # [batch * Q_LEN, Hq] float32 (STORE_LSE; head stride 1)
    stride_o_t, stride_o_h, stride_lse_t,
    batch, num_splits, capacity, lanes, out_factor,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, Q_LEN: tl.constexpr, BLOCK_S: tl.constexpr,
    MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, LANE_CAP: tl.constexpr,
    MERGE_UNITS: tl.constexpr, HAS_SINKS: tl.constexpr, OUT_PTR: tl.constexpr, OUT_FP8: tl.constexpr,
    STORE_LSE: tl.constexpr, USE_PDL: tl.constexpr,
):
    """The merge of a decode lanes launch (``common.balance.lane_span``) whose split kernel leaves
    requests of more than ``MERGE_UNITS`` units unmerged: one (query row, head) of such a request,
    its units the consecutive slots ``first .. first + n - 1``, found from the lengths as the lanes
    cut them. Requests of fewer units were written by the split kernel (one unit: its final rows;
    up to ``MERGE_UNITS``: merged by their last program), and so was every request of a batch
    found uniform (the split kernel deals it, and merges it in its last program): there this launch
    only reads the lengths."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = t // Q_LEN
    ragged, n_b, first = lane_request_units(seq_lens_ptr, b, batch, capacity, lanes, num_splits, MIN_CHUNK,
                                            BLOCK_N, BLOCK_B, LANE_CAP)
    work = ragged & (n_b > MERGE_UNITS)
    if USE_PDL:
        # Only programs with partials to merge wait for the split launch, and program (0, 0), so
        # that this launch still ends after it: a uniform batch's programs, started early by the
        # split kernel, exit at once.
        if work | ((t == 0) & (h == 0)):
            gdc_wait()
    if work:
        heads = h + tl.zeros([1], dtype=tl.int32)
        row_ok = heads < NUM_HEADS
        p_row = (first.to(tl.int64) * Q_LEN + t % Q_LEN) * NUM_HEADS + heads
        m, den, acc = merge_partials(part_o_ptr, part_lse_ptr, p_row, row_ok, Q_LEN * NUM_HEADS, n_b, HEAD_DIM,
                                     BLOCK_S, False)
        sink2 = sink_logits2(sinks_ptr, heads, row_ok, HAS_SINKS)
        _finish_row(acc, m, den, sink2, t, heads, row_ok, out_scale_ptr, out_ptr, lse_ptr, stride_o_t, stride_o_h,
                    stride_lse_t, out_factor, HEAD_DIM, HAS_SINKS, OUT_PTR, OUT_FP8, STORE_LSE)


__all__ = ["balanced_combine_kernel", "decode_combine_kernel", "lanes_combine_kernel"]
