"""The pieces every reference function shares: gather a request's tokens, attend, store."""

from __future__ import annotations

import math

import torch

from .._inputs import PagedKV, Scale
from .._formats_table import BY_DTYPE
from ..formats import FP8_DTYPE, quantize_fp8

LOG2E = 1.0 / math.log(2.0)


def _scalar(scale: Scale | float, device) -> torch.Tensor:
    value = scale.value() if isinstance(scale, Scale) else scale
    return torch.as_tensor(value, dtype=torch.float32, device=device)


def usable_lengths(seq_lens: torch.Tensor, capacity: int) -> list[int]:
    """Each request's length as every backend uses it: read as int32 (a uint32 length of 2^31 or
    more is a negative one), a negative length is 0 and a length past the page table's
    ``capacity`` is ``capacity``, so never more than ``capacity`` tokens are gathered, whatever
    the tensor holds (docs/semantics.md, "Unusable page ids and lengths"; lab/notes/hardening.md,
    "Hardening: unusable page ids and lengths")."""
    lens = seq_lens.reshape(-1)
    if lens.dtype == torch.uint32:
        lens = lens.view(torch.int32)  # the kernels read these bits as int32
    return lens.to(torch.int64).clamp(0, max(capacity, 0)).tolist()


def token_pages(table_row: torch.Tensor, length: int, page_size: int, num_pages: int):
    """``(page_ids, slots, ok)`` int64 / int64 / bool ``[length]`` of a request's first ``length``
    tokens (at most the row's capacity): ``ok`` is False for a token whose page id lies outside
    ``[0, num_pages)``, and its id is then 0 (only ``ok`` tokens may be read)."""
    length = min(length, table_row.shape[0] * page_size)
    t = torch.arange(length, device=table_row.device)
    page_ids = table_row.to(torch.int64)[t // page_size]
    ok = (page_ids >= 0) & (page_ids < num_pages)
    return torch.where(ok, page_ids, 0), t % page_size, ok


def gather_tokens(pages: torch.Tensor, sf: torch.Tensor | None, table_row: torch.Tensor, length: int,
                  num_pages: int | None = None) -> torch.Tensor:
    """float32 ``[length, heads, dim]`` of one request's tokens, dequantised (raw fp8 values).

    ``pages`` is ``[num_pages, page_size, heads, stored_dim]``; token ``t`` lives in page
    ``table_row[t // page_size]``, slot ``t % page_size``. A token whose page id lies outside
    ``[0, num_pages)`` (``num_pages``: the pages' count by default) reads nothing and is zero;
    ``length`` is at most the row's capacity (``len(table_row) * page_size``).
    """
    page_size = pages.shape[1]
    num_pages = pages.shape[0] if num_pages is None else min(num_pages, pages.shape[0])
    page_ids, slots, ok = token_pages(table_row, length, page_size, num_pages)
    fmt = BY_DTYPE.get(pages.dtype)
    if bool(ok.all()):
        rows = pages[page_ids, slots]  # [length, heads, stored_dim]
        scales = sf[page_ids, slots] if fmt is not None and fmt.scale_block else None
    else:  # zero codes (and zero scales) where nothing may be read: those tokens come out as zeros
        rows = pages.new_zeros(page_ids.shape[0], *pages.shape[2:])
        rows[ok] = pages[page_ids[ok], slots[ok]]
        scales = None
        if fmt is not None and fmt.scale_block:
            scales = sf.new_zeros(page_ids.shape[0], *sf.shape[2:])
            scales[ok] = sf[page_ids[ok], slots[ok]]
    if fmt is None:  # float32 pages (kvattn.integrations.transformers' float32 models): no format to undo
        return rows.to(torch.float32)
    return fmt.dequantize(rows, scales)


def empty_rows(out: torch.Tensor, lse: torch.Tensor | None, rows) -> None:
    """The rows of a request that sees no key: output 0, LSE -inf (docs/semantics.md)."""
    out[rows].zero_()
    if lse is not None:
        lse[rows] = float("-inf")


def paged_request_kv(kv: PagedKV, b: int, length: int):
    """``(k, v)`` of request ``b``: float32 ``[length, Hkv, D]`` / ``[length, Hkv, Dv]``. A token
    whose K (V) page id lies outside ``[0, kv.num_pages)`` has a zero key (value) and stays in the
    softmax, as in every kernel (docs/semantics.md, "Unusable page ids"). ``kv.num_pages`` is K's
    page count, the one bound the kernels apply to both tables."""
    n = kv.num_pages
    k = gather_tokens(kv.k, kv.k_sf, kv.k_table[b], length, n)
    v = gather_tokens(kv.v, kv.v_sf, kv.v_table[b], length, n)
    return k, v[..., : kv.v_dim]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    logit_scale,
    *,
    sinks: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    soft_cap: float | None = None,
):
    """Softmax attention of ``M`` query rows over ``L`` keys, in float32.

    Parameters
    ----------
    q : ``[M, Hq, D]``; k : ``[L, Hkv, D]``; v : ``[L, Hkv, Dv]`` (query head h reads KV head h // G)
    allowed : bool ``[M, L]``, which keys each row may see
    logit_scale : float or 0-d tensor; logits are ``logit_scale * q.k`` (+ bias, then soft cap)
    sinks : float32 ``[Hq]`` or None; adds ``exp(sink - m)`` to each denominator
    bias : ``[Hq, M, L]`` or broadcastable, added to the scaled logits
    soft_cap : ``c > 0`` maps a logit s to ``c * tanh(s / c)``

    Returns
    -------
    o : float32 ``[M, Hq, Dv]`` (zero for a row with no allowed key)
    lse : float32 ``[M, Hq]``, base-2 log-sum-exp of the allowed logits (sinks excluded; -inf if none)
    """
    q, k, v = q.float(), k.float(), v.float()
    hq, hkv = q.shape[1], k.shape[1]
    group = hq // hkv
    # Query heads grouped by their KV head rather than K/V copied per query head: MLA's 128 heads
    # over one latent head would otherwise copy the whole sequence 128 times in float32.
    qg = q.reshape(q.shape[0], hkv, group, q.shape[2])
    s = torch.einsum("mkgd,lkd->kgml", qg, k).reshape(hq, q.shape[0], k.shape[0]) * _scalar(logit_scale, q.device)
    if bias is not None:
        s = s + bias
    if soft_cap is not None and soft_cap > 0:
        s = soft_cap * torch.tanh(s / soft_cap)
    allowed = allowed.unsqueeze(0).expand_as(s)
    s = s.masked_fill(~allowed, float("-inf"))
    m = s.amax(dim=-1, keepdim=True) if s.shape[-1] else s.new_full((*s.shape[:-1], 1), float("-inf"))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)  # exactly 0 where masked
    denom = p.sum(dim=-1)  # [Hq, M]
    lse = torch.where(denom > 0, torch.log2(denom) + m.squeeze(-1) * LOG2E, torch.full_like(denom, float("-inf")))
    if sinks is not None:
        denom = denom + torch.exp(sinks.float().view(hq, 1) - m.squeeze(-1))
    o = torch.einsum("kgml,lkd->kgmd", p.view(hkv, group, *p.shape[1:]), v).reshape(hq, p.shape[1], v.shape[-1])
    o = torch.where(denom.unsqueeze(-1) > 0, o / denom.clamp_min(1e-30).unsqueeze(-1), torch.zeros_like(o))
    return o.transpose(0, 1).contiguous(), lse.transpose(0, 1).contiguous()


def store_output(o_real: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Write float32 values into ``out`` in its dtype (fp8: nearest even, saturating at +-448)."""
    if out.dtype == FP8_DTYPE:
        out.copy_(quantize_fp8(o_real))
    else:
        out.copy_(o_real.to(out.dtype))
    return out
