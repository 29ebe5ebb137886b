"""Reference paged causal context attention (``trtllm_batch_context_with_kv_cache``).

Skip-softmax sparsity is defined on tiles, so the reference walks the same tiles as kvattn's kernel:
query tiles of ``SKIP_SOFTMAX_TILE_M`` rows aligned at each request's first query row, KV tiles of
``SKIP_SOFTMAX_TILE_N`` keys aligned at key 0, visited in increasing key order from the first tile
the causal/window rule allows; one decision per (query tile, query head).
"""

from __future__ import annotations

import math

import torch

from .._inputs import PagedKV, Scale
from .core import _scalar, attend, paged_request_kv, usable_lengths

SKIP_SOFTMAX_TILE_M = 128
SKIP_SOFTMAX_TILE_N = 128


def context_allowed(length: int, q_len: int, window_left: int, device, rows: range | None = None,
                    causal: bool = True) -> torch.Tensor:
    """bool ``[q_len, length]``: row ``i`` at ``p = L - q_len + i`` sees ``j <= p`` within the window
    (``rows``: only those rows ``i``); ``causal=False``: every row sees every key (no window)."""
    rows = range(q_len) if rows is None else rows
    if not causal:
        return torch.ones(len(rows), length, dtype=torch.bool, device=device)
    p = (length - q_len + torch.arange(rows.start, rows.stop, device=device)).unsqueeze(1)
    j = torch.arange(length, device=device).unsqueeze(0)
    allowed = j <= p
    if window_left >= 0:
        allowed = allowed & (p - j <= window_left)
    return allowed


def _attend_skip_softmax(q, k, v, allowed, logit_scale, sinks, threshold: float):
    """Tiled online softmax that skips a KV tile (after the first) when, for every row of the query
    tile, ``exp(tile_max - running_max) < threshold``. q ``[M, Hq, D]``; returns o ``[M, Hq, Dv]``
    and the base-2 LSE ``[M, Hq]`` of the kept tiles' logits (sinks excluded)."""
    m_rows, hq = q.shape[0], q.shape[1]
    group = hq // k.shape[1]
    kk = k.float().repeat_interleave(group, dim=1)
    vv = v.float().repeat_interleave(group, dim=1)
    s_all = torch.einsum("mhd,lhd->hml", q.float(), kk) * _scalar(logit_scale, q.device)
    s_all = s_all.masked_fill(~allowed.unsqueeze(0), float("-inf"))
    out = torch.zeros(hq, m_rows, vv.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((hq, m_rows), float("-inf"), dtype=torch.float32, device=q.device)
    tm, tn = SKIP_SOFTMAX_TILE_M, SKIP_SOFTMAX_TILE_N
    for r0 in range(0, m_rows, tm):
        rows = slice(r0, min(r0 + tm, m_rows))
        cols = allowed[rows].any(dim=0).nonzero()
        if cols.numel() == 0:
            continue
        first, last = int(cols.min()) // tn, int(cols.max()) // tn
        for h in range(hq):
            s = s_all[h, rows]  # [R, L]
            m = torch.full((s.shape[0],), float("-inf"), device=q.device)
            den = torch.zeros(s.shape[0], device=q.device)
            acc = torch.zeros(s.shape[0], vv.shape[-1], device=q.device)
            for t in range(first, last + 1):
                st = s[:, t * tn : (t + 1) * tn]
                tile_max = st.amax(dim=-1)
                if t > first:
                    ratio = torch.where(
                        torch.isneginf(tile_max),
                        torch.zeros_like(tile_max),
                        torch.exp(tile_max - m),  # +inf when m is -inf and the tile has a key
                    )
                    if bool((ratio < threshold).all()):
                        continue
                m_new = torch.maximum(m, tile_max)
                m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
                alpha = torch.exp(m - m_safe)
                p = torch.exp(st - m_safe.unsqueeze(1))
                den = den * alpha + p.sum(dim=-1)
                acc = acc * alpha.unsqueeze(1) + p @ vv[t * tn : (t + 1) * tn, h]
                m = m_new
            lse[h, rows] = torch.where(den > 0, (m + torch.log(den.clamp_min(1e-30))) / math.log(2.0), float("-inf"))
            if sinks is not None:
                m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
                den = den + torch.exp(sinks[h].float() - m_safe)
            out[h, rows] = torch.where(den.unsqueeze(1) > 0, acc / den.clamp_min(1e-30).unsqueeze(1), 0.0)
    return out.transpose(0, 1), lse.transpose(0, 1)


def context(
    query: torch.Tensor,
    kv: PagedKV,
    seq_lens: torch.Tensor,
    cum_seq_lens_q: torch.Tensor,
    *,
    logit_scale: Scale,
    out_scale: Scale,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    skip_softmax_threshold_scale_factor: float | None = None,
    lse: torch.Tensor | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """float32 ``[sum_q, Hq, Dv]`` = ``out_scale * softmax(logit_scale * q.k) v`` (the caller stores it).

    Request ``b`` owns query rows ``cum_seq_lens_q[b] : cum_seq_lens_q[b + 1]``, the last tokens of
    its ``seq_lens[b]`` keys; each sees the keys up to its own position, or with ``causal=False``
    all of them. ``lse`` (float32 ``[sum_q, Hq]``, optional) receives each row's
    base-2 LSE (sinks excluded; -inf for a row that sees no key).
    """
    lens = usable_lengths(seq_lens, kv.capacity)
    cum = cum_seq_lens_q.to(torch.int64).tolist()
    sum_q = query.shape[0]
    o_all = torch.zeros(query.shape[0], query.shape[1], kv.v_dim, dtype=torch.float32, device=query.device)
    f = skip_softmax_threshold_scale_factor
    if lse is not None:
        lse.fill_(float("-inf"))
    for b, length in enumerate(lens):
        # Rows cum[b] .. cum[b + 1] - 1 sit at positions L - q_len + i; only those inside the
        # query's rows exist (the kernels write no others: docs/semantics.md).
        lo, hi = cum[b], cum[b + 1]
        r0, r1 = max(lo, 0), min(hi, sum_q)
        if r1 <= r0 or length == 0:
            continue
        k, v = paged_request_kv(kv, b, length)
        allowed = context_allowed(length, hi - lo, window_left, query.device, range(r0 - lo, r1 - lo), causal)
        if f:
            o, row_lse = _attend_skip_softmax(query[r0:r1], k, v, allowed, logit_scale, sinks, f / length)
        else:
            o, row_lse = attend(query[r0:r1], k, v, allowed, logit_scale, sinks=sinks)
        o_all[r0:r1] = o
        if lse is not None:
            lse[r0:r1] = row_lse
    return o_all * _scalar(out_scale, query.device)
