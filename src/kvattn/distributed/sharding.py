"""Sharding a paged cache over the ranks of a group: :class:`PageSharding` (which rank holds each
logical page, and at which local index), :func:`shard_range` (a contiguous share of tokens) and
:func:`shard_kv_cache` (a rank's own pool and table cut from a global cache). The schemes:
``docs/distributed.md``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .._inputs import check_int

SCHEMES = ("round_robin", "contiguous")


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
