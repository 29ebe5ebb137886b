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
    q_len: int = 1,
) -> torch.Tensor:
    """query ``[B, Q * Hq, 576]`` (row ``r * Hq + h``: token ``r``, head ``h``; ``Q = q_len``);
    each token's 576-vector is its key, its first 512 its value.

    Writes ``out [B, Q * Hq, 512]`` = ``out_scale * softmax(logit_scale * q.kv) ckv``, and with
    ``lse`` (float32 ``[B, Q * Hq]``) the base-2 LSE of each row's logits. Token ``r`` of a request
    of length ``L`` sits at position ``L - Q + r`` and sees keys ``0 .. L - Q + r``; a row that
    sees no key (an empty request, or a negative position) is zero with LSE -inf.
    """
    lens = usable_lengths(seq_lens, kv.capacity)
    out_mult = _scalar(out_scale, query.device)
    heads = query.shape[1] // q_len
    for b, length in enumerate(lens):
        if length == 0:
            empty_rows(out, lse, b)
            continue
        k, v = paged_request_kv(kv, b, length)
        # allowed[r, j]: key j at or before token r's position L - Q + r
        pos = length - q_len + torch.arange(q_len, device=query.device)
        allowed = torch.arange(length, device=query.device)[None, :] <= pos[:, None]
        o, row_lse = attend(query[b].view(q_len, heads, -1), k, v, allowed, logit_scale)
        store_output(o.reshape(q_len * heads, -1) * out_mult, out[b])
        if lse is not None:
            lse[b] = row_lse.reshape(-1)
    return out
