"""Reference DeepSeek MLA decode over a latent paged cache."""

from __future__ import annotations

import torch

from .._inputs import PagedKV, Scale
from .core import _scalar, attend, empty_rows, paged_request_kv, store_output, usable_lengths


def mla_decode(
    query: torch.Tensor,
    kv: PagedKV,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    logit_scale: Scale,
    out_scale: Scale,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """query ``[B, Hq, 576]``; each token's 576-vector is its key, its first 512 its value.

    Writes ``out [B, Hq, 512]`` = ``out_scale * softmax(logit_scale * q.kv) ckv``, and with ``lse``
    (float32 ``[B, Hq]``) the base-2 LSE of each row's logits (-inf for an empty request).
    """
    lens = usable_lengths(seq_lens, kv.capacity)
    out_mult = _scalar(out_scale, query.device)
    for b, length in enumerate(lens):
        if length == 0:
            empty_rows(out, lse, b)
            continue
        k, v = paged_request_kv(kv, b, length)
        allowed = torch.ones(1, length, dtype=torch.bool, device=query.device)
        o, row_lse = attend(query[b : b + 1], k, v, allowed, logit_scale)
        store_output(o[0] * out_mult, out[b])
        if lse is not None:
            lse[b] = row_lse[0]
    return out
