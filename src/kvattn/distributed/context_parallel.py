"""The context-parallel decode functions (:func:`batch_decode`, :func:`mla_decode`,
:func:`single_decode`): each rank's local lengths (and draft mask) derived on the device, the local
kernel over its slice, then the merge across ranks (``exchange.py``)."""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch

from ..runtime import backend as _backend
from .. import decode, mla
from .._inputs import check_int, check_lse_out, check_sinks, check_tensor, check_window, check_workspace
from .exchange import _Buffers, _check_group, _check_out, _merge
from .sharding import PageSharding


def _local_lengths(sharding: PageSharding, lens: torch.Tensor, rank: int, lens_out: torch.Tensor, start_out,
                   window_left: int):
    """``(local lengths, window starts or None)`` of int32 global ``lens [B]``, into the buffers: the
    local index of a request's first key at global position ``>= L - 1 - window_left`` is the count
    of its tokens before that position this rank holds. One Triton launch on a GPU."""
    ops = _backend.triton_entry("local_lengths", lens.device)
    if ops is not None:
        world = sharding.world_size
        ops.local_lengths(
            lens.contiguous(), lens_out, start_out, window_left=window_left, page=sharding.page_size, world=world,
            rank=rank, span_tokens=(sharding.span_pages or 0) * sharding.page_size,
            round_robin=sharding.scheme == "round_robin", last=rank == world - 1)
        return lens_out, start_out
    sharding.local_seq_lens(lens, rank, out=lens_out)
    if start_out is not None:
        first = (lens.to(torch.int64) - 1 - window_left).clamp(min=0)  # global position of the first key seen
        sharding.local_seq_lens(first, rank, out=start_out)
    return lens_out, start_out


# ---------------------------------------------------------------------------------------------
# batch decode
# ---------------------------------------------------------------------------------------------
def _local_mask(mask: Optional[torch.Tensor], q_len: int, seq_lens: torch.Tensor, local_lens: torch.Tensor,
                sharding: PageSharding, rank: int, out: torch.Tensor) -> torch.Tensor:
    """uint16 ``[B, Q, words]`` draft mask of the local slice, written into ``out`` (int16): the
    local kernel takes the last ``Q`` local keys for the drafts; each is a global draft (its row's
    bit of ``mask``, or causal without one) or a key before the drafts (visible to every row)."""
    device = seq_lens.device
    slots = torch.arange(q_len, device=device)
    i = local_lens.to(torch.int64).unsqueeze(1) - q_len + slots  # [B, Q]: local index of draft slot c'
    c = sharding.global_positions(i.clamp(min=0), rank) - (seq_lens.to(torch.int64).unsqueeze(1) - q_len)
    rows = slots.view(1, q_len, 1)
    cc = c.clamp(0, q_len - 1).unsqueeze(1)  # [B, 1, Q]: its global draft index
    if mask is None:
        draft_ok = cc <= rows
    else:
        words = mask.to(torch.int64) & 0xFFFF  # [B, Q, W]
        word = torch.gather(words, 2, (cc // 16).expand(-1, q_len, -1))
        draft_ok = ((word >> (cc % 16)) & 1) == 1
    bits = ((c < 0).unsqueeze(1) | draft_ok) & (i >= 0).unsqueeze(1)  # [B, Q rows, Q slots]
    nwords = out.shape[-1]
    bits = torch.nn.functional.pad(bits.to(torch.int32), (0, nwords * 16 - q_len)).view(*bits.shape[:2], nwords, 16)
    packed = (bits << torch.arange(16, device=device, dtype=torch.int32)).sum(-1)  # < 2^16
    out.copy_(packed.to(torch.int16))  # (wraps to the uint16 bits)
    return out.view(torch.uint16)


def batch_decode(
    query: torch.Tensor,
    kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
    workspace_buffer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    *,
    sharding: PageSharding,
    group=None,
    bmm1_scale: Union[float, torch.Tensor] = 1.0,
    bmm2_scale: Union[float, torch.Tensor] = 1.0,
    window_left: int = -1,
    out: Optional[torch.Tensor] = None,
    sinks: Optional[torch.Tensor] = None,
    kv_layout: str = "NHD",
    enable_pdl: Optional[bool] = None,
    q_len_per_req: Optional[int] = 1,
    o_scale: Optional[float] = 1.0,
    mask: Optional[torch.Tensor] = None,
    kv_cache_sf=None,
    return_lse: bool = False,
    lse: Optional[torch.Tensor] = None,
    scatter_heads: bool = False,
    q_cu_seq_lens: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Context-parallel :func:`kvattn.decode.xqa_batch_decode_with_kv_cache`: every rank of
    ``group`` calls it with its own slice of the cache, and gets the whole result.

    Parameters
    ----------
    query : torch.Tensor ``[B * q_len_per_req, Hq, D]``
        The same on every rank.
    kv_cache, kv_cache_sf : this rank's page pool (any form the local function takes)
    workspace_buffer : torch.Tensor uint8
        The local call's workspace; its tail also holds the exchange buffers (about
        ``(2 + R) * rows * Hq * (D + 1) * 4`` bytes). Zeroed before first use; one call at a time.
    block_tables : torch.Tensor int32 ``[B, local pages]``
        This rank's table: local page ``i`` of request ``b`` (see :class:`PageSharding`) is page
        ``block_tables[b, i]`` of its pool.
    seq_lens : torch.Tensor int32 or uint32 ``[B]``
        The requests' *global* lengths, the same on every rank.
    max_seq_len : int
        Host bound of the global lengths.
    sharding : PageSharding
        How pages are spread (``world_size``: the group's size).
    group : torch.distributed.ProcessGroup, optional
        Default: the default group.
    bmm1_scale, bmm2_scale, enable_pdl, o_scale, kv_layout, q_len_per_req, mask
        As the local function; ``mask`` speaks of global draft positions (each rank derives its
        local draft mask on the device).
    window_left : int
        ``w >= 0``: keys at global positions ``>= L - 1 - w`` (``q_len_per_req == 1`` only).
    out : torch.Tensor ``[B * q_len_per_req, Hq, D]``, optional
        The query's dtype (default) or float32; ``Hq / R`` heads with ``scatter_heads``.
    sinks : torch.Tensor float32 ``[Hq]``, optional
        Counted once, in the merge.
    return_lse : bool
        Also return the merged base-2 LSE ``[B * q_len_per_req, Hq]`` (sinks excluded).
    lse : torch.Tensor float32, optional
        Where to write it (with ``return_lse``).
    scatter_heads : bool
        Rank ``r`` gets only heads ``r * Hq / R .. (r + 1) * Hq / R - 1`` (for a head-parallel next
        layer): one all-to-all of the states instead of the all-gather, ``R`` times fewer bytes in.
    q_cu_seq_lens : torch.Tensor int32 or uint32 ``[B + 1]``, optional
        Ragged drafts, as the local function's (FlashInfer 0.7.2.post1): ``query``, ``out``, the
        LSE and ``mask`` packed by these offsets. Run as the padded call (each request's rows at the
        end of its ``q_len_per_req`` slots, on the device) into temporaries, then gathered back.

    Returns
    -------
    torch.Tensor, and with ``return_lse`` the LSE.

    Notes
    -----
    Each rank runs the local decode (float32 output and LSE, no sinks), one all-gather of the packed
    ``(o, lse)`` (``R x rows x Hq x (D + 1)`` float32) and :func:`kvattn.merge_states` with the
    sinks. No host sync and, with ``out`` (and ``lse``) given, no allocation but small temporaries
    of the device-side length arithmetic: capture the call in a CUDA graph on every rank after one
    eager call (which creates the communicator and compiles the kernels).

    Examples
    --------
    >>> import torch, torch.distributed as dist, kvattn                        # doctest: +SKIP
    >>> dist.init_process_group("nccl")                                       # doctest: +SKIP
    >>> sh = kvattn.distributed.PageSharding(dist.get_world_size(), page_size=16)  # doctest: +SKIP
    >>> o = kvattn.distributed.batch_decode(q, my_pages, ws, my_tables, global_lens, max_len,
    ...                                     sharding=sh, bmm1_scale=128 ** -0.5)  # doctest: +SKIP
    """
    check_tensor(query, "query", ndim=3)
    rows, heads, dim = query.shape
    if q_cu_seq_lens is not None:
        return _ragged_batch_decode(
            query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, sharding=sharding, group=group,
            bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale, window_left=window_left, out=out, sinks=sinks,
            kv_layout=kv_layout, enable_pdl=enable_pdl, q_len_per_req=q_len_per_req, o_scale=o_scale, mask=mask,
            kv_cache_sf=kv_cache_sf, return_lse=return_lse, lse=lse, scatter_heads=scatter_heads,
            q_cu_seq_lens=q_cu_seq_lens)
    world, rank = _check_group(group, sharding, scatter_heads, heads)
    device = query.device
    q_len = 1 if q_len_per_req is None else check_int(q_len_per_req, "q_len_per_req", minimum=1)
    window_left = check_window(window_left)
    if window_left >= 0 and q_len > 1:
        raise ValueError("window_left: a window with q_len_per_req > 1 is not supported across ranks")
    check_tensor(seq_lens, "seq_lens", dtypes=(torch.int32, torch.uint32), device=device)
    check_workspace(workspace_buffer, "workspace_buffer", device)
    sinks = check_sinks(sinks, "sinks", heads, device)
    batch = seq_lens.numel()
    out_heads = heads // world if scatter_heads else heads
    out = _check_out(out, (rows, out_heads, dim), query.dtype, device)
    lse = check_lse_out(lse, return_lse, rows, out_heads, device)
    words = 2 * ((q_len + 31) // 32)
    bufs = _Buffers(workspace_buffer, device, world, rows, heads, dim, scatter_heads,
                    (4 * batch, 4 * batch, 2 * batch * q_len * words))
    lens_buf, start_buf, mask_buf = bufs.extra
    lens = seq_lens.reshape(batch)
    if lens.dtype == torch.uint32:
        lens = lens.view(torch.int32)
    local_lens, kv_start = _local_lengths(sharding, lens, rank, lens_buf.view(torch.int32),
                                          start_buf.view(torch.int32) if window_left >= 0 else None, window_left)
    local_mask = None
    if q_len > 1:
        if mask is not None:
            check_tensor(mask, "mask", dtypes=(torch.uint16,), device=device)
            if tuple(mask.shape) != (batch, q_len, words):
                raise ValueError(f"mask: expected shape {[batch, q_len, words]}, got {list(mask.shape)}")
        local_mask = _local_mask(mask, q_len, lens, local_lens, sharding, rank,
                                 mask_buf.view(torch.int16).view(batch, q_len, words))
    decode._batch_decode(
        query, kv_cache, bufs.rest, block_tables, local_lens, sharding.local_max_seq_len(max_seq_len, rank),
        bmm1_scale, bmm2_scale, -1, bufs.part_o, None, kv_layout, enable_pdl, q_len, o_scale, local_mask,
        kv_cache_sf, return_lse=True, lse=bufs.part_lse, kv_start=kv_start, local_slice=True,
    )
    return _merge(bufs, group, world, rank, sinks, out, lse, scatter_heads, return_lse)


def _ragged_batch_decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, *, sharding, group,
                         mask, out, lse, return_lse, q_cu_seq_lens, q_len_per_req, scatter_heads, **kw):
    """:func:`batch_decode` with ``q_cu_seq_lens``: the padded call, its rows gathered back."""
    from ..ops.decode import ragged

    rows, heads, dim = query.shape
    device = query.device
    world, _ = _check_group(group, sharding, scatter_heads, heads)
    q_len = 1 if q_len_per_req is None else check_int(q_len_per_req, "q_len_per_req", minimum=1)
    check_tensor(seq_lens, "seq_lens", dtypes=(torch.int32, torch.uint32), device=device)
    batch = seq_lens.numel()
    check_tensor(q_cu_seq_lens, "q_cu_seq_lens", dtypes=(torch.int32, torch.uint32), ndim=1, device=device)
    if tuple(q_cu_seq_lens.shape) != (batch + 1,):
        raise ValueError(f"q_cu_seq_lens: expected shape [{batch + 1}], got {list(q_cu_seq_lens.shape)}")
    words = 2 * ((q_len + 31) // 32)
    if mask is not None:
        check_tensor(mask, "mask", dtypes=(torch.uint16,), device=device)
        if tuple(mask.shape) != (rows, words):
            raise ValueError(f"mask: expected shape {[rows, words]}, got {list(mask.shape)}")
    out_heads = heads // world if scatter_heads else heads
    out = _check_out(out, (rows, out_heads, dim), query.dtype, device)
    lse = check_lse_out(lse, return_lse, rows, out_heads, device)
    if rows and batch:
        src, dst = ragged.row_maps(q_cu_seq_lens, batch, q_len, rows)
        window_left = kw.get("window_left", -1)
        padded_mask = None
        if mask is not None or (window_left >= 0 and q_len > 1):
            padded_mask = ragged.padded_mask(mask, q_cu_seq_lens, src, batch, q_len, window_left)
        o_pad = torch.empty((batch * q_len, out_heads, dim), dtype=out.dtype, device=device)  # (out's dtype)
        got = batch_decode(query.index_select(0, src), kv_cache, workspace_buffer, block_tables, seq_lens,
                           max_seq_len, sharding=sharding, group=group, q_len_per_req=q_len, mask=padded_mask,
                           out=o_pad, return_lse=lse is not None, scatter_heads=scatter_heads, **kw)
        o_pad, lse_pad = got if lse is not None else (got, None)
        out.copy_(o_pad.index_select(0, dst))
        if lse is not None:
            lse.copy_(lse_pad.index_select(0, dst))
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# MLA decode
# ---------------------------------------------------------------------------------------------
def mla_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    *,
    sharding: PageSharding,
    group=None,
    out: Optional[torch.Tensor] = None,
    bmm1_scale: Union[float, torch.Tensor] = 1.0,
    bmm2_scale: Union[float, torch.Tensor] = 1.0,
    return_lse: bool = False,
    lse: Optional[torch.Tensor] = None,
    scatter_heads: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Context-parallel :func:`kvattn.mla.xqa_batch_decode_with_kv_cache_mla` (kv_lora_rank 512,
    rope dim 64): every rank calls it with its own pages of the latent cache.

    Parameters
    ----------
    query : torch.Tensor ``[B, Q, Hq, 576]``, the same on every rank
        ``Q`` 1 to 4 query tokens a request; token ``r`` sees the keys at global positions
        ``0 .. L - Q + r`` (as the local function).
    kv_cache : this rank's latent pool ``[P, page_size, 576]`` (or ``[P, 1, page_size, 576]``)
    workspace_buffer, block_tables, seq_lens, max_seq_len, sharding, group, scatter_heads
        As :func:`batch_decode`.
    out : torch.Tensor ``[B, Hq, 512]`` (``Q = 1``; ``[B, 1, Hq, 512]`` also accepted) or ``[B, Q, Hq, 512]``, optional
        bfloat16 (default) or float32; ``Hq / R`` heads with ``scatter_heads``. Its token and head
        dims must fold into one.
    bmm1_scale, bmm2_scale : float or one-element float32 tensor
    return_lse : bool
        Also return the merged base-2 LSE ``[B, Hq]`` (``[B, Q, Hq]`` with a 4-D ``out``).
    lse : torch.Tensor float32, the LSE's shape, optional

    Returns
    -------
    torch.Tensor ``[B, Hq, 512]`` or ``[B, Q, Hq, 512]``, and with ``return_lse`` the LSE.

    Notes
    -----
    A rank holds an arbitrary subset of a request's last keys, so with ``Q > 1`` the local call
    runs once a token (each with the local count of the keys its token sees): ``Q`` reads of the
    local pages instead of one.
    """
    check_tensor(query, "query", ndim=4)
    batch, q_len, heads, _ = query.shape
    if not 1 <= q_len <= mla.MAX_Q_LEN:
        raise ValueError(f"query: expected q_len_per_request 1 to {mla.MAX_Q_LEN} (shape [B, Q, Hq, 576]), "
                         f"got {list(query.shape)}")
    world, rank = _check_group(group, sharding, scatter_heads, heads)
    device = query.device
    check_tensor(seq_lens, "seq_lens", dtypes=(torch.int32, torch.uint32), device=device)
    check_workspace(workspace_buffer, "workspace_buffer", device)
    dim = mla.KV_LORA_RANK
    out_heads = heads // world if scatter_heads else heads
    four_d = q_len > 1 or (isinstance(out, torch.Tensor) and out.dim() == 4)
    token_dims = (batch, q_len) if four_d else (batch,)
    out = _check_out(out, (*token_dims, out_heads, dim), torch.bfloat16, device)
    lse = check_lse_out(lse, return_lse, batch, out_heads, device, shape=(*token_dims, out_heads))
    rows = batch * q_len
    for t, name in ((out, "out"), (lse, "lse")):
        if t is not None and q_len > 1 and t.stride(1) != out_heads * t.stride(2):
            raise ValueError(f"{name}: expected its token and head dims to fold into one (stride(1) == "
                             f"{out_heads} * stride(2)), got strides {list(t.stride())}")
    bufs = _Buffers(workspace_buffer, device, world, rows, heads, dim, scatter_heads, (4 * batch * (q_len + 1),))
    lens = seq_lens.reshape(batch)
    if lens.dtype == torch.uint32:
        lens = lens.view(torch.int32)
    counts = bufs.extra[0].view(torch.int32)
    part_o = bufs.part_o.view(batch, q_len, heads, dim)
    part_lse = bufs.part_lse.view(batch, q_len, heads)
    local_max = sharding.local_max_seq_len(max_seq_len, rank)
    for r in range(q_len):  # (tokens, not requests: at most MAX_Q_LEN local calls)
        # Token r sees the first L - (Q - 1 - r) global keys (none below 0): their local count.
        seen = lens if r == q_len - 1 else (lens - (q_len - 1 - r)).clamp(min=0)
        local_lens, _ = _local_lengths(sharding, seen, rank, counts[r * batch : (r + 1) * batch], None, -1)
        mla.xqa_batch_decode_with_kv_cache_mla(
            query[:, r : r + 1], kv_cache, bufs.rest, mla.QK_NOPE_HEAD_DIM, dim, mla.QK_ROPE_HEAD_DIM, block_tables,
            local_lens, local_max, out=part_o[:, r], bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale,
            return_lse=True, lse=part_lse[:, r],
        )
    _merge(bufs, group, world, rank, None, out.view(rows, out_heads, dim),
           lse.view(rows, out_heads) if lse is not None else None, scatter_heads, return_lse)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# single decode
# ---------------------------------------------------------------------------------------------
_SLOPES: dict = {}


def _alibi_slopes(heads: int, device) -> torch.Tensor:
    key = (heads, device)
    if key not in _SLOPES:
        from ..reference.decode import alibi_slopes

        _SLOPES[key] = alibi_slopes(heads, device)
    return _SLOPES[key]


def single_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kv_offset: int,
    total_len: int,
    group=None,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    return_lse: bool = False,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
    workspace_buffer: Optional[torch.Tensor] = None,
    scatter_heads: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Context-parallel :func:`kvattn.decode.single_decode_with_kv_cache`: each rank holds a
    contiguous run of the sequence's keys (e.g. :func:`shard_range`).

    Parameters
    ----------
    q : torch.Tensor ``[Hq, D]``, the same on every rank
    k, v : torch.Tensor ``[n, Hkv, D]`` (NHD) or ``[Hkv, n, D]`` (HND)
        This rank's keys and values: global positions ``kv_offset .. kv_offset + n - 1`` (``n``
        may be 0).
    kv_offset : int
        Global position of this rank's first key.
    total_len : int
        The sequence's global length ``L`` (the query sits at ``L - 1``).
    group : torch.distributed.ProcessGroup, optional
    kv_layout, use_tensor_cores, q_scale, k_scale, v_scale, logits_soft_cap, sm_scale
        As the local function.
    pos_encoding_mode : {"NONE", "ALIBI"}
        ALiBi biases by global positions (not with ``logits_soft_cap``). ``ROPE_LLAMA`` is not
        supported across ranks: rotate the keys before caching them.
    window_left : int
        ``w >= 0``: keys at global positions ``>= L - 1 - w``.
    return_lse : bool
        Also return the merged base-2 LSE ``[Hq]``.
    out : torch.Tensor ``[Hq, D]`` (``[Hq / R, D]`` with ``scatter_heads``), optional
        q's dtype (default) or float32.
    lse : torch.Tensor float32, optional
    workspace_buffer : torch.Tensor uint8, optional
        Holds the exchange buffers (about ``(2 + R) * Hq * (D + 1) * 4`` bytes); allocated each
        call without one.
    scatter_heads : bool
        As :func:`batch_decode`.

    Returns
    -------
    torch.Tensor, and with ``return_lse`` the LSE.
    """
    check_tensor(q, "q", ndim=2)
    heads, dim = q.shape
    world, rank = _check_group(group, None, scatter_heads, heads)
    device = q.device
    check_int(kv_offset, "kv_offset", minimum=0)
    check_int(total_len, "total_len", minimum=0)
    check_tensor(k, "k", ndim=3, device=device)
    length = k.shape[0] if kv_layout == "NHD" else k.shape[1]
    if kv_offset + length > total_len:
        raise ValueError(f"total_len: expected at least kv_offset + this rank's keys = {kv_offset + length}, "
                         f"got {total_len}")
    window_left = check_window(window_left)
    mode = pos_encoding_mode.upper() if isinstance(pos_encoding_mode, str) else pos_encoding_mode
    if mode not in ("NONE", "ALIBI"):
        raise ValueError(f"pos_encoding_mode: expected 'NONE' or 'ALIBI' across ranks, got {pos_encoding_mode!r}")
    if mode == "ALIBI" and logits_soft_cap:
        raise ValueError("logits_soft_cap: not supported with ALIBI across ranks (the cap does not commute with "
                         "the bias offset)")
    if workspace_buffer is not None:  # (exchange buffers only: no fixed head)
        check_workspace(workspace_buffer, "workspace_buffer", device, minimum=0)
    out_heads = heads // world if scatter_heads else heads
    out = _check_out(out, (out_heads, dim), q.dtype, device)
    lse = check_lse_out(lse, return_lse, 1, out_heads, device, shape=(out_heads,))
    bufs = _Buffers(workspace_buffer, device, world, 1, heads, dim, scatter_heads)
    lo = max(0, total_len - 1 - window_left - kv_offset) if window_left >= 0 else 0
    if lo >= length:  # no key of this rank is seen: an empty state
        bufs.part_o.zero_()
        bufs.part_lse.fill_(float("-inf"))
    else:
        k_seen, v_seen = (k[lo:], v[lo:]) if kv_layout == "NHD" else (k[:, lo:], v[:, lo:])
        decode.single_decode_with_kv_cache(
            q, k_seen, v_seen, kv_layout, mode, use_tensor_cores, q_scale, k_scale, v_scale, -1, logits_soft_cap,
            sm_scale, return_lse=True, out=bufs.part_o[0], lse=bufs.part_lse[0],
        )
        if mode == "ALIBI" and kv_offset + lo:
            # The local kernel biases key i by slope * i; its global position is kv_offset + lo + i:
            # every logit of this rank is short of slope * (kv_offset + lo), which moves only the LSE.
            bufs.part_lse[0].add_(_alibi_slopes(heads, device), alpha=(kv_offset + lo) * _LOG2E)
    out_rows = out.unsqueeze(0)
    lse_rows = lse.unsqueeze(0) if lse is not None else None
    result = _merge(bufs, group, world, rank, None, out_rows, lse_rows, scatter_heads, return_lse)
    return (out, lse) if return_lse else out


_LOG2E = 1.0 / math.log(2.0)
