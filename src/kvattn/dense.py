"""An independent dense float64 formulation of the five kvattn functions (the test oracle).

Written from docs/semantics.md separately from :mod:`kvattn.reference`, and deliberately in a different
style: no per-request loops. Every request's tokens are gathered at once into padded float64
tensors ``[B, Lmax, Hkv, D]``; one boolean mask ``[B, Q, Lmax]`` says which key each query row sees
(causal / speculative-decode bits / window / ragged prefill / ``seq_len``); the logits get the ALiBi
bias and the soft cap; RoPE is a complex multiplication; the softmax runs in float64 with the sinks
in its denominator. Nothing here calls :mod:`kvattn.reference`; NVFP4 codes are decoded with a table
of their own.

Each function takes the public function's arguments (those that change the math; launch-sizing
and buffer arguments are accepted and ignored) and returns the *real* output in float64:

* :func:`batch_decode` -> ``o_real [B * Q, Hq, D]`` (``bmm2 * o_scale * softmax V``; an fp8 ``out``
  of the public function stores ``o_real / o_scale``).
* :func:`xqa` -> ``[B, 1, Hq, D]`` (already times ``kv_scale`` for quantised caches).
* :func:`single_decode` -> ``(o [Hq, D], lse [Hq])`` (LSE base 2).
* :func:`mla` -> ``[B, Hq, 512]``.
* :func:`context` -> ``[sum_q, Hq, D]`` (exact attention unless a skip-softmax factor is given).

Rows with no visible key are zero. Scales may be floats or one-element tensors.

Example
-------
>>> import torch
>>> from kvattn import dense
>>> from kvattn.testing import make_paged_kv
>>> case = make_paged_kv([5, 40], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16)
>>> q = torch.randn(2, 4, 64, dtype=torch.float16)
>>> o = dense.batch_decode(q, case.kv_cache, case.block_tables, case.seq_lens, bmm1_scale=0.125)
>>> o.shape, o.dtype
(torch.Size([2, 4, 64]), torch.float64)
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64
_LN2 = math.log(2.0)
# e2m1 magnitudes by code index 0..7; codes 8..15 are the same with the sign bit set.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

__all__ = [
    "batch_decode",
    "xqa",
    "single_decode",
    "mla",
    "context",
    "skip_softmax_kept_tiles",
    "alibi_slopes",
    "rope_rotate",
    "decode_nvfp4",
]


# ---------------------------------------------------------------------------------------------
# scalars and element decoding
# ---------------------------------------------------------------------------------------------
def _num(x, default: float = 1.0) -> float:
    """A float from a float, an int, a one-element tensor or None (-> ``default``)."""
    if x is None:
        return default
    if isinstance(x, torch.Tensor):
        return float(x.detach().double().cpu().reshape(-1)[0])
    return float(x)


def decode_nvfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 ``[..., D]`` of NVFP4 bytes ``[..., D/2]`` with e4m3 block scales ``[..., D/16]``.

    Element ``2i`` is the low nibble of byte ``i``; a nibble is sign bit 3 and magnitude index 0..7.
    """
    table = torch.tensor([*_E2M1, *(-v for v in _E2M1)], dtype=F64, device=packed.device)
    b = packed.to(torch.int64)
    codes = torch.stack((b % 16, b // 16), dim=-1).flatten(-2)  # [..., D]: low nibble first
    vals = table[codes]
    per_block = scales.to(F64).repeat_interleave(16, dim=-1)
    return vals * per_block


def _as_f64(x: torch.Tensor, sf: torch.Tensor | None) -> torch.Tensor:
    if x.dtype == torch.uint8:
        return decode_nvfp4(x, sf)
    return x.to(F64)


# ---------------------------------------------------------------------------------------------
# caches -> dense padded tokens
# ---------------------------------------------------------------------------------------------
def _planes(kv_cache, layout: str):
    """``(K, V)`` page tensors as ``[P, page, H, X]`` (X: stored dim) from any accepted form."""
    if isinstance(kv_cache, (tuple, list)):
        k, v = kv_cache
    else:
        k = kv_cache.select(1, 0)
        v = kv_cache.select(1, kv_cache.shape[1] - 1)  # size-1 plane: V is K
    if layout.upper() == "HND":
        k, v = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
    return k, v


def _token_rows(table: torch.Tensor, lens: torch.Tensor, page_size: int, lmax: int):
    """Page id and slot of every (request, token) ``[B, Lmax]``, and which tokens exist.

    Table entries past a request's last page are never used (replaced by page 0).
    """
    t = torch.arange(lmax, device=table.device)
    exists = t.view(1, -1) < lens.view(-1, 1)
    col = (t // page_size).clamp(max=max(table.shape[1] - 1, 0))
    page = table.to(torch.int64)[:, col] if table.shape[1] else torch.zeros_like(exists, dtype=torch.int64)
    page = torch.where(exists, page, torch.zeros_like(page))
    return page, (t % page_size).view(1, -1).expand_as(page), exists


def _gather(pages: torch.Tensor, sf, table: torch.Tensor, lens: torch.Tensor, lmax: int) -> torch.Tensor:
    """float64 ``[B, Lmax, H, D]`` of every request's tokens; zero past each ``seq_len``."""
    page, slot, exists = _token_rows(table, lens, pages.shape[1], lmax)
    rows = _as_f64(pages[page, slot], None if sf is None else sf[page, slot])
    return torch.where(exists[:, :, None, None], rows, torch.zeros((), dtype=F64, device=rows.device))


def _gather_kv(kv_cache, kv_sf, layout: str, k_table, v_table, lens, lmax: int):
    """float64 dense ``(K, V)`` ``[B, Lmax, Hkv, D]`` of a paged cache in any form (NVFP4: with its
    block scales), K read through ``k_table`` and V through ``v_table``."""
    k_pages, v_pages = _planes(kv_cache, layout)
    k_sf = v_sf = None
    if kv_sf is not None:
        k_sf, v_sf = _planes(kv_sf, layout)
    return _gather(k_pages, k_sf, k_table, lens, lmax), _gather(v_pages, v_sf, v_table, lens, lmax)


def _lens(seq_lens: torch.Tensor) -> torch.Tensor:
    return seq_lens.reshape(-1).to(torch.int64)


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (tuple, list)):
        return type(x)(_to_cpu(y) for y in x)
    return x


def on_cpu(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with every tensor argument (and tuples / lists of them) copied to the
    CPU: a formulation of this module on a GPU call's tensors, in float64 on the host.

    Examples
    --------
    >>> import torch
    >>> from kvattn import dense
    >>> dense.on_cpu(lambda t: t.device.type, torch.zeros(1))
    'cpu'
    """
    return fn(*_to_cpu(args), **{k: _to_cpu(v) for k, v in kwargs.items()})


# ---------------------------------------------------------------------------------------------
# the attention itself
# ---------------------------------------------------------------------------------------------
def _softmax_attention(q, k, v, visible, scale, *, bias=None, soft_cap=None, sinks=None):
    """Dense float64 attention.

    Parameters
    ----------
    q : ``[B, Q, Hq, D]``; k : ``[B, L, Hkv, D]``; v : ``[B, L, Hkv, Dv]`` (float64)
    visible : bool ``[B, Q, L]`` or ``[B, Hq, Q, L]``
    scale : float, the logit multiplier
    bias : ``[B or 1, Hq, Q or 1, L]`` added to the scaled logits, or None
    soft_cap : ``c > 0`` or None
    sinks : ``[Hq]`` or None

    Returns
    -------
    o : ``[B, Q, Hq, Dv]``, zero where a row sees nothing; lse : ``[B, Q, Hq]`` base 2 (-inf there)
    """
    bsz, nq, hq, _ = q.shape
    hkv = k.shape[2]
    grp = hq // hkv
    qg = q.reshape(bsz, nq, hkv, grp, q.shape[-1])
    logits = torch.einsum("bqkgd,blkd->bkgql", qg, k).reshape(bsz, hq, nq, k.shape[1]) * scale
    if bias is not None:
        logits = logits + bias
    if soft_cap:
        logits = soft_cap * torch.tanh(logits / soft_cap)
    vis = visible if visible.dim() == 4 else visible.unsqueeze(1)
    vis = vis.expand_as(logits)
    neg = torch.tensor(-math.inf, dtype=F64, device=q.device)
    logits = torch.where(vis, logits, neg)
    any_key = vis.any(dim=-1)  # [B, Hq, Q]
    if logits.shape[-1] == 0:  # no keys at all (every request empty)
        logits = torch.full((*logits.shape[:-1], 1), -math.inf, dtype=F64, device=q.device)
        v = torch.zeros(bsz, 1, hkv, v.shape[-1], dtype=F64, device=q.device)
    top = torch.where(any_key, logits.amax(dim=-1), torch.zeros((), dtype=F64, device=q.device))
    w = torch.exp(logits - top.unsqueeze(-1))
    total = w.sum(dim=-1)
    lse = torch.where(any_key, (torch.log(total) + top) / _LN2, neg)
    if sinks is not None:
        total = total + torch.exp(sinks.reshape(1, hq, 1).to(F64) - top)
    vg = v.unsqueeze(3).expand(-1, -1, -1, grp, -1).reshape(bsz, v.shape[1], hq, v.shape[-1])
    num = torch.einsum("bhql,blhd->bhqd", w, vg)
    o = torch.where(any_key.unsqueeze(-1), num / torch.where(any_key, total, 1.0).unsqueeze(-1), 0.0)
    return o.permute(0, 2, 1, 3), lse.permute(0, 2, 1)


# ---------------------------------------------------------------------------------------------
# positional pieces
# ---------------------------------------------------------------------------------------------
def alibi_slopes(num_heads: int) -> torch.Tensor:
    """float64 ``[num_heads]`` ALiBi slopes (docs/semantics.md, single decode)."""
    n = 1 << (num_heads.bit_length() - 1)  # largest power of two <= num_heads
    out = []
    for h in range(num_heads):
        if h < n:
            out.append(2.0 ** (-8.0 * (h + 1) / n))
        else:
            out.append(2.0 ** (-4.0 * (2 * (h - n) + 1) / n))
    return torch.tensor(out, dtype=F64)


def rope_rotate(x: torch.Tensor, pos: torch.Tensor, rope_scale: float, rope_theta: float) -> torch.Tensor:
    """Rotate-half RoPE as a complex product: pair ``(x[i], x[i + D/2])`` times ``exp(i * angle)``.

    x ``[N, H, D]`` float64, pos ``[N]``; ``angle = pos * theta^(-2i/D) / rope_scale``.
    """
    d = x.shape[-1]
    half = d // 2
    inv = torch.pow(torch.tensor(rope_theta, dtype=F64), -torch.arange(0, d, 2, dtype=F64) / d) / rope_scale
    angle = pos.to(F64).view(-1, 1, 1) * inv.view(1, 1, half)
    z = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat((z.real, z.imag), dim=-1)


# ---------------------------------------------------------------------------------------------
# 1. batch decode
# ---------------------------------------------------------------------------------------------
def _draft_bits(mask: torch.Tensor | None, bsz: int, nq: int, device, read: bool | None = None) -> torch.Tensor:
    """bool ``[B, Q, Q]``: may draft row r see draft token c (explicit uint16 words or causal). The
    mask is read when ``read`` (default: ``Q > 1``; a call of one query token a request does not
    read it, while a ragged request of one draft row in a call of ``Q > 1`` does)."""
    if read is None:
        read = nq > 1
    if mask is None or not read:
        r = torch.arange(nq, device=device)
        return (r.view(1, -1, 1) >= r.view(1, 1, -1)).expand(bsz, nq, nq)
    words = mask.to(torch.int64) % 65536  # [B, Q, W]
    c = torch.arange(nq, device=device)
    picked = words[:, :, c // 16]  # [B, Q, Q]
    return (picked // (2 ** (c % 16)).view(1, 1, -1)) % 2 == 1


def batch_decode(
    query: torch.Tensor,
    kv_cache,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    bmm1_scale=1.0,
    bmm2_scale=1.0,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    kv_layout: str = "NHD",
    q_len_per_req: int | None = 1,
    o_scale: float | None = 1.0,
    mask: torch.Tensor | None = None,
    kv_cache_sf=None,
    return_lse: bool = False,
    q_cu_seq_lens: torch.Tensor | None = None,
    _read_mask: bool | None = None,
    **_launch_args,
) -> torch.Tensor:
    """Dense ``xqa_batch_decode_with_kv_cache``: float64 ``o_real [B * Q, Hq, D]`` (with
    ``return_lse``, also the base-2 LSE ``[B * Q, Hq]``, sinks excluded).

    Parameters
    ----------
    query : ``[B * Q, Hq, D]``
    kv_cache : ``[P, 2|1, page, Hkv, D]`` / ``[P, 2|1, Hkv, page, D]`` or a ``(K, V)`` tuple (NVFP4:
        uint8, last dim ``D / 2``, with ``kv_cache_sf`` of the same form, last dim ``D / 16``)
    block_tables : int32 ``[B, pages]``; seq_lens : ``[B]``
    bmm1_scale, bmm2_scale, o_scale : float or one-element tensor
    window_left, sinks ``[Hq]``, kv_layout, q_len_per_req, mask uint16 ``[B, Q, W]`` : as the public API
    q_cu_seq_lens : ``[B + 1]`` ragged drafts (query, mask and the results ``[total_q, ...]``): each
        request on its own, its ``q_b`` rows at the last ``q_b`` positions, its mask rows read
        whenever ``q_len_per_req > 1`` (also for a request of one row)
    **_launch_args : ignored (``workspace_buffer``, ``max_seq_len``, ``out``, ``enable_pdl``)

    Returns
    -------
    torch.Tensor float64 ``[B * Q, Hq, D]`` = ``bmm2 * o_scale * softmax(bmm1 * q.k) V``
    """
    nq = 1 if q_len_per_req is None else int(q_len_per_req)
    if q_cu_seq_lens is not None:
        return _ragged_decode(query, kv_cache, block_tables, seq_lens, q_cu_seq_lens, nq, mask, return_lse,
                              bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, window_left=window_left, sinks=sinks,
                              kv_layout=kv_layout, o_scale=o_scale, kv_cache_sf=kv_cache_sf)
    lens = _lens(seq_lens)
    bsz = lens.numel()
    hq, d = query.shape[1], query.shape[2]
    lmax = int(lens.max()) if bsz else 0
    k, v = _gather_kv(kv_cache, kv_cache_sf, kv_layout, block_tables, block_tables, lens, lmax)
    q = query.to(F64).reshape(bsz, nq, hq, d)

    j = torch.arange(lmax, device=query.device).view(1, 1, -1)
    first_draft = (lens - nq).view(-1, 1, 1)
    pos = first_draft + torch.arange(nq, device=query.device).view(1, -1, 1)  # [B, Q, 1]
    before = j < first_draft
    if window_left >= 0:
        before = before & (pos - j <= window_left)
    c = j - first_draft  # draft index of key j
    bits = _draft_bits(mask, bsz, nq, query.device, read=_read_mask)  # [B, Q, Q]
    in_drafts = (c >= 0) & (c < nq)
    draft_ok = torch.gather(bits, 2, c.clamp(0, max(nq - 1, 0)).expand(bsz, nq, lmax)) & in_drafts
    visible = (before | draft_ok) & (j < lens.view(-1, 1, 1))
    o, lse = _softmax_attention(q, k, v, visible, _num(bmm1_scale), sinks=sinks)
    mult = _num(bmm2_scale) * _num(o_scale)
    o = (o * mult).reshape(bsz * nq, hq, d)
    return (o, lse.reshape(bsz * nq, hq)) if return_lse else o


def _ragged_decode(query, kv_cache, block_tables, seq_lens, cu, nq: int, mask, return_lse: bool, **common):
    """:func:`batch_decode` of packed ragged drafts: request ``b`` alone with its own ``q_b`` rows
    as its query length, its mask rows read when the call's ``Q > 1``."""
    cu = cu.reshape(-1)
    cu = (cu.view(torch.int32) if cu.dtype == torch.uint32 else cu).to(torch.int64).tolist()
    hq, d = query.shape[1], query.shape[2]
    out = torch.zeros(query.shape[0], hq, d, dtype=F64, device=query.device)
    lse = torch.full((query.shape[0], hq), -math.inf, dtype=F64, device=query.device)
    for b in range(len(cu) - 1):
        lo, hi = cu[b], cu[b + 1]
        if hi <= lo:
            continue
        rows = mask[lo:hi].unsqueeze(0) if mask is not None else None
        o, l_ = batch_decode(query[lo:hi], kv_cache, block_tables[b:b + 1], seq_lens.reshape(-1)[b:b + 1],
                             q_len_per_req=hi - lo, mask=rows, return_lse=True, _read_mask=nq > 1, **common)
        out[lo:hi], lse[lo:hi] = o, l_
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# 2. xqa
# ---------------------------------------------------------------------------------------------
def _xqa_gather(cache: torch.Tensor, table, lens, num_kv_heads, page_size, lmax, layout):
    if cache.dim() == 4:
        pages = cache if layout.upper() == "NHD" else cache.permute(0, 2, 1, 3)
        return _gather(pages, None, table, lens, lmax)
    # Flat pool: head h of token slot s of page p is row (p * page_size + s) * Hkv + h.
    page, slot, exists = _token_rows(table, lens, page_size, lmax)
    h = torch.arange(num_kv_heads, device=cache.device)
    row = ((page * page_size + slot) * num_kv_heads).unsqueeze(-1) + h  # [B, L, Hkv]
    vals = cache[row].to(F64)
    return torch.where(exists[:, :, None, None], vals, torch.zeros((), dtype=F64))


def xqa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    num_kv_heads: int,
    page_size: int,
    sinks: torch.Tensor | None = None,
    q_scale=1.0,
    kv_scale=None,
    sliding_win_size: int = 0,
    kv_layout: str = "NHD",
    return_lse: bool = False,
    **_launch_args,
) -> torch.Tensor:
    """Dense ``xqa``: float64 ``[B, 1, Hq, D]``, the value ``output`` should hold (with
    ``return_lse``, also the base-2 LSE ``[B, 1, Hq]``).

    Parameters
    ----------
    q : ``[B, 1, Hq, D]``
    k_cache, v_cache : flat pools ``[pages * page_size * Hkv, D]`` or 4-D pages in ``kv_layout``
    page_table : int32 ``[B, pages]``; seq_lens ``[B, 1]``
    sinks : float32 ``[Hkv, G]`` or None
    q_scale : float or one-element tensor; kv_scale : one-element tensor or None
    sliding_win_size : ``W > 0`` sees the last ``W`` keys; 0 all
    **_launch_args : ignored (``output``, ``workspace_buffer``, ``semaphores``, ``sm_count``)
    """
    lens = _lens(seq_lens)
    bsz, _, hq, d = q.shape
    lmax = int(lens.max()) if bsz else 0
    quantised = k_cache.dtype not in (torch.float16, torch.bfloat16)
    kv_eff = _num(kv_scale) if quantised else 1.0
    k = _xqa_gather(k_cache, page_table, lens, num_kv_heads, page_size, lmax, kv_layout)
    v = _xqa_gather(v_cache, page_table, lens, num_kv_heads, page_size, lmax, kv_layout)
    j = torch.arange(lmax).view(1, 1, -1)
    visible = j < lens.view(-1, 1, 1)
    if sliding_win_size > 0:
        visible = visible & (j >= lens.view(-1, 1, 1) - sliding_win_size)
    scale = _num(q_scale) * kv_eff / math.sqrt(d)
    o, lse = _softmax_attention(q.to(F64), k, v, visible, scale, sinks=None if sinks is None else sinks.reshape(-1))
    o = (o * kv_eff).reshape(bsz, 1, hq, d)
    return (o, lse.reshape(bsz, 1, hq)) if return_lse else o


# ---------------------------------------------------------------------------------------------
# 3. single decode
# ---------------------------------------------------------------------------------------------
def single_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    window_left: int = -1,
    logits_soft_cap=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    return_lse: bool = True,
):
    """Dense ``single_decode_with_kv_cache``: float64 ``(o [Hq, D], lse [Hq])`` (always both).

    ``q [Hq, D]``; ``k, v`` ``[L, Hkv, D]`` (NHD) or ``[Hkv, L, D]`` (HND). ``use_tensor_cores`` and
    ``return_lse`` are ignored.
    """
    if kv_layout.upper() == "HND":
        k, v = k.transpose(0, 1), v.transpose(0, 1)
    hq, d = q.shape
    length = k.shape[0]
    qd, kd, vd = q.to(F64), k.to(F64), v.to(F64)
    mode = pos_encoding_mode.upper()
    rs, rt = _num(rope_scale), _num(rope_theta, 1e4)
    if mode == "ROPE_LLAMA":
        qd = rope_rotate(qd.unsqueeze(0), torch.tensor([length - 1]), rs, rt)[0]
        kd = rope_rotate(kd, torch.arange(length), rs, rt)
    scale = _num(sm_scale, 1.0 / math.sqrt(d)) * _num(q_scale) * _num(k_scale)
    keys = torch.arange(length, dtype=F64)
    bias = None
    if mode == "ALIBI":
        bias = (alibi_slopes(hq).view(hq, 1) * keys.view(1, -1)).view(1, hq, 1, length)
    visible = torch.ones(1, 1, length, dtype=torch.bool)
    if window_left >= 0:
        visible = visible & ((length - 1) - keys.view(1, 1, -1) <= window_left)
    cap = _num(logits_soft_cap, 0.0)
    o, lse = _softmax_attention(qd.view(1, 1, hq, d), kd.unsqueeze(0), vd.unsqueeze(0), visible, scale,
                                bias=bias, soft_cap=cap if cap > 0 else None)
    return o[0, 0] * _num(v_scale), lse[0, 0]


# ---------------------------------------------------------------------------------------------
# 4. MLA
# ---------------------------------------------------------------------------------------------
def mla(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    bmm1_scale=1.0,
    bmm2_scale=1.0,
    kv_lora_rank: int = 512,
    return_lse: bool = False,
    **_launch_args,
) -> torch.Tensor:
    """Dense MLA decode: float64 ``[B, Hq, kv_lora_rank]`` (with ``return_lse``, also the base-2
    LSE ``[B, Hq]``).

    ``query [B, 1, Hq, 576]``; ``kv_cache [P, page, 576]`` or ``[P, 1, page, 576]``; keys are the
    whole rows, values their first ``kv_lora_rank`` columns.
    """
    if kv_cache.dim() == 4:
        kv_cache = kv_cache[:, 0]
    lens = _lens(seq_lens)
    bsz = lens.numel()
    lmax = int(lens.max()) if bsz else 0
    rows = _gather(kv_cache.unsqueeze(2), None, block_tables, lens, lmax)  # [B, L, 1, 576]
    visible = torch.arange(lmax).view(1, 1, -1) < lens.view(-1, 1, 1)
    o, lse = _softmax_attention(query.to(F64), rows, rows[..., :kv_lora_rank], visible, _num(bmm1_scale))
    o = o[:, 0] * _num(bmm2_scale)
    return (o, lse[:, 0]) if return_lse else o


# ---------------------------------------------------------------------------------------------
# 5. context (prefill)
# ---------------------------------------------------------------------------------------------
def skip_softmax_kept_tiles(logits, visible, lam, tile_m: int = 128, tile_n: int = 128):
    """Which (row, key) survive skip-softmax for one request, re-derived from docs/semantics.md.

    Parameters
    ----------
    logits : float64 ``[Hq, Lq, L]`` scaled logits; visible : bool ``[Lq, L]``
    lam : the threshold ``f / L``
    tile_m, tile_n : query-tile rows (aligned at the request's first row) and KV-tile keys (aligned
        at key 0)

    Returns
    -------
    keep : bool ``[Hq, Lq, L]`` (visible and in a processed tile); skipped : number of skipped tiles
    """
    hq, lq, length = logits.shape
    keep = torch.zeros(hq, lq, length, dtype=torch.bool)
    skipped = 0
    masked = torch.where(visible.unsqueeze(0), logits, torch.tensor(-math.inf, dtype=F64))
    for r0 in range(0, lq, tile_m):
        r1 = min(r0 + tile_m, lq)
        cols = torch.nonzero(visible[r0:r1].any(dim=0)).flatten()
        if cols.numel() == 0:
            continue
        tiles = range(int(cols[0]) // tile_n, int(cols[-1]) // tile_n + 1)
        run_max = torch.full((hq, r1 - r0), -math.inf, dtype=F64)
        for n, t in enumerate(tiles):
            c0, c1 = t * tile_n, min((t + 1) * tile_n, length)
            tmax = masked[:, r0:r1, c0:c1].amax(dim=-1)  # [Hq, rows]
            # exp(tile_max - running_max) < lam for every row, in log form; a row with no key in
            # the tile votes "skip", a row that has seen nothing yet votes "keep".
            below = torch.where(
                torch.isinf(tmax) & (tmax < 0), torch.ones_like(tmax, dtype=torch.bool),
                torch.where(torch.isinf(run_max), torch.zeros_like(tmax, dtype=torch.bool),
                            torch.exp(tmax - run_max) < lam),
            )
            skip = below.all(dim=1) if n > 0 else torch.zeros(hq, dtype=torch.bool)
            skipped += int(skip.sum())
            run_max = torch.where(skip.unsqueeze(1), run_max, torch.maximum(run_max, tmax))
            keep[:, r0:r1, c0:c1] |= ~skip.view(hq, 1, 1)
    return keep & visible.unsqueeze(0), skipped


def context(
    query: torch.Tensor,
    kv_cache,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cum_seq_lens_q: torch.Tensor,
    bmm1_scale=1.0,
    bmm2_scale=1.0,
    window_left: int = -1,
    sinks=None,
    kv_layout: str = "HND",
    kv_block_scales=None,
    uses_shared_paged_kv_idx: bool = True,
    skip_softmax_threshold_scale_factor: float | None = None,
    skip_tile: tuple[int, int] = (128, 128),
    return_lse: bool = False,
    causal: bool = True,
    **_launch_args,
) -> torch.Tensor:
    """Dense ``trtllm_batch_context_with_kv_cache``: float64 ``[sum_q, Hq, D]`` (``bmm2 * softmax V``).

    Parameters
    ----------
    query : ``[sum_q, Hq, D]``; request b owns rows ``cum_seq_lens_q[b] : cum_seq_lens_q[b + 1]``,
        the last tokens of its ``seq_lens[b]`` keys
    kv_cache, kv_layout, kv_block_scales : as the public API (default HND)
    block_tables : ``[B, pages]``, or ``[B, 2, pages]`` with ``uses_shared_paged_kv_idx=False``
    sinks : ``[Hq]`` (or a list of one tensor)
    skip_softmax_threshold_scale_factor : None/0 exact; ``f > 0`` keeps only the tiles that
        :func:`skip_softmax_kept_tiles` keeps (``skip_tile`` = (rows, keys))
    causal : False: bidirectional, every row sees all ``seq_lens[b]`` keys of its request (no
        window: ``window_left`` must be -1)
    **_launch_args : ignored (``workspace_buffer``, ``max_q_len``, ``max_kv_len``, ``batch_size``,
        ``cum_seq_lens_kv``, ``out``, ``out_dtype``, ``o_sf_scale``, ``o_sf_vec_size``, ``enable_pdl``)
    """
    if isinstance(sinks, (list, tuple)):
        sinks = sinks[0]
    lens = _lens(seq_lens)
    bsz = lens.numel()
    cum = cum_seq_lens_q.to(torch.int64)
    lq = cum[1:] - cum[:-1]
    sum_q, hq, d = query.shape
    lmax = int(lens.max()) if bsz else 0
    qmax = int(lq.max()) if bsz else 0
    if uses_shared_paged_kv_idx:
        k_table = v_table = block_tables
    else:
        k_table, v_table = block_tables[:, 0], block_tables[:, 1]
    k, v = _gather_kv(kv_cache, kv_block_scales, kv_layout, k_table, v_table, lens, lmax)

    # Pad the ragged queries to [B, Qmax, Hq, D]; padded rows see nothing.
    i = torch.arange(qmax).view(1, -1)
    real_row = i < lq.view(-1, 1)
    src = torch.where(real_row, cum[:-1].view(-1, 1) + i, torch.zeros_like(i))
    q = torch.where(real_row[:, :, None, None], query.to(F64)[src], torch.zeros((), dtype=F64))
    if causal:
        pos = (lens - lq).view(-1, 1, 1) + i.view(1, -1, 1)  # [B, Qmax, 1]
    elif window_left >= 0:
        raise ValueError(f"window_left: causal=False takes no window (-1), got {window_left}")
    else:
        pos = (lens - 1).view(-1, 1, 1).expand(-1, qmax, 1)  # every row where the last one sits
    j = torch.arange(lmax).view(1, 1, -1)
    visible = (j <= pos) & real_row.unsqueeze(-1) & (j < lens.view(-1, 1, 1))
    if window_left >= 0:
        visible = visible & (pos - j <= window_left)
    scale = _num(bmm1_scale)
    f = skip_softmax_threshold_scale_factor
    if f:
        # Tiles are aligned at each request's first query row: decide per request, then pad.
        vis4 = torch.zeros(bsz, hq, qmax, lmax, dtype=torch.bool)
        for b in range(bsz):
            n, length = int(lq[b]), int(lens[b])
            if n == 0 or length == 0:
                continue
            hkv = k.shape[2]
            kb = k[b, :length].repeat_interleave(hq // hkv, dim=1)
            logits = torch.einsum("qhd,lhd->hql", q[b, :n], kb) * scale
            keep, _ = skip_softmax_kept_tiles(logits, visible[b, :n, :length], f / length, *skip_tile)
            vis4[b, :, :n, :length] = keep
        visible = vis4
    o, lse = _softmax_attention(q, k, v, visible, scale, sinks=sinks)
    out = torch.zeros(sum_q, hq, v.shape[-1], dtype=F64)
    out[src[real_row]] = o[real_row]
    if not return_lse:
        return out * _num(bmm2_scale)
    lse_out = torch.full((sum_q, hq), -math.inf, dtype=F64)
    lse_out[src[real_row]] = lse[real_row]
    return out * _num(bmm2_scale), lse_out
