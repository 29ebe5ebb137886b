"""The merge of split-KV partials as a kernel of its own: the decode family's combine launch, and the
MLA family's (whose split kernels write the same ``(o, lse)`` partials). The decode split kernel's
last program merges the same way in-kernel (``softmax_merge.merge_partials``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .masks import sink_logits2
from .quantize import store_scaled
from .softmax_merge import merge_partials, softmax_finalize

try:  # grid dependency control (programmatic dependent launch); absent in old Triton builds
    from triton.language.extra.cuda import gdc_wait
except ImportError:  # pragma: no cover
    gdc_wait = None


@triton.jit
def decode_combine_kernel(
    part_o_ptr,  # [num_splits, B * Q_LEN, Hq, D] float32 normalised split outputs
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
    o, lse2 = softmax_finalize(acc, m, den, sink2, HAS_SINKS)
    out_mult = out_factor
    if OUT_PTR:
        out_mult = out_mult * tl.load(out_scale_ptr)
    offs_d = tl.arange(0, HEAD_DIM)
    store_scaled(out_ptr + t.to(tl.int64) * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :],
                 o * out_mult, row_ok[:, None], OUT_FP8)
    if STORE_LSE:
        tl.store(lse_ptr + t.to(tl.int64) * stride_lse_t + heads, lse2, mask=row_ok)


__all__ = ["decode_combine_kernel"]
