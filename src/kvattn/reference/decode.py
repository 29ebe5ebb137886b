"""Reference batch decode (``xqa_batch_decode_with_kv_cache``, ``xqa``) and single decode."""

from __future__ import annotations

import math

import torch

from .._inputs import PagedKV, Scale
from .core import _scalar, attend, empty_rows, paged_request_kv, store_output, usable_lengths


def spec_decode_allowed(length: int, q_len: int, window_left: int, mask_words: torch.Tensor | None, device):
    """bool ``[q_len, length]``: which keys each draft row of one request sees.

    Row ``r`` sits at ``L - Q + r``. Keys before ``L - Q`` are visible within the window taken from
    the row's own position; draft key ``c`` is visible when mask bit ``(r, c)`` is set
    (``mask_words`` uint16 ``[Q, words]``: bit ``c % 16`` of word ``c // 16``), or when ``c <= r``
    without a mask.
    """
    r = torch.arange(q_len, device=device).unsqueeze(1)
    j = torch.arange(length, device=device).unsqueeze(0)
    start = length - q_len
    pos = start + r
    prefix = j < start
    if window_left >= 0:
        prefix = prefix & (pos - j <= window_left)
    c = j - start
    if mask_words is None:
        draft_ok = c <= r
    else:
        words = mask_words.to(torch.int64) & 0xFFFF  # [Q, W]
        cc = c.clamp(min=0).expand(q_len, length)
        word = torch.gather(words, 1, (cc // 16).clamp(max=words.shape[1] - 1))
        draft_ok = ((word >> (cc % 16)) & 1) == 1
    return prefix | ((c >= 0) & draft_ok)


def batch_decode(
    query: torch.Tensor,
    kv: PagedKV,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    q_len: int,
    logit_scale: Scale,
    out_scale: Scale,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    kv_start: torch.Tensor | None = None,
    q_cu_seq_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Paged decode of ``B`` requests with ``q_len`` query rows each (speculative decode).

    query ``[B * q_len, Hq, D]``; writes ``out [B * q_len, Hq, Dv]`` =
    ``out_scale * softmax(logit_scale * q.k) v`` in ``out``'s dtype, and with ``lse`` (float32
    ``[B * q_len, Hq]``) the rows' base-2 LSE (sinks excluded, -inf for a row that sees no key).
    ``kv_start [B]`` (int32, optional): request ``b`` attends to no key before ``kv_start[b]``.
    ``q_cu_seq_lens [B + 1]`` (optional, ragged drafts): request ``b`` owns the packed rows
    ``cu[b] : cu[b + 1]`` (at most ``q_len``), the last of its keys, and ``mask`` is
    ``[total_q, words]``, each row's bits over its request's own drafts.
    """
    if q_cu_seq_lens is not None:
        cu = q_cu_seq_lens.reshape(-1)
        cu = (cu.view(torch.int32) if cu.dtype == torch.uint32 else cu).to(torch.int64).tolist()
        batch = len(cu) - 1
        # (offsets past the query's rows are cut to them, as the kernels' clamped indices keep them)
        spans = [(max(0, min(cu[b], query.shape[0])), max(0, min(cu[b + 1], query.shape[0]))) for b in range(batch)]
    else:
        batch = query.shape[0] // q_len
        spans = [(b * q_len, (b + 1) * q_len) for b in range(batch)]
    lens = usable_lengths(seq_lens, kv.capacity)
    starts = kv_start.to(torch.int64).tolist() if kv_start is not None else [0] * batch
    out_mult = _scalar(out_scale, query.device)
    for b in range(batch):
        lo, hi = spans[b]
        if hi <= lo:
            continue
        rows = slice(lo, hi)
        length = lens[b]
        if length == 0:
            empty_rows(out, lse, rows)
            continue
        k, v = paged_request_kv(kv, b, length)
        if mask is None or q_len == 1:  # one query token a request: the mask is not read (docs/semantics.md)
            words = None
        elif q_cu_seq_lens is not None:
            words = mask[rows]
        else:
            words = mask[b]
        allowed = spec_decode_allowed(length, hi - lo, window_left, words, query.device)
        if starts[b] > 0:
            allowed = allowed & (torch.arange(length, device=query.device) >= starts[b])
        o, row_lse = attend(query[rows], k, v, allowed, logit_scale, sinks=sinks)
        store_output(o * out_mult, out[rows])
        if lse is not None:
            lse[rows] = row_lse
    return out


def alibi_slopes(num_heads: int, device=None) -> torch.Tensor:
    """float32 ``[num_heads]``: ``2^(-8 (i+1) / n)`` for the first ``n = 2^floor(log2 H)`` heads,
    then ``2^(-4 (2k+1) / n)`` for the rest."""
    n = 2 ** int(math.floor(math.log2(num_heads)))
    first = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    rest = [2.0 ** (-4.0 * (2 * k + 1) / n) for k in range(num_heads - n)]
    return torch.tensor(first + rest, dtype=torch.float32, device=device)


def rope_llama(x: torch.Tensor, positions: torch.Tensor, rope_scale: float, rope_theta: float) -> torch.Tensor:
    """Rotate-half rotary embedding over the whole head dim: x ``[N, H, D]``, positions ``[N]``."""
    d = x.shape[-1]
    half = d // 2
    i = torch.arange(half, dtype=torch.float64, device=x.device)
    freq = rope_theta ** (-2.0 * i / d) / rope_scale
    angle = positions.to(torch.float64).unsqueeze(1) * freq.unsqueeze(0)  # [N, D/2]
    cos = torch.cos(angle).float().unsqueeze(1)
    sin = torch.sin(angle).float().unsqueeze(1)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def single_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    logit_scale: Scale,
    out_scale: Scale,
    pos_encoding_mode: str = "NONE",
    window_left: int = -1,
    logits_soft_cap: float | None = None,
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
):
    """One query token over contiguous ``k, v [L, Hkv, D]`` (NHD views).

    Returns float32 ``o [Hq, D]`` (already times ``out_scale``) and ``lse [Hq]``.
    """
    length, hq = k.shape[0], q.shape[0]
    qf = q.float().unsqueeze(0)  # [1, Hq, D]
    kf = k.float()
    j = torch.arange(length, device=q.device)
    if pos_encoding_mode == "ROPE_LLAMA":
        qf = rope_llama(qf, torch.tensor([length - 1], device=q.device), rope_scale, rope_theta)
        kf = rope_llama(kf, j, rope_scale, rope_theta)
    bias = None
    if pos_encoding_mode == "ALIBI":
        bias = alibi_slopes(hq, q.device).view(hq, 1, 1) * j.float().view(1, 1, length)
    allowed = torch.ones(1, length, dtype=torch.bool, device=q.device)
    if window_left >= 0:
        allowed = allowed & ((length - 1) - j.unsqueeze(0) <= window_left)
    o, lse = attend(qf, kf, v.float(), allowed, logit_scale, bias=bias, soft_cap=logits_soft_cap)
    return o[0] * _scalar(out_scale, q.device), lse[0]
