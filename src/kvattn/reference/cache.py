"""Reference KV-cache append (``kvattn.cache.append_paged_kv_cache``)."""

from __future__ import annotations

import torch

from .._inputs import PagedKV, Scale
from .._formats_table import BY_DTYPE
from .core import _scalar


def token_slots(table: torch.Tensor, batch_indices: torch.Tensor, positions: torch.Tensor, page_size: int,
                num_pages: int):
    """``(keep, page, slot)``: which new tokens are written, and where.

    Token ``i`` goes to page ``table[batch_indices[i], positions[i] // page_size]``, slot
    ``positions[i] % page_size``; it is dropped (``keep`` False) when its request is outside
    ``[0, B)``, its position outside ``[0, pages_per_seq * page_size)`` or its page id outside
    ``[0, num_pages)``.
    """
    batch, width = table.shape
    b = batch_indices.to(torch.int64)
    pos = positions.to(torch.int64)
    keep = (b >= 0) & (b < batch) & (pos >= 0) & (pos < width * page_size)
    b_safe = torch.where(keep, b, 0)
    col = torch.where(keep, pos // page_size, 0)
    page = table.to(torch.int64)[b_safe, col] if batch and width else torch.zeros_like(b)
    keep = keep & (page >= 0) & (page < num_pages)
    return keep, page[keep], (pos % page_size)[keep]


def _write(rows: torch.Tensor, pages: torch.Tensor, sf: torch.Tensor | None, page, slot, scale: Scale) -> None:
    """Store ``rows [n, H, D]`` at ``(page, slot)`` in the pages' format: as they are for a 16-bit
    (or float32) cache, ``rows / scale`` through the format table's ``quantize`` for a quantised one
    (its block scales, if any, into ``sf``)."""
    fmt = BY_DTYPE.get(pages.dtype)
    if fmt is None or fmt.element_bits >= 16:
        pages[page, slot] = rows.to(pages.dtype)
        return
    data, block_scales = fmt.quantize(rows.to(torch.float32) / _scalar(scale, rows.device))
    pages[page, slot] = data
    if block_scales is not None:
        sf[page, slot] = block_scales


def append_paged_kv(
    key: torch.Tensor,
    value: torch.Tensor | None,
    kv: PagedKV,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    *,
    k_scale: Scale,
    v_scale: Scale,
) -> None:
    """Write ``key``/``value [N, H, D]`` into the NHD page views ``kv.k``/``kv.v [P, page, H, Ds]``
    (``value`` None: a cache of one plane, K only).

    fp8 pages get ``e4m3(x / scale)``; NVFP4 pages the codes of ``x / scale`` and their block
    scales (:func:`kvattn.formats.quantize_nvfp4`). Dropped tokens (see :func:`token_slots`) write
    nothing.
    """
    keep, page, slot = token_slots(kv.k_table, batch_indices, positions, kv.page_size, kv.num_pages)
    _write(key[keep], kv.k, kv.k_sf, page, slot, k_scale)
    if value is not None:
        _write(value[keep], kv.v, kv.v_sf, page, slot, v_scale)
