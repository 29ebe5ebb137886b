"""Reference KV-cache append (``kvattn.cache.append_paged_kv_cache``)."""

from __future__ import annotations

import torch

from .._inputs import Scale
from ..formats import FP8_DTYPE, quantize_fp8, quantize_nvfp4
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
    """Quantise ``rows [n, H, D]`` to the pages' format and store them at ``(page, slot)``."""
    if pages.dtype == torch.uint8:
        codes, block_scales = quantize_nvfp4(rows, _scalar(scale, rows.device))
        pages[page, slot] = codes
        sf[page, slot] = block_scales
    elif pages.dtype == FP8_DTYPE:
        pages[page, slot] = quantize_fp8(rows, _scalar(scale, rows.device))
    else:
        pages[page, slot] = rows.to(pages.dtype)


def append_paged_kv(
    key: torch.Tensor,
    value: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor | None,
    k_sf: torch.Tensor | None,
    v_sf: torch.Tensor | None,
    table: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    *,
    k_scale: Scale,
    v_scale: Scale,
) -> None:
    """Write ``key``/``value [N, H, D]`` into the NHD page views ``k``/``v [P, page, H, Ds]``.

    fp8 pages get ``e4m3(x / scale)``; NVFP4 pages the codes of ``x / scale`` and their block
    scales (:func:`kvattn.formats.quantize_nvfp4`). Dropped tokens (see :func:`token_slots`) write
    nothing.
    """
    keep, page, slot = token_slots(table, batch_indices, positions, k.shape[1], k.shape[0])
    _write(key[keep], k, k_sf, page, slot, k_scale)
    if value is not None:
        _write(value[keep], v, v_sf, page, slot, v_scale)
