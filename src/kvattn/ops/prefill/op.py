"""Prefill's entry point and torch operator: paged causal context attention.

The public function :func:`kvattn.prefill.trtllm_batch_context_with_kv_cache` validates and
normalises its arguments, then calls :func:`context`, which unpacks :class:`~kvattn._inputs.PagedKV`,
:class:`~kvattn._inputs.Scale` and :class:`~kvattn.formats.FP4Tensor` into the flat operator
``torch.ops.kvattn.context`` (a ``torch.library.custom_op`` declared once below,
:func:`kvattn.runtime.opdecl.declare_op`, with its fake and exact ``mutates_args``; eager calls
skip the dispatcher).
"""

from __future__ import annotations

import torch

from ..._inputs import PagedKV, Scale
from ...formats import FP4Tensor
from ...runtime.opdecl import Arg, OptTensor, Tensor, declare_op
from .plan import launch_context

# Paged causal (or, ``causal=False``, bidirectional) prefill into ``out`` (NVFP4: codes in ``out``,
# swizzled scales in ``out_sf``), and the rows' base-2 LSE into ``lse``. The workspace is written:
# pages of a quantised cache are staged there (ops.prefill.staging). The names are
# launch_context's keywords.
CONTEXT = declare_op(
    "kvattn::context", launch_context,
    Arg("query", Tensor),  # [sum_q, Hq, D]
    Arg("k", Tensor),  # [P, page, Hkv, Ds] NHD view of the K pages
    Arg("v", Tensor),
    Arg("k_table", Tensor),  # [B, pages_per_seq] int32
    Arg("v_table", Tensor),
    Arg("k_sf", OptTensor),  # NVFP4 block scales [P, page, Hkv, D/16], or None
    Arg("v_sf", OptTensor),
    Arg("seq_lens", Tensor),  # [B] int32 / uint32
    Arg("cum_seq_lens_q", Tensor),  # [B + 1] int32 / int64
    Arg("sinks", OptTensor),  # [Hq] float32, or None
    Arg("logit_factor", float),
    Arg("logit_tensor", OptTensor),
    Arg("out_factor", float),
    Arg("out_tensor", OptTensor),
    Arg("out", Tensor, mutated=True),  # [sum_q, Hq, D], or NVFP4 codes uint8 [sum_q, Hq, D/2]
    Arg("out_sf", OptTensor, mutated=True),  # NVFP4 output's swizzled block scales, or None
    Arg("workspace", Tensor, mutated=True),  # uint8 scratch (staged pages)
    Arg("max_q_len", int),
    Arg("max_kv_len", int),
    Arg("window_left", int),
    Arg("o_sf_scale", float),
    Arg("sf_start", int),
    Arg("skip_factor", float),
    Arg("lse", OptTensor, None, mutated=True),  # [sum_q, Hq] float32 base-2 LSE, or None
    Arg("causal", bool, True),
)


def context(
    query: torch.Tensor,
    kv: PagedKV,
    seq_lens: torch.Tensor,
    cum_seq_lens_q: torch.Tensor,
    out,
    workspace: torch.Tensor,
    *,
    max_q_len: int,
    max_kv_len: int,
    o_sf_scale,
    logit_scale: Scale,
    out_scale: Scale,
    window_left: int,
    sinks,
    skip_softmax_threshold_scale_factor,
    lse=None,
    causal: bool = True,
) -> None:
    """``out [sum_q, Hq, D] = out_scale * softmax(logit_scale * q.k) v`` over each request's pages
    (causal, the queries being each request's last tokens; ``causal=False``: every row sees all
    its request's keys); an :class:`FP4Tensor` ``out`` gets the
    NVFP4 codes and swizzled block scales; ``lse [sum_q, Hq]`` (optional) the rows' base-2 LSE.
    ``workspace`` may hold a quantised cache's pages, dequantised once a call (``ops.prefill.staging``).
    """
    if isinstance(out, FP4Tensor):
        data, sf, sf_start = out.data, out.scale, int(out.scale_start_index)
    else:
        data, sf, sf_start = out, None, 0
    CONTEXT.entry(  # (positionally, in the declaration's order: binding keywords costs microseconds)
        query, kv.k, kv.v, kv.k_table, kv.v_table, kv.k_sf, kv.v_sf, seq_lens, cum_seq_lens_q, sinks,
        logit_scale.factor, logit_scale.tensor, out_scale.factor, out_scale.tensor, data, sf, workspace,
        max_q_len, max_kv_len, window_left, float(1.0 if o_sf_scale is None else o_sf_scale), sf_start,
        float(skip_softmax_threshold_scale_factor or 0.0), lse, bool(causal),
    )
