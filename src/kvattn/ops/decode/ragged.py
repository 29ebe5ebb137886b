"""Ragged speculative decode (``q_cu_seq_lens``) on the padded decode kernels.

Request ``b`` brings ``q_b = cu[b + 1] - cu[b]`` query rows (0 .. ``Q``, ``Q`` = ``q_len_per_req``),
packed ``[total_q, Hq, D]``; its row ``r`` sits at position ``L - q_b + r`` (docs/semantics.md,
"Ragged drafts"). The padded kernels take ``Q`` rows a request, row ``r'`` at ``L - Q + r'``. Placing
the ``q_b`` rows at the END of the request's ``Q`` slots (``r' = Q - q_b + r``) gives every packed
row its own position, so the padded kernels compute the ragged result unchanged: the slots before
them (``r' < Q - q_b``) are computed and dropped. A ragged mask row (bits over the request's own
``q_b`` drafts) becomes a padded row whose first ``Q - q_b`` draft columns, which are older keys of
the request, are visible and whose bits follow, shifted by ``Q - q_b``.

Everything here is elementwise torch on the device, of sizes fixed by the host-known ``B``, ``Q``
and ``total_q``: no value is read back, so a call can be captured in a CUDA graph and replayed
with new offsets. Offsets the caller got wrong (unchecked without ``KVATTN_DEBUG=1``) give wrong
rows, never an access outside the tensors: every index is clamped.
"""

from __future__ import annotations

import torch


def row_maps(q_cu: torch.Tensor, batch: int, q_max: int, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` int64: ``src [B * Q]`` the packed row each padded slot reads (any row for a
    slot before the request's rows), ``dst [total]`` the padded slot each packed row comes from.
    ``total > 0``."""
    device = q_cu.device
    cu = q_cu.to(torch.int64)
    shift = q_max - (cu[1:] - cu[:-1])  # [B]: the slots before each request's rows
    slots = torch.arange(q_max, device=device)
    src = (cu[:-1, None] + slots[None, :] - shift[:, None]).clamp_(0, total - 1).reshape(-1)
    rows = torch.arange(total, device=device)
    owner = torch.searchsorted(cu[1:].contiguous(), rows, right=True).clamp_(0, batch - 1)
    dst = (owner * q_max + shift[owner] + rows - cu[owner]).clamp_(0, batch * q_max - 1)
    return src, dst


def padded_mask(mask: torch.Tensor | None, q_cu: torch.Tensor, src: torch.Tensor, batch: int, q_max: int,
                window_left: int) -> torch.Tensor:
    """uint16 ``[B, Q, W]`` padded mask (``W = 2 * ceil(Q / 32)``) of a ragged one (uint16
    ``[total_q, W]``, bit ``c % 16`` of word ``c // 16`` of a row: its request's draft ``c``
    visible), or of the causal rule among each request's drafts (``mask`` None).

    The padded kernels apply the window to keys before the ``Q`` draft columns only; the columns
    before a request's own drafts are older keys of the request, so their bits carry the window
    (``r' - c' <= window_left``), as the ragged rule does."""
    device = q_cu.device
    words = 2 * ((q_max + 31) // 32)
    bit = torch.arange(16, device=device, dtype=torch.int32)
    cu = q_cu.to(torch.int64)
    shift = q_max - (cu[1:] - cu[:-1])  # [B]
    slot = torch.arange(q_max, device=device)
    col = slot[None, None, :] - shift[:, None, None]  # [B, 1, Q]: the draft each padded column is
    if mask is None:
        taken = (slot[None, None, :] <= slot[None, :, None]).to(torch.int32).expand(batch, q_max, q_max)
    else:
        bits = (mask.view(torch.int16).to(torch.int32)[:, :, None] >> bit) & 1  # [total, W, 16]
        bits = bits.reshape(mask.shape[0], -1)[:, :q_max]  # [total, Q]: column c, draft c
        rows = bits[src].view(batch, q_max, q_max)  # [B, Q slots, Q columns]
        taken = torch.gather(rows, 2, col.clamp(0, q_max - 1).expand(batch, q_max, q_max))
    older = torch.ones_like(taken)
    if window_left >= 0:  # row r' sees column c' (an older key) when r' - c' <= window_left
        older = (slot[None, :, None] - slot[None, None, :] <= window_left).to(torch.int32).expand_as(taken)
    padded = torch.where(col < 0, older, taken)
    padded = torch.nn.functional.pad(padded, (0, words * 16 - q_max)).view(batch, q_max, words, 16)
    value = (padded << bit).sum(-1, dtype=torch.int32)  # [B, Q, W] in [0, 65535]
    return torch.where(value >= 32768, value - 65536, value).to(torch.int16).view(torch.uint16)
