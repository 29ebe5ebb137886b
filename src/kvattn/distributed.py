"""Context-parallel decode: one sequence's KV cache spread over the ranks of a process group.

Each rank holds a slice of every request's keys, attends over it with kvattn's local kernels
(with ``return_lse``, float32 outputs, no sinks), and the ranks exchange their partial states
``(o, lse)`` in one collective and merge them exactly (:func:`kvattn.merge_states`), the sinks
counted once in the merge. The exchange moves ``rows x heads x (D + 1)`` float32 values a rank,
small next to the KV bytes each rank reads.

Works over any ``torch.distributed`` process group (NCCL for CUDA tensors, gloo for CPU ones) of
any size. Sharding, calls and CUDA-graph capture: ``docs/distributed.md``.

Sharding a paged cache (:class:`PageSharding`). A request's *logical* page ``p`` (tokens
``p * page_size ..``) lives on one rank, at a *local* page index there; each rank's page table
lists its own pages in local order (``block_tables[b, i]`` = its pool's id of local page ``i``).

* ``"round_robin"``: page ``p`` on rank ``p % R`` at local index ``p // R``. Balanced at every
  length within one page, and a page never moves as the request grows (the new token goes to
  the rank that owns its page): the scheme for decode, where sequences grow.
* ``"contiguous"``: ranks ``0 .. R-2`` hold ``span_pages`` pages each (rank ``r`` pages
  ``r * span .. (r + 1) * span - 1``), the last rank all the pages past them. Keeps each rank's
  keys contiguous in position, so a window touches one or two ranks only: for a long prompt
  spread once (``span_pages = ceil(pages / R)``), with later tokens appended on the last rank.

All calls take the *global* ``seq_lens`` (the same on every rank; each rank derives its local
lengths on the device, without a host sync) and a global host bound ``max_seq_len``.

Example (one process standing for both ranks of a 2-rank group; each rank computes its state
with :meth:`PageSharding.local_seq_lens` and the local kernel, then the states merge):

>>> import torch, kvattn
>>> from kvattn.distributed import PageSharding
>>> sh = PageSharding(world_size=2, page_size=16)
>>> lens = torch.tensor([40, 0, 17], dtype=torch.int32)
>>> [sh.local_seq_lens(lens, r).tolist() for r in range(2)]
[[24, 0, 16], [16, 0, 1]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist

from .runtime import backend as _backend
from . import decode, mla
from ._inputs import (
    cached_aliases, check_int, check_lse_out, check_sinks, check_tensor, check_window, check_workspace,
)
from .merge import merge_states

SCHEMES = ("round_robin", "contiguous")
_ALIGN = 256  # bytes: every buffer carved from a workspace starts on such a boundary


# ---------------------------------------------------------------------------------------------
# sharding
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PageSharding:
    """Which rank holds each logical page of a request, and where.

    Parameters
    ----------
    world_size : int
        Ranks in the group.
    page_size : int
        Tokens a page.
    scheme : {"round_robin", "contiguous"}
        See the module notes: round robin for growing (decode) sequences, contiguous spans for a
        long prompt laid out once.
    span_pages : int, optional
        ``"contiguous"`` only: pages each of ranks ``0 .. R-2`` holds (the last holds the rest).

    Examples
    --------
    >>> from kvattn.distributed import PageSharding
    >>> rr = PageSharding(world_size=4, page_size=16)
    >>> [rr.owner(p) for p in range(6)], [rr.local_page(p) for p in range(6)]
    ([0, 1, 2, 3, 0, 1], [0, 0, 0, 0, 1, 1])
    >>> spans = PageSharding(world_size=2, page_size=16, scheme="contiguous", span_pages=3)
    >>> [spans.owner(p) for p in range(6)], spans.local_max_seq_len(100, 0), spans.local_max_seq_len(100, 1)
    ([0, 0, 0, 1, 1, 1], 48, 52)
    """

    world_size: int
    page_size: int
    scheme: str = "round_robin"
    span_pages: Optional[int] = None

    def __post_init__(self):
        check_int(self.world_size, "world_size", minimum=1)
        check_int(self.page_size, "page_size", minimum=1)
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme: expected one of {SCHEMES}, got {self.scheme!r}")
        if self.scheme == "contiguous":
            if self.span_pages is None:
                raise ValueError("span_pages: the contiguous scheme needs the pages each rank holds (got None)")
            check_int(self.span_pages, "span_pages", minimum=1)
        elif self.span_pages is not None:
            raise ValueError(f"span_pages: only for scheme='contiguous', got {self.span_pages} with {self.scheme!r}")

    # -- logical pages ------------------------------------------------------------------------
    def owner(self, page: int) -> int:
        """The rank holding logical page ``page``."""
        if self.scheme == "round_robin":
            return page % self.world_size
        return min(page // self.span_pages, self.world_size - 1)

    def local_page(self, page: int) -> int:
        """Logical page ``page``'s index in its owner's page table."""
        if self.scheme == "round_robin":
            return page // self.world_size
        return page - self.owner(page) * self.span_pages

    def local_columns(self, rank: int, pages_per_seq: int) -> range:
        """The global page-table columns (logical pages) ``rank`` holds, in local order."""
        self._check_rank(rank)
        if self.scheme == "round_robin":
            return range(rank, pages_per_seq, self.world_size)
        lo = min(rank * self.span_pages, pages_per_seq)
        hi = pages_per_seq if rank == self.world_size - 1 else min(lo + self.span_pages, pages_per_seq)
        return range(lo, hi)

    def local_block_tables(self, block_tables: torch.Tensor, rank: int) -> torch.Tensor:
        """``rank``'s columns of a global table ``[B, pages_per_seq]``, a view (page ids unchanged:
        for one pool shared by every rank, as in tests; a real rank's table indexes its own pool)."""
        cols = self.local_columns(rank, block_tables.shape[-1])
        return block_tables[..., cols.start : cols.stop : cols.step]

    # -- lengths ------------------------------------------------------------------------------
    def local_seq_lens(self, seq_lens: torch.Tensor, rank: int, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """int32 ``[B]``: how many of each request's ``seq_lens`` first tokens ``rank`` holds.

        The same count of a position ``T`` instead of a length is the local index of the first key
        at global position ``>= T`` (windows use it). Device ops only (no host sync); ``out``:
        int32 ``[B]`` to write into.
        """
        self._check_rank(rank)
        lens = seq_lens.to(torch.int64)
        page, world = self.page_size, self.world_size
        if self.scheme == "round_robin":
            full = torch.div(lens, page, rounding_mode="floor")
            count = torch.div(full + (world - 1 - rank), world, rounding_mode="floor") * page
            tail = torch.where(torch.remainder(full, world) == rank, lens - full * page, 0)
            local = count + tail
        else:
            start = rank * self.span_pages * page
            local = (lens - start).clamp(min=0)
            if rank < world - 1:
                local = local.clamp(max=self.span_pages * page)
        if out is None:
            return local.to(torch.int32)
        return out.copy_(local)

    def local_max_seq_len(self, max_seq_len: int, rank: int) -> int:
        """A host bound of ``rank``'s local lengths when every global length is ``<= max_seq_len``."""
        self._check_rank(rank)
        page, world = self.page_size, self.world_size
        if self.scheme == "round_robin":
            pages = -(-max_seq_len // page)
            return min(max_seq_len, ((pages + world - 1 - rank) // world) * page)
        local = max(max_seq_len - rank * self.span_pages * page, 0)
        return local if rank == world - 1 else min(local, self.span_pages * page)

    def global_positions(self, local_index: torch.Tensor, rank: int) -> torch.Tensor:
        """int64: the global position of each local token index ``local_index`` (>= 0) of ``rank``."""
        i = local_index.to(torch.int64)
        if self.scheme == "round_robin":
            lp = torch.div(i, self.page_size, rounding_mode="floor")
            return (lp * self.world_size + rank) * self.page_size + (i - lp * self.page_size)
        return i + rank * self.span_pages * self.page_size

    def _check_rank(self, rank: int) -> None:
        check_int(rank, "rank", minimum=0)
        if rank >= self.world_size:
            raise ValueError(f"rank: expected < world_size={self.world_size}, got {rank}")


def shard_range(length: int, world_size: int, rank: int) -> Tuple[int, int]:
    """``(start, stop)``: ``rank``'s contiguous share of ``length`` tokens, the shares as even as
    whole tokens allow (the first ``length % world_size`` ranks one token more).

    >>> from kvattn.distributed import shard_range
    >>> [shard_range(10, 4, r) for r in range(4)]
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    base, extra = divmod(length, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def shard_kv_cache(kv_cache, block_tables: torch.Tensor, seq_lens: torch.Tensor, sharding: PageSharding, rank: int,
                   *, kv_layout: str = "NHD", extra_pages: int = 1, pages_per_seq: Optional[int] = None):
    """``(local_kv_cache, local_block_tables)``: ``rank``'s own pool and table cut from a global
    paged cache (for tests, examples and loading a cache laid out on one device).

    ``kv_cache``: a tensor whose dim 0 indexes pages (any of kvattn's single-tensor forms, an MLA
    latent cache) or a ``(K, V)`` tuple of them; ``block_tables [B, pages]`` its global table.
    The local pool holds the pages ``rank`` owns (the first ``seq_lens[b]`` tokens of each
    request; host reads: not for the hot path) plus ``extra_pages`` unused ones filled with
    NaN, the local table ``pages_per_seq`` columns (default: enough, plus one), unused entries -1.
    """
    lens = seq_lens.to(torch.int64).cpu().tolist()
    tables = block_tables.to(torch.int64).cpu()
    page = sharding.page_size
    picks, rows = [], []
    for b, n in enumerate(lens):
        need = -(-n // page)
        row = [tables[b, p].item() for p in sharding.local_columns(rank, need)]
        rows.append(list(range(len(picks), len(picks) + len(row))))
        picks.extend(row)
    width = pages_per_seq if pages_per_seq is not None else max([len(r) for r in rows] + [0]) + 1
    local = torch.full((len(lens), width), -1, dtype=torch.int32)
    for b, r in enumerate(rows):
        local[b, : len(r)] = torch.tensor(r, dtype=torch.int32)

    def cut(pool: torch.Tensor) -> torch.Tensor:
        index = torch.tensor(picks, dtype=torch.int64, device=pool.device)
        taken = pool.index_select(0, index)
        pad = torch.full((extra_pages, *pool.shape[1:]), float("nan"), device=pool.device).to(pool.dtype) \
            if pool.dtype.is_floating_point else torch.zeros((extra_pages, *pool.shape[1:]), dtype=pool.dtype,
                                                             device=pool.device)
        return torch.cat((taken, pad))

    out = tuple(cut(t) for t in kv_cache) if isinstance(kv_cache, (tuple, list)) else cut(kv_cache)
    return out, local.to(block_tables.device)


# ---------------------------------------------------------------------------------------------
# the exchange
# ---------------------------------------------------------------------------------------------
def _group_info(group) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("kvattn.distributed: torch.distributed is not initialised (init_process_group first)")
    return dist.get_world_size(group), dist.get_rank(group)


_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _carve(workspace: torch.Tensor, sizes: tuple) -> tuple:
    """Byte ranges ``sizes`` (in order) cut from the end of ``workspace``, each ``_ALIGN``-aligned,
    and the part before them; views kept per workspace tensor (building them costs host time)."""
    return cached_aliases(workspace, ("kvattn.distributed",) + sizes, _carve_views, sizes)


def _carve_views(workspace: torch.Tensor, sizes: tuple) -> tuple:
    end = workspace.numel()
    base = workspace.data_ptr()
    views = []
    for size in sizes:
        start = end - size
        start -= (base + start) % _ALIGN
        if start < 0:
            raise ValueError(f"workspace_buffer: too small for the context-parallel buffers "
                             f"({sum(sizes)} bytes after the local call's own; got {workspace.numel()})")
        views.append(workspace[start : start + size])
        end = start
    return (workspace[:end], *views)


def _exchange_and_merge(local: torch.Tensor, send: torch.Tensor, recv: torch.Tensor, group, world: int, rows: int,
                        heads: int, dim: int, sinks, out: torch.Tensor, out_lse, scatter_heads: bool):
    """All-gather of the packed local state ``local`` (float32 ``[rows * heads * dim | rows * heads]``)
    or, with ``scatter_heads``, all-to-all of ``send`` (the state laid out by destination, see
    :func:`_pack_for_heads`); then the exact merge into ``out`` / ``out_lse``."""
    if not scatter_heads:
        _ALL_GATHER(recv, local, group=group)
        per, hr = local.numel(), heads
    else:
        dist.all_to_all_single(recv, send, group=group)
        per, hr = send.numel() // world, heads // world
    o_all = recv.as_strided((world, rows, hr, dim), (per, hr * dim, dim, 1))
    lse_all = recv.as_strided((world, rows, hr), (per, hr, 1), recv.storage_offset() + rows * hr * dim)
    return merge_states(o_all, lse_all, out=out, out_lse=out_lse, sinks=sinks)


def _pack_for_heads(part_o: torch.Tensor, part_lse: torch.Tensor, send: torch.Tensor, world: int) -> None:
    """Lay the local state out by destination rank: segment ``j`` holds heads ``j * H/R ..`` of
    every row, outputs then LSEs (the all-to-all sends segment ``j`` to rank ``j``)."""
    rows, heads, dim = part_o.shape
    hr = heads // world
    per = send.numel() // world
    send.as_strided((world, rows, hr, dim), (per, hr * dim, dim, 1)).copy_(
        part_o.view(rows, world, hr, dim).transpose(0, 1))
    send.as_strided((world, rows, hr), (per, hr, 1), send.storage_offset() + rows * hr * dim).copy_(
        part_lse.view(rows, world, hr).transpose(0, 1))


class _Buffers:
    """The float32 buffers of one call: ``local`` (the local state, ``part_o [rows, heads, dim]``
    then ``part_lse [rows, heads]``; sent as is by the all-gather), ``send`` (the state by
    destination, with ``scatter_heads``), ``recv`` (every rank's states), and ``extra`` byte
    buffers; carved from the end of a workspace (``rest``: what precedes them), or allocated."""

    def __init__(self, workspace, device, world: int, rows: int, heads: int, dim: int, scatter: bool,
                 extra: tuple = ()):
        n = rows * heads * (dim + 1)
        sizes = (4 * n, 4 * n if scatter else 0, 4 * n * (1 if scatter else world), *extra)
        if workspace is None:
            self.rest = None
            views = [torch.empty(size, dtype=torch.uint8, device=device) for size in sizes]
        else:
            self.rest, *views = _carve(workspace, sizes)
        local, send, recv, *self.extra = views
        self.local = local.view(torch.float32)
        self.part_o = self.local[: rows * heads * dim].view(rows, heads, dim)
        self.part_lse = self.local[rows * heads * dim :].view(rows, heads)
        self.send = send.view(torch.float32)
        self.recv = recv.view(torch.float32)


def _check_out(out, shape: tuple, dtype, device, name: str = "out"):
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_tensor(out, name, dtypes=(dtype, torch.float32), device=device, contiguous_last=True)
    if tuple(out.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(out.shape)}")
    return out


def _check_group(group, sharding, scatter_heads: bool, heads: int) -> Tuple[int, int]:
    world, rank = _group_info(group)
    if sharding is not None:
        if not isinstance(sharding, PageSharding):
            raise TypeError(f"sharding: expected a PageSharding, got {type(sharding).__name__}")
        if sharding.world_size != world:
            raise ValueError(f"sharding: expected world_size {world} (the group's), got {sharding.world_size}")
    if not isinstance(scatter_heads, bool):
        raise TypeError(f"scatter_heads: expected a bool, got {type(scatter_heads).__name__}")
    if scatter_heads and heads % world:
        raise ValueError(f"scatter_heads: the {heads} heads must split evenly over the {world} ranks")
    return world, rank


def _merge(bufs: _Buffers, group, world: int, rank: int, sinks, out, lse, scatter_heads: bool, return_lse: bool):
    rows, heads, dim = bufs.part_o.shape
    if scatter_heads:
        _pack_for_heads(bufs.part_o, bufs.part_lse, bufs.send, world)
        if sinks is not None:
            hr = heads // world
            sinks = sinks[rank * hr : (rank + 1) * hr]
    out, lse_out = _exchange_and_merge(bufs.local, bufs.send, bufs.recv, group, world, rows, heads, dim, sinks, out,
                                       lse, scatter_heads)
    return (out, lse_out) if return_lse else out


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
    from .ops.decode import ragged

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
        from .reference.decode import alibi_slopes

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

__all__ = ["PageSharding", "shard_range", "shard_kv_cache", "batch_decode", "mla_decode", "single_decode"]
