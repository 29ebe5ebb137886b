"""Reference merge of attention states (``kvattn.merge``), in float32 torch ops."""

from __future__ import annotations

import torch

from .core import LOG2E


def merge_states(
    o: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor | None,
    out: torch.Tensor,
    out_lse: torch.Tensor | None,
) -> None:
    """``o [S, rows, D]`` (any float dtype) and base-2 ``lse [S, rows]`` merged into ``out
    [rows, D]`` and ``out_lse [rows]``.

    ``o = sum_s 2^(lse_s - m) o_s / (sum_s 2^(lse_s - m) + sink term)`` with ``m = max_s lse_s``;
    ``out_lse = m + log2(sum_s 2^(lse_s - m))`` (sinks excluded). A state with ``lse_s = -inf``
    adds nothing, whatever its ``o_s`` holds; rows whose states are all empty give 0 and -inf.
    ``sinks [H]`` (natural units): row ``r`` takes head ``r % H``'s sink.
    """
    lse = lse.float()
    m = lse.amax(dim=0) if lse.shape[0] else torch.full(lse.shape[1:], float("-inf"), device=lse.device)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse - m_safe)  # [S, rows]; 0 for empty states
    empty = torch.isneginf(lse).unsqueeze(-1)
    acc = torch.where(empty, torch.zeros((), device=o.device), w.unsqueeze(-1) * o.float()).sum(dim=0)
    den = w.sum(dim=0)
    merged_lse = torch.where(den > 0, m_safe + torch.log2(den.clamp_min(1e-38)), torch.full_like(den, float("-inf")))
    if sinks is not None:
        heads = torch.arange(den.shape[0], device=den.device) % sinks.shape[0]
        den = den + torch.exp2(sinks.float()[heads] * LOG2E - m_safe)
    merged = torch.where(den.unsqueeze(-1) > 0, acc / den.clamp_min(1e-38).unsqueeze(-1), torch.zeros_like(acc))
    out.copy_(merged.to(out.dtype))
    if out_lse is not None:
        out_lse.copy_(merged_lse)
