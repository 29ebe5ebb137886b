"""The paged cache model: every input form the public functions accept (NHD or HND pages, a
``(K, V)`` tuple or one tensor with a size-2 / size-1 plane, xqa's flat pool of head vectors, split
K/V page tables, MLA's latent cache) normalised into one :class:`PagedKV` of strided views (never
copies), and the host checks of a cache against a call (heads, ``max_seq_len``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._formats_table import BY_DTYPE, DTYPES, FORMATS
from .aliases import cached_aliases
from .checks import _dtype_names, check_half_match, check_int, check_layout, check_query_heads, check_tensor


@dataclass(slots=True)
class PagedKV:
    """K and V pages as ``[num_pages, page_size, num_kv_heads, stored_dim]`` strided views.

    ``stored_dim`` is ``head_dim`` for fp16/bf16/fp8 caches and ``head_dim / 2`` for NVFP4 (uint8,
    two codes a byte; ``k_sf``/``v_sf`` then hold the e4m3 block scales
    ``[num_pages, page_size, num_kv_heads, head_dim / 16]``). ``k_table``/``v_table`` are int32
    ``[batch, pages_per_seq]`` (the same tensor when K and V share page ids). MLA's V is a view of
    the first ``v_dim`` columns of K.
    """

    k: torch.Tensor
    v: torch.Tensor
    k_table: torch.Tensor
    v_table: torch.Tensor
    head_dim: int
    v_dim: int
    k_sf: torch.Tensor | None = None
    v_sf: torch.Tensor | None = None

    @property
    def kv_format(self) -> str:
        """The cache format's name (``"float16"``, ``"bfloat16"``, ``"fp8"``, ``"nvfp4"``: the format
        table, :mod:`kvattn._formats_table`)."""
        return BY_DTYPE[self.k.dtype].name

    @property
    def page_size(self) -> int:
        return self.k.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def num_pages(self) -> int:
        return self.k.shape[0]

    @property
    def pages_per_seq(self) -> int:
        return self.k_table.shape[1]

    @property
    def capacity(self) -> int:
        """Tokens a request can hold: pages_per_seq * page_size."""
        return self.pages_per_seq * self.page_size


def _to_nhd(pages: torch.Tensor, layout: str) -> torch.Tensor:
    """``[P, page, H, D]`` view of a 4-D page tensor in ``layout``."""
    return pages if layout == "NHD" else pages.transpose(1, 2)


def _planes(kv_cache: torch.Tensor, layout: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a ``[P, 2 or 1, ...]`` cache (as NHD when ``layout`` is given)."""
    k, v = kv_cache.unbind(1) if kv_cache.shape[1] == 2 else (kv_cache[:, 0],) * 2
    return (k, v) if layout is None else (_to_nhd(k, layout), _to_nhd(v, layout))


def _split_kv(kv_cache, name: str, layout: str | None = None):
    """``(k, v)`` 4-D page tensors from a tuple or from one 5-D tensor with a size-2/1 plane; as
    NHD views when ``layout`` is given."""
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise ValueError(f"{name}: expected a (k_cache, v_cache) pair, got {len(kv_cache)} tensors")
        k, v = kv_cache
        check_tensor(k, f"{name}[0]", ndim=4)
        check_tensor(v, f"{name}[1]", ndim=4)
        if layout is None or layout == "NHD":
            return k, v
        return cached_aliases(k, ("nhd",), _to_nhd, layout), cached_aliases(v, ("nhd",), _to_nhd, layout)
    check_tensor(kv_cache, name, ndim=5)
    if kv_cache.shape[1] not in (1, 2):
        raise ValueError(
            f"{name}: expected dim 1 of size 2 (K, V) or 1 (K = V) after the page dim, got shape {list(kv_cache.shape)}"
        )
    return cached_aliases(kv_cache, ("planes",), _planes, layout)


def paged_kv_from_cache(
    kv_cache,
    block_tables: torch.Tensor,
    kv_layout: str,
    head_dim: int,
    device,
    *,
    kv_sf=None,
    name: str = "kv_cache",
    table_name: str = "block_tables",
    sf_name: str = "kv_cache_sf",
    split_tables: bool = False,
    allowed_dtypes=DTYPES,
    query_dtype=None,
    query_name: str = "query",
) -> PagedKV:
    """Normalise the decode/prefill cache forms (tuple or 5-D, NHD or HND) into a :class:`PagedKV`.

    ``allowed_dtypes``: the cache dtypes accepted, the format table's by default. A dtype outside
    the table (the append's float32 caches, :mod:`kvattn.cache`) is stored as it is: last dim
    ``head_dim``, no block scales. ``query_dtype``: a 16-bit cache of the other 16-bit dtype is
    reported against ``query_name`` (:func:`check_half_match`)."""
    layout = check_layout(kv_layout)
    k, v = _split_kv(kv_cache, name, layout)  # as NHD: the checks below read no layout-dependent dim
    # Planes of one 5-D tensor share its dtype, device and last dim: checking K checks V.
    for t in (k, v) if isinstance(kv_cache, (tuple, list)) else (k,):
        if query_dtype is not None and t is k and t.dtype not in allowed_dtypes:  # (V differing from K: K vs V)
            check_half_match(query_dtype, query_name, t.dtype, name)
        check_tensor(t, name, dtypes=allowed_dtypes, device=device, contiguous_last=True)
    dtype, shape = k.dtype, k.shape
    if dtype != v.dtype:
        raise TypeError(f"{name}: expected K and V of one dtype, got {dtype} and {v.dtype}")
    if shape != v.shape:
        raise ValueError(f"{name}: expected K and V pages of one shape, got {list(shape)} and {list(v.shape)} (as NHD)")
    fmt = BY_DTYPE.get(dtype)
    stored = fmt.stored_dim(head_dim) if fmt is not None else head_dim
    if shape[3] != stored:
        per = head_dim // max(stored, 1)
        what = f"head_dim = {head_dim}" if per == 1 else (
            f"head_dim / {per} = {stored} ({fmt.name.upper()} packs {per} values a byte)")
        raise ValueError(f"{name}: expected a last dim of {what}, got {shape[3]}")

    check_tensor(block_tables, table_name, dtypes=(torch.int32,), device=device)
    if split_tables:
        if block_tables.dim() != 3 or block_tables.shape[1] != 2:
            raise ValueError(
                f"{table_name}: expected shape [batch, 2, pages_per_seq] with uses_shared_paged_kv_idx=False, "
                f"got {list(block_tables.shape)}"
            )
        k_table, v_table = block_tables[:, 0], block_tables[:, 1]
    else:
        if block_tables.dim() != 2:
            raise ValueError(f"{table_name}: expected shape [batch, pages_per_seq], got {list(block_tables.shape)}")
        k_table = v_table = block_tables

    k_sf = v_sf = None
    if fmt is not None and fmt.scale_block:
        label = f"{fmt.name.upper()}"
        if head_dim % fmt.scale_block:
            raise ValueError(f"{name}: {label} needs head_dim a multiple of {fmt.scale_block}, got {head_dim}")
        if kv_sf is None:
            raise ValueError(f"{sf_name}: expected {label} block scales with a {_dtype_names((dtype,))} ({label}) cache, "
                             f"got None")
        k_sf, v_sf = _split_kv(kv_sf, sf_name, layout)
        for t in (k_sf, v_sf):
            check_tensor(t, sf_name, dtypes=(fmt.scale_dtype,), device=device, contiguous_last=True)
        want = (*shape[:3], head_dim // fmt.scale_block)
        for t in (k_sf, v_sf):
            if tuple(t.shape) != want:
                raise ValueError(f"{sf_name}: expected block scales of shape {list(want)} (as NHD), got {list(t.shape)}")
    elif kv_sf is not None:
        scaled = ", ".join(f"{f.name.upper()} ({_dtype_names((f.dtype,))})" for f in FORMATS if f.scale_block)
        raise ValueError(f"{sf_name}: block scales are only for {scaled} caches, got a {dtype} cache")
    return PagedKV(k, v, k_table, v_table, head_dim, head_dim, k_sf, v_sf)


def check_paged_heads(hq: int, query_name: str, kv: PagedKV, kv_cache, kv_layout: str, name: str = "kv_cache") -> int:
    """:func:`check_query_heads` of a paged cache from :func:`paged_kv_from_cache`, its messages
    naming the cache's shape as given and, when only the other layout fits, ``kv_layout``."""
    hkv = kv.num_kv_heads
    if hq >= 1 and hkv >= 1 and not hq % hkv:
        return hq // hkv
    first = kv_cache[0] if isinstance(kv_cache, (tuple, list)) else kv_cache
    # The other layout swaps the NHD view's page_size and head dims.
    return check_query_heads(hq, query_name, hkv, kv_name=name, kv_shape=first.shape, layout=check_layout(kv_layout),
                             other_heads=kv.page_size)


def check_max_seq_len(max_seq_len, name: str, kv: PagedKV) -> int:
    m = check_int(max_seq_len, name, minimum=0)
    if m > kv.capacity:
        raise ValueError(
            f"{name}: expected at most block_tables.shape[1] * page_size = {kv.capacity}, got {m}"
        )
    return m
