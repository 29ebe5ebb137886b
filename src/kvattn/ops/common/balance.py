"""The balanced split of a ragged batch, decided on the GPU by every program (``triton.jit``).

A launch over requests of very different lengths that splits every request into the same number
of pieces leaves the longest request's programs running long after the rest are done. The
balanced split cuts the batch's keys into *units* of about equal length instead: one chunk length
for the whole launch, from the batch's total key count, so a long request gets many units and a
short one a single unit. No host sync: every program reads the device-side lengths, derives the
same plan and finds its own unit, so a captured CUDA graph replays with new lengths. The launch
size comes from host bounds: with ``chunk >= total / unit_target`` a ragged plan has at most
``unit_target + batch`` units (each request rounds up once), and programs past the plan's last
unit find nothing to do. A batch of about equal lengths keeps the uniform split instead (see
:func:`balanced_unit`). docs/performance.md, "Ragged batches", has the measurements.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """``(n [BLOCK_B], ends [BLOCK_B])``: each request's unit count and one past its last unit."""
    offs_b = tl.arange(0, BLOCK_B)
    b_ok = offs_b < batch
    lens = tl.load(seq_lens_ptr + offs_b, mask=b_ok, other=0)
    lens = tl.minimum(tl.maximum(lens, 0), capacity)
    total = tl.sum(lens.to(tl.int64), 0)
    ragged = tl.max(lens, 0).to(tl.int64) * batch > 2 * total
    chunk = tl.cdiv(tl.cdiv(total, unit_target), BLOCK_N) * BLOCK_N
    chunk = tl.maximum(chunk, MIN_CHUNK).to(tl.int32)
    n = tl.where(ragged, tl.maximum(tl.cdiv(lens, chunk), 1), uniform_splits)
    n = tl.where(b_ok, n, 0)
    return n, tl.cumsum(n, 0)


@triton.jit
def balanced_unit(seq_lens_ptr, unit, batch, capacity, uniform_splits, unit_target, MIN_CHUNK: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """``(b, split, n_splits, first_unit, active)`` of work unit ``unit`` of the launch's plan.

    ``seq_lens_ptr``: ``[batch]`` int32 key counts (clamped into ``[0, capacity]`` as the kernels
    clamp them); ``batch <= BLOCK_B``. Request ``b`` takes ``n_b`` consecutive units, request by
    request, and its keys are cut into ``n_b`` equal chunks (``split_bounds``):

    * a batch whose longest request holds at most twice the mean's keys keeps the host's uniform
      split, ``n_b = uniform_splits`` for every request (the split count planned in whole waves of
      resident programs, which suits equal lengths best);
    * a ragged batch takes ``n_b = max(1, ceil(L_b / chunk))`` (an empty request still takes one
      unit: its rows are written, as zeros), with one ``chunk`` for the whole batch:
      ``total / unit_target`` keys rounded up to whole ``BLOCK_N`` tiles, at least ``MIN_CHUNK``.

    ``active`` is false for the units past the plan's last (``b`` is then clamped to a valid
    request, and the caller reads and stores nothing).
    """
    n, ends = _unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK, BLOCK_N, BLOCK_B)
    offs_b = tl.arange(0, BLOCK_B)
    b = tl.sum((ends <= unit).to(tl.int32), 0)  # requests wholly before this unit
    active = b < batch
    b = tl.minimum(b, batch - 1)
    mine = offs_b == b
    n_b = tl.sum(tl.where(mine, n, 0), 0)
    first = tl.sum(tl.where(mine, ends, 0), 0) - n_b
    return b, unit - first, n_b, first, active


@triton.jit
def request_units(seq_lens_ptr, b, batch, capacity, uniform_splits, unit_target, MIN_CHUNK: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """``(n_splits, first_unit)`` of request ``b`` in the plan :func:`balanced_unit` reads."""
    n, ends = _unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK, BLOCK_N, BLOCK_B)
    mine = tl.arange(0, BLOCK_B) == b
    n_b = tl.sum(tl.where(mine, n, 0), 0)
    return n_b, tl.sum(tl.where(mine, ends, 0), 0) - n_b
