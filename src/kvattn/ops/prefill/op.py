"""Prefill's entry point and torch operator: paged causal context attention.

The public function :func:`kvattn.prefill.trtllm_batch_context_with_kv_cache` validates and
normalises its arguments, then calls :func:`context`, which unpacks :class:`~kvattn._inputs.PagedKV`,
:class:`~kvattn._inputs.Scale` and :class:`~kvattn.formats.FP4Tensor` into the flat operator
``torch.ops.kvattn.context`` (a ``torch.library.custom_op`` with a fake implementation and exact
``mutates_args``; eager calls skip the dispatcher, :func:`kvattn.runtime.common.entry`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._inputs import PagedKV, Scale
from ...formats import FP4Tensor
from ...runtime.common import entry
from .plan import launch_context


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
    entry(context_op, context_impl)(
        query, kv.k, kv.v, kv.k_table, kv.v_table, kv.k_sf, kv.v_sf, seq_lens, cum_seq_lens_q, sinks,
        logit_scale.factor, logit_scale.tensor, out_scale.factor, out_scale.tensor, data, sf, workspace,
        max_q_len, max_kv_len, window_left, float(1.0 if o_sf_scale is None else o_sf_scale), sf_start,
        float(skip_softmax_threshold_scale_factor or 0.0), lse, bool(causal),
    )


# ---------------------------------------------------------------------------------------------
# the torch.library op (traced by torch.compile) and the plain call (eager) it wraps
# ---------------------------------------------------------------------------------------------
def context_impl(
    query: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_table: torch.Tensor,
    v_table: torch.Tensor,
    k_sf: Optional[torch.Tensor],
    v_sf: Optional[torch.Tensor],
    seq_lens: torch.Tensor,
    cum_seq_lens_q: torch.Tensor,
    sinks: Optional[torch.Tensor],
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    out: torch.Tensor,
    out_sf: Optional[torch.Tensor],
    workspace: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    window_left: int,
    o_sf_scale: float,
    sf_start: int,
    skip_factor: float,
    # No default for a mutated argument: torch 2.11's in-place bookkeeping indexes the boxed arguments,
    # from which trailing defaults are dropped (lab/notes/triton-versions.md, torch versions).
    lse: Optional[torch.Tensor],
    causal: bool = True,
) -> None:
    """Paged causal (or, ``causal=False``, bidirectional) prefill into ``out`` (NVFP4: codes in ``out``, swizzled scales in ``out_sf``),
    and the rows' base-2 LSE into ``lse``; see ops.prefill. The workspace may be written (staged pages)."""
    launch_context(
        query, k, v, k_table, v_table, k_sf, v_sf, seq_lens, cum_seq_lens_q, sinks, out, out_sf,
        max_q_len=max_q_len, logit_factor=logit_factor, logit_tensor=logit_tensor, out_factor=out_factor,
        out_tensor=out_tensor, window_left=window_left, o_sf_scale=o_sf_scale, sf_start=sf_start,
        skip_factor=skip_factor, lse=lse, workspace=workspace, max_kv_len=max_kv_len, causal=causal,
    )


# The workspace is written: pages of a quantised cache are staged there (ops.prefill.staging).
context_op = torch.library.custom_op("kvattn::context", context_impl,
                                     mutates_args=("out", "out_sf", "workspace", "lse"))


@context_op.register_fake
def _context_fake(query, k, v, k_table, v_table, k_sf, v_sf, seq_lens, cum_seq_lens_q, sinks, logit_factor,
                  logit_tensor, out_factor, out_tensor, out, out_sf, workspace, max_q_len, max_kv_len, window_left,
                  o_sf_scale, sf_start, skip_factor, lse, causal=True) -> None:
    return None
