"""Paged causal context attention (prefill) on the Triton kernel of :mod:`.prefill_kernels`.

The public function :func:`kvattn.prefill.trtllm_batch_context_with_kv_cache` validates and
normalises its arguments, then calls :func:`context`, which unpacks :class:`~kvattn._inputs.PagedKV`,
:class:`~kvattn._inputs.Scale` and :class:`~kvattn.formats.FP4Tensor` into the flat
``torch.ops.kvattn.context`` operator.
"""

from __future__ import annotations

import torch

from .. import _backend, _library
from .._inputs import PagedKV, Scale
from ..formats import FP4Tensor


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
) -> None:
    """``out [sum_q, Hq, D] = out_scale * softmax(logit_scale * q.k) v`` over each request's pages
    (causal, the queries being each request's last tokens); an :class:`FP4Tensor` ``out`` gets the
    NVFP4 codes and swizzled block scales; ``lse [sum_q, Hq]`` (optional) the rows' base-2 LSE.
    No workspace is needed (one pass, no split partials).
    """
    if isinstance(out, FP4Tensor):
        data, sf, sf_start = out.data, out.scale, int(out.scale_start_index)
    else:
        data, sf, sf_start = out, None, 0
    _library.entry(_library.context, _library.context_impl)(
        query, kv.k, kv.v, kv.k_table, kv.v_table, kv.k_sf, kv.v_sf, seq_lens, cum_seq_lens_q, sinks,
        logit_scale.factor, logit_scale.tensor, out_scale.factor, out_scale.tensor, data, sf, workspace,
        max_q_len, max_kv_len, window_left, float(1.0 if o_sf_scale is None else o_sf_scale), sf_start,
        float(skip_softmax_threshold_scale_factor or 0.0), lse,
    )


_backend.TRITON_OPS.add("context")
