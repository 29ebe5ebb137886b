"""MLA decode's entry point and torch operator.

:func:`kvattn.mla.xqa_batch_decode_with_kv_cache_mla` validates and normalises its arguments, then
calls :func:`mla_decode`, which unpacks :class:`~kvattn._inputs.PagedKV` and
:class:`~kvattn._inputs.Scale` into the flat operator ``torch.ops.kvattn.mla_decode`` (a
``torch.library.custom_op`` declared once below, :func:`kvattn.runtime.opdecl.declare_op`, with
its fake and exact ``mutates_args``; eager calls skip the dispatcher).
"""

from __future__ import annotations

import torch

from ..._inputs import PagedKV, Scale
from ...runtime.opdecl import Arg, OptTensor, Tensor, declare_op
from .plan import launch_mla

# MLA decode into ``out`` (and the base-2 LSE into ``lse``) over latent rows, ``Q = q_len`` tokens
# a request. The names are launch_mla's keywords.
MLA_DECODE = declare_op(
    "kvattn::mla_decode", launch_mla,
    Arg("query", Tensor),  # [B, Q * Hq, 576]
    Arg("kv", Tensor),  # [P, page, 1, 576] latent rows
    Arg("table", Tensor),  # [B, pages_per_seq] int32
    Arg("seq_lens", Tensor),  # [B] int32 / uint32
    Arg("logit_factor", float),
    Arg("logit_tensor", OptTensor),
    Arg("out_factor", float),
    Arg("out_tensor", OptTensor),
    Arg("out", Tensor, mutated=True),  # [B, Q * Hq, 512]
    Arg("workspace", Tensor, mutated=True),  # uint8 split partials
    Arg("max_seq_len", int),
    Arg("q_len", int, 1),
    Arg("lse", OptTensor, None, mutated=True),  # [B, Q * Hq] float32 base-2 LSE, or None
)


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
    MLA_DECODE.entry(  # (positionally, in the declaration's order: binding keywords costs microseconds)
        query, kv.k, kv.k_table, seq_lens, logit_scale.factor, logit_scale.tensor, out_scale.factor,
        out_scale.tensor, out, workspace, max_seq_len, q_len, lse,
    )
