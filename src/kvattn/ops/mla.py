"""MLA decode on the Triton kernel of :mod:`.mla_kernels`.

:func:`kvattn.mla.xqa_batch_decode_with_kv_cache_mla` validates and normalises its arguments, then
calls :func:`mla_decode`, which unpacks :class:`~kvattn._inputs.PagedKV` and
:class:`~kvattn._inputs.Scale` into the flat ``torch.ops.kvattn.mla_decode`` operator.
"""

from __future__ import annotations

import torch

from .. import _backend, _library
from .._inputs import PagedKV, Scale


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
) -> None:
    """``out [B, Hq, 512] = out_scale * softmax(logit_scale * q.kv) ckv`` over each request's pages.

    ``query [B, Hq, 576]``; ``kv.k`` the ``[P, page, 1, 576]`` latent rows (``kv.v`` is the same
    view); split-KV partials use ``workspace``; the base-2 LSE goes to ``lse [B, Hq]`` when given.
    Nothing waits for the device.
    """
    _library.entry(_library.mla_decode, _library.mla_decode_impl)(
        query, kv.k, kv.k_table, seq_lens, logit_scale.factor, logit_scale.tensor, out_scale.factor,
        out_scale.tensor, out, workspace, max_seq_len, lse,
    )


_backend.TRITON_OPS.add("mla_decode")
