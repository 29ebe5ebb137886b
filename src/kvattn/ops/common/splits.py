"""Host rules for split-KV launches that the decode and MLA families share: the fixed-span splits of
batch-invariant mode and the combine kernel's splits a round (:mod:`.combine`)."""

from __future__ import annotations

from ...runtime.common import next_power_of_2


def invariant_span(cfg) -> int:
    """Keys a split takes in batch-invariant mode: ``cfg.invariant_span`` rounded up to whole
    tiles (a decode or MLA config). Fixed per config, which in that mode depends on the shape
    class only (lab/notes/robustness.md "Batch-invariant mode")."""
    return -(-cfg.invariant_span // cfg.block_n) * cfg.block_n


def invariant_splits(cfg, span: int) -> int:
    """Splits a batch-invariant launch of key bound ``span`` (max_seq_len) has: enough spans of
    :func:`invariant_span` keys for the longest request, and at least two, so every request's
    output goes through the same merge (a one-split launch writes its rows straight from the
    split, which rounds otherwise when sinks add to the denominator)."""
    return max(2, -(-span // invariant_span(cfg)))


def combine_block_s(splits: int, head_dim: int, invariant: bool) -> int:
    """Splits the combine kernel merges a round. Batch-invariant mode: a number fixed by the head
    dim, so a request's splits fall into the same rounds (the same rounding) whatever the launch's
    split count; the splits past a request's own are empty and merge exactly as no-ops."""
    cap = max(1, 8192 // head_dim)
    return min(16, cap) if invariant else min(next_power_of_2(splits), cap)
