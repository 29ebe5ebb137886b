"""MLA decode's entry point and torch operator.

:func:`kvattn.mla.xqa_batch_decode_with_kv_cache_mla` validates and normalises its arguments, then
calls :func:`mla_decode`, which unpacks :class:`~kvattn._inputs.PagedKV` and
:class:`~kvattn._inputs.Scale` into the flat operator ``torch.ops.kvattn.mla_decode`` (a
``torch.library.custom_op`` with a fake implementation and exact ``mutates_args``; eager calls
skip the dispatcher, :func:`kvattn.runtime.common.entry`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._inputs import PagedKV, Scale
from ...runtime.common import entry
from .plan import launch_mla


def mla_decode(
    query: torch.Tensor,
    kv: PagedKV,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor,
    *,
    max_seq_len: int,
    logit_scale: Scale,
    out_scale: Scale,
    lse=None,
    q_len: int = 1,
) -> None:
    """``out [B, Q * Hq, 512] = out_scale * softmax(logit_scale * q.kv) ckv`` over each request's pages.

    ``query [B, Q * Hq, 576]``, token-major rows (row ``r * Hq + h``: token ``r``, head ``h``; ``Q =
    q_len``, token ``r`` seeing keys ``0 .. L - Q + r``); ``kv.k`` the ``[P, page, 1, 576]`` latent
    rows (``kv.v`` is the same view); split-KV partials use ``workspace``; the base-2 LSE goes to
    ``lse [B, Q * Hq]`` when given. Nothing waits for the device.
    """
    entry(mla_decode_op, mla_decode_impl)(
        query, kv.k, kv.k_table, seq_lens, logit_scale.factor, logit_scale.tensor, out_scale.factor,
        out_scale.tensor, out, workspace, max_seq_len, q_len, lse,
    )


# ---------------------------------------------------------------------------------------------
# the torch.library op (traced by torch.compile) and the plain call (eager) it wraps
# ---------------------------------------------------------------------------------------------
def mla_decode_impl(
    query: torch.Tensor,
    kv: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    out: torch.Tensor,
    workspace: torch.Tensor,
    max_seq_len: int,
    q_len: int,
    # No default for a mutated argument: torch 2.11's in-place bookkeeping indexes the boxed arguments,
    # from which trailing defaults are dropped (lab/notes/triton-versions.md, torch versions).
    lse: Optional[torch.Tensor],
) -> None:
    """MLA decode into ``out [B, Q * Hq, 512]`` (and the base-2 LSE into ``lse [B, Q * Hq]``) over
    latent rows ``kv [P, page, 1, 576]``, ``Q = q_len`` tokens a request (see ops.mla)."""
    launch_mla(
        query, kv, table, seq_lens, out, max_seq_len=max_seq_len, logit_factor=logit_factor,
        logit_tensor=logit_tensor, out_factor=out_factor, out_tensor=out_tensor, workspace=workspace, lse=lse,
        q_len=q_len,
    )


mla_decode_op = torch.library.custom_op("kvattn::mla_decode", mla_decode_impl,
                                        mutates_args=("out", "workspace", "lse"))


@mla_decode_op.register_fake
def _mla_decode_fake(query, kv, table, seq_lens, logit_factor, logit_tensor, out_factor, out_tensor, out,
                     workspace, max_seq_len, q_len, lse) -> None:
    return None
