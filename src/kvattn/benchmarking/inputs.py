"""Random benchmark inputs built on the device: paged pools, page tables, gathers (``kvattn bench``'s
problems and the repository's registry both draw theirs here).

``kvattn.testing.make_paged_kv`` builds its caches on the CPU with a per-token loop and keeps
float32 copies of every token for the tests' references; at benchmark sizes (a gigabyte of cache)
that takes minutes. This module draws the same kind of data directly on the device: random normal
values (never zeros), and each request's pages taken from a fresh random permutation of the pool,
so page tables are never contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._formats_table import BY_NAME

FP8 = torch.float8_e4m3fn


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a format name (kvattn's format table)."""
    return BY_NAME[name].dtype


def generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def randn(shape, dtype: torch.dtype, device: torch.device, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    """Normal values in ``dtype``; fp8 is drawn in bf16 and cast (N(0,1) is far inside e4m3's range)."""
    draw = torch.bfloat16 if dtype == FP8 else dtype
    x = torch.randn(shape, dtype=draw, device=device, generator=gen)
    if scale != 1.0:
        x.mul_(scale)
    return x.to(dtype) if dtype != draw else x


@dataclass
class PagedPools:
    """K and V page pools with their tables.

    ``k``/``v``: NHD ``[P, page, H, D]`` or HND ``[P, H, page, D]`` (separate pools, the ``(K, V)``
    tuple form of the kvattn API), or for MLA one ``[P, page, 576]`` pool in ``k`` and ``v`` None.
    ``tables`` int32 ``[B, W]`` (W = the longest request's pages; entries past a request's last page
    are 0, a valid page that is never read). ``inv_page[p]`` is the logical page index of physical
    page ``p`` inside the request that owns it (-1 for the spare page): the peers' paged
    FlexAttention mask needs it.
    """

    k: torch.Tensor
    v: torch.Tensor | None
    tables: torch.Tensor
    seq_lens: torch.Tensor
    lens: list[int]
    page_size: int
    layout: str
    inv_page: torch.Tensor
    k_sf: torch.Tensor | None = None  # NVFP4 block scales (e4m3, last dim D / 16)
    v_sf: torch.Tensor | None = None

    @property
    def width(self) -> int:
        return int(self.tables.shape[1])


def make_pools(
    lens: list[int],
    *,
    num_heads: int,
    head_dim: int,
    page_size: int,
    layout: str,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
    mla: bool = False,
) -> PagedPools:
    """Random pools holding ``lens[b]`` tokens for request ``b``, pages scattered at random."""
    need = torch.tensor([(n + page_size - 1) // page_size for n in lens], dtype=torch.int64)
    width = max(int(need.max()), 1)
    total = int(need.sum()) + 1  # one spare page nobody owns
    perm = torch.randperm(total, generator=gen, device=device)
    offsets = torch.cumsum(need, 0) - need
    col = torch.arange(width, dtype=torch.int64)
    used = col[None, :] < need[:, None]
    flat = (offsets[:, None] + col[None, :]).clamp(max=total - 1).to(device)
    used_d = used.to(device)
    tables = torch.where(used_d, perm[flat], torch.zeros_like(flat)).to(torch.int32)
    inv_page = torch.full((total,), -1, dtype=torch.int32, device=device)
    inv_page[tables[used_d].long()] = col[None, :].expand_as(used).to(device)[used_d].to(torch.int32)

    if mla:
        k = randn((total, page_size, head_dim), dtype, device, gen)
        v = None
    else:
        page = (page_size, num_heads, head_dim) if layout == "NHD" else (num_heads, page_size, head_dim)
        if dtype == torch.uint8:  # NVFP4: random code bytes, e4m3 scales in [1/4, 4]
            data = lambda: torch.randint(0, 256, (total, *page[:2], head_dim // 2), dtype=torch.uint8,  # noqa: E731
                                         device=device, generator=gen)
            sf = lambda: torch.exp2(torch.rand((total, *page[:2], head_dim // 16), device=device,  # noqa: E731
                                               generator=gen) * 4 - 2).to(FP8)
            k, v = data(), data()
            seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
            return PagedPools(k, v, tables, seq_lens, list(lens), page_size, layout, inv_page, sf(), sf())
        k = randn((total, *page), dtype, device, gen)
        v = randn((total, *page), dtype, device, gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return PagedPools(k, v, tables, seq_lens, list(lens), page_size, layout, inv_page)


def gather_pages(pool: torch.Tensor, tables: torch.Tensor, layout: str) -> torch.Tensor:
    """One request-major copy of the pages: ``[B, H, W * page, D]`` (padded to the table width).

    NHD comes back as a strided ``[B, S, H, D]``-ordered view (FlashAttention's native order: no
    second copy); HND is gathered head-major so the result is one contiguous copy.
    An MLA pool ``[P, page, 576]`` gives ``[B, 1, W * page, 576]``.
    """
    b, w = tables.shape
    idx = tables.long()
    if pool.dim() == 3:  # MLA latent pool
        g = pool[idx]  # [B, W, page, 576]
        return g.view(b, 1, w * pool.shape[1], pool.shape[2])
    if layout == "NHD":
        g = pool[idx]  # [B, W, page, H, D]
        return g.view(b, w * pool.shape[1], pool.shape[2], pool.shape[3]).transpose(1, 2)
    g = pool.permute(1, 0, 2, 3)[:, idx]  # [H, B, W, page, D]
    return g.permute(1, 0, 2, 3, 4).reshape(b, pool.shape[1], w * pool.shape[2], pool.shape[3])


def token_index(tables: torch.Tensor, lens: list[int], page_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per request, the (physical page, row in page) of each of its ``lens[b]`` tokens, in order.

    Built once from the page table (what an engine's slot mapping holds), so that a gather of one
    request's K/V is one indexing op: :func:`gather_tokens`.
    """
    out = []
    for b, n in enumerate(lens):
        j = torch.arange(n, device=tables.device)
        out.append((tables[b, j // page_size].long(), j % page_size))
    return out


def gather_tokens(pool: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor, layout: str) -> torch.Tensor:
    """One request's K or V, exactly its tokens: ``[1, H, L, D]``, a view of one ``[L, H, D]`` copy.

    That layout (sequence-major, heads inside) is what SDPA's kernels read natively, the same
    layout as a query row view; ``pages``/``rows`` come from :func:`token_index`.
    """
    if layout == "NHD":
        g = pool[pages, rows]  # [L, H, D]
    else:
        g = pool[pages, :, rows]  # advanced indices around a slice: [L, H, D]
    return g.unsqueeze(0).transpose(1, 2)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 1e4, scale: float = 1.0) -> torch.Tensor:
    """Rotate-half (Llama) RoPE over the last dim of ``x [..., S, D]`` at ``positions [S]``, in float32."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d // 2, device=x.device, dtype=torch.float32) * 2.0 / d) / scale
    ang = positions.to(torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    xf = x.float()
    lo, hi = xf[..., : d // 2], xf[..., d // 2 :]
    return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin], dim=-1).to(x.dtype)
