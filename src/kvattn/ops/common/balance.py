"""The balanced split of a ragged batch, planned on the GPU (``triton.jit``).

A launch that splits every request into the same number of pieces leaves the longest request's
programs running long after the rest are done when the lengths differ a lot. The balanced split
cuts a ragged batch's keys into *units* of about equal length instead: one chunk length for the
whole launch, from the batch's total key count, so a long request gets several units and a short
one a single unit; the launch's programs then take units from a shared counter as they finish
(a dynamic deal), so no program waits on a long one. No host sync: every program reads the
device-side lengths and derives the same plan, and the grid (one wave of resident programs)
comes from host bounds, so a captured CUDA graph replays with new lengths. A batch of about equal
lengths keeps the uniform split's pieces as its units (``num_splits`` a request), dealt the same
way. docs/performance.md, "Ragged batches", has the measurements.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Units of one request at most: the chunk is at least the longest request's keys over this cap,
# so a request's partials merge in a bounded number of rounds in its last program (no combine
# launch). The cap is MAX_UNITS where the merge loads 4 or more partials a round (8 rounds at
# most), else MIN_UNITS (16 rounds at one partial a round, 8 at two: one-row and fp8 tiles). It
# binds on batches of few requests with one long one, whose chunk would otherwise stay far longer
# than the keys a program gets: 45 log-normal requests up to 51550 keys over 132 programs, 1790
# keys a program, units of 3328 keys under a cap of 16 and of 1664 under 32. The host reads it
# through unit_cap; _unit_counts repeats the values as local constexprs, which every Triton's
# interpreter takes (3.7.1's did not take a module-level one in arithmetic).
MAX_UNITS = 32
MIN_UNITS = 16
UNIT_CAP_ROUNDS = 8  # merge rounds of 4 partials that MAX_UNITS takes
# A unit's fixed cost in the lanes plan (lane_items), in keys: the copy time a unit's start costs.
LANE_UNIT_KEYS = 128


def unit_cap(merge_block_s: int) -> int:
    """Units of one request at most in a balanced launch whose merge loads ``merge_block_s``
    partials a round (the host's view of ``_unit_counts``' cap)."""
    return MAX_UNITS if merge_block_s * UNIT_CAP_ROUNDS >= MAX_UNITS else MIN_UNITS


@triton.jit
def _unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, MERGE_BLOCK_S: tl.constexpr):
    """``(ragged, n [BLOCK_B], ends [BLOCK_B])``: whether the batch is ragged, each request's unit
    count and one past its last unit (see :func:`balanced_unit`)."""
    UNITS_MANY: tl.constexpr = 32  # MAX_UNITS
    UNITS_FEW: tl.constexpr = 16  # MIN_UNITS
    CAP_ROUNDS: tl.constexpr = 8  # UNIT_CAP_ROUNDS
    UNITS_MAX: tl.constexpr = UNITS_MANY if MERGE_BLOCK_S * CAP_ROUNDS >= UNITS_MANY else UNITS_FEW  # unit_cap
    return unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK, BLOCK_N, BLOCK_B,
                       UNITS_MAX)


@triton.jit
def unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNITS_CAP: tl.constexpr):
    """:func:`_unit_counts` with a request's unit cap ``UNITS_CAP`` of the caller's (the chunk is at
    least the longest request's keys over it)."""
    # A ragged batch: its longest request holds more than 5/4 of the mean's keys.
    RAGGED_NUM: tl.constexpr = 5
    RAGGED_DEN: tl.constexpr = 4
    offs_b = tl.arange(0, BLOCK_B)
    b_ok = offs_b < batch
    lens = tl.load(seq_lens_ptr + offs_b, mask=b_ok, other=0)
    lens = tl.minimum(tl.maximum(lens, 0), capacity)
    total = tl.sum(lens.to(tl.int64), 0)
    longest = tl.max(lens, 0)
    ragged = longest.to(tl.int64) * batch * RAGGED_DEN > RAGGED_NUM * total
    chunk = tl.maximum(tl.cdiv(total, unit_target), tl.cdiv(longest, UNITS_CAP)).to(tl.int32)
    chunk = tl.maximum(tl.cdiv(chunk, BLOCK_N) * BLOCK_N, MIN_CHUNK)
    n = tl.where(ragged, tl.maximum(tl.cdiv(lens, chunk), 1), uniform_splits)
    n = tl.where(b_ok, n, 0)
    return ragged, n, tl.cumsum(n, 0)


@triton.jit
def balanced_plan(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, MERGE_BLOCK_S: tl.constexpr):
    """``(ragged, units)``: whether the batch takes the balanced split, and its unit count."""
    ragged, n, ends = _unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK, BLOCK_N,
                                   BLOCK_B, MERGE_BLOCK_S)
    return ragged, tl.sum(n, 0)


@triton.jit
def balanced_unit(seq_lens_ptr, unit, batch, capacity, uniform_splits, unit_target, MIN_CHUNK: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, MERGE_BLOCK_S: tl.constexpr):
    """``(b, split, n_splits, first_unit)`` of work unit ``unit`` (``< units``) of the plan.

    ``seq_lens_ptr``: ``[batch]`` int32 key counts (clamped into ``[0, capacity]`` as the kernels
    clamp them); ``batch <= BLOCK_B``. Request ``b`` takes ``n_b`` consecutive units, request by
    request, and its keys are cut into ``n_b`` equal chunks (``split_bounds``):

    * a batch whose longest request holds at most 5/4 of the mean's keys keeps the host's uniform
      split, ``n_b = uniform_splits`` for every request (planned in whole waves of resident
      programs, which suits equal lengths best);
    * a ragged batch takes ``n_b = max(1, ceil(L_b / chunk))`` (an empty request still takes one
      unit: its rows are written, as zeros), with one ``chunk`` for the whole batch:
      ``total / unit_target`` keys, at least the longest over ``unit_cap(MERGE_BLOCK_S)`` and ``MIN_CHUNK``,
      rounded up to whole ``BLOCK_N`` tiles.
    """
    ragged, n, ends = _unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK, BLOCK_N,
                                   BLOCK_B, MERGE_BLOCK_S)
    offs_b = tl.arange(0, BLOCK_B)
    b = tl.minimum(tl.sum((ends <= unit).to(tl.int32), 0), batch - 1)  # requests wholly before this unit
    mine = offs_b == b
    n_b = tl.sum(tl.where(mine, n, 0), 0)
    first = tl.sum(tl.where(mine, ends, 0), 0) - n_b
    return b, unit - first, n_b, first


@triton.jit
def _lane_counts(seq_lens_ptr, batch, capacity, uniform_splits, lanes, MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_B: tl.constexpr, MERGE_BLOCK_S: tl.constexpr):
    """``(ragged, share, first_lane, start, cost, n, ends)`` of the lanes plan (:func:`lane_items`),
    each but the first two ``[BLOCK_B]`` a request: the first lane it touches, where its cost
    starts and its cost (tiles), its unit count and one past its last unit."""
    UNITS_MANY: tl.constexpr = 32  # MAX_UNITS
    UNITS_FEW: tl.constexpr = 16  # MIN_UNITS
    CAP_ROUNDS: tl.constexpr = 8  # UNIT_CAP_ROUNDS
    UNITS_MAX: tl.constexpr = UNITS_MANY if MERGE_BLOCK_S * CAP_ROUNDS >= UNITS_MANY else UNITS_FEW  # unit_cap
    # What a unit costs beyond its tiles (its plan, query and page ids, the pipeline's fill), in
    # tiles: about LANE_UNIT_KEYS keys' copy time, so a request's first unit is charged for it.
    UNIT_KEYS: tl.constexpr = 128  # LANE_UNIT_KEYS
    UNIT_COST: tl.constexpr = UNIT_KEYS // BLOCK_N if UNIT_KEYS > BLOCK_N else 1
    RAGGED_NUM: tl.constexpr = 5
    RAGGED_DEN: tl.constexpr = 4
    offs_b = tl.arange(0, BLOCK_B)
    b_ok = offs_b < batch
    lens = tl.load(seq_lens_ptr + offs_b, mask=b_ok, other=0)
    lens = tl.minimum(tl.maximum(lens, 0), capacity)
    total_keys = tl.sum(lens.to(tl.int64), 0)
    ragged = tl.max(lens, 0).to(tl.int64) * batch * RAGGED_DEN > RAGGED_NUM * total_keys
    cost = tl.where(b_ok, tl.cdiv(lens, BLOCK_N) + UNIT_COST, 0)
    ends_cost = tl.cumsum(cost, 0)
    start = ends_cost - cost
    # Every lane the same share of the batch's cost, no unit under MIN_CHUNK keys but at a request's
    # edge, and no request over UNITS_MAX lanes (a cost of (UNITS_MAX - 1) shares spans UNITS_MAX).
    share = tl.maximum(tl.cdiv(tl.sum(cost, 0), lanes), tl.cdiv(tl.max(cost, 0), UNITS_MAX - 1))
    share = tl.maximum(share, tl.cdiv(MIN_CHUNK, BLOCK_N))
    first_lane = start // share
    n = tl.where(ragged, (start + cost - 1) // share - first_lane + 1, uniform_splits)
    n = tl.where(b_ok, n, 0)
    return ragged, share, first_lane, start, cost, n, tl.cumsum(n, 0)


@triton.jit
def lane_items(seq_lens_ptr, pid, lanes, batch, capacity, uniform_splits, UNIT_ITEMS: tl.constexpr,
               MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, MERGE_BLOCK_S: tl.constexpr):
    """``(ragged, first, end)``: whether the batch is ragged, and then the work items program
    ``pid`` runs, ``range(first, end, UNIT_ITEMS)``, a unit being ``UNIT_ITEMS`` items (KV heads x
    row blocks) and ``lanes`` at most the programs over ``UNIT_ITEMS`` (the lanes plan).

    The lanes plan cuts a ragged batch's work into ``lanes`` equal shares, whatever the lengths
    (FlashMLA's scheduler does the same on the GPU): the batch's requests laid end to end, each
    costing its key tiles plus one unit's fixed cost, and lane ``p`` (programs ``p * UNIT_ITEMS``
    on, one a KV head and row block) takes the cost range ``[p * share, (p + 1) * share)``; its
    units are that range's pieces of each request it touches, so a request spanning ``n_b`` lanes
    has ``n_b`` partials, merged by the last to finish. Every lane ends within about a tile of the
    others, which a dynamic deal of equal units cannot do when the units number a fraction of a
    lane more than the lanes (the deal's tail: lab/notes/decode-ragged-batches.md); programs past
    the last lane idle. A batch found uniform keeps the uniform split's ``batch * uniform_splits``
    equal units (:func:`lane_unit`), which the caller deals dynamically: equal units in a static
    order ran 3-10 % slower on an H200 (lab/notes/decode-ragged-batches.md)."""
    ragged, share, first_lane, start, cost, n, ends = _lane_counts(seq_lens_ptr, batch, capacity, uniform_splits,
                                                                   lanes, MIN_CHUNK, BLOCK_N, BLOCK_B, MERGE_BLOCK_S)
    lane = pid // UNIT_ITEMS
    before = tl.sum(tl.minimum(tl.maximum(lane - first_lane, 0), n), 0)
    upto = tl.sum(tl.minimum(tl.maximum(lane + 1 - first_lane, 0), n), 0)
    return ragged, before * UNIT_ITEMS + pid % UNIT_ITEMS, upto * UNIT_ITEMS


@triton.jit
def lane_unit(seq_lens_ptr, unit, lanes, batch, capacity, uniform_splits, MIN_CHUNK: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, MERGE_BLOCK_S: tl.constexpr):
    """``(b, split, n_splits, first_unit, tile_lo, tile_hi)`` of unit ``unit`` of the lanes plan
    (:func:`lane_items`):
    its request, its place among the request's ``n_splits`` units (the first at ``first_unit``),
    and its key tiles ``[tile_lo, tile_hi)`` of the request; ``tile_lo`` is -1 for a batch found
    uniform, whose units are ``split_bounds``' pieces."""
    UNIT_KEYS: tl.constexpr = 128  # LANE_UNIT_KEYS
    UNIT_COST: tl.constexpr = UNIT_KEYS // BLOCK_N if UNIT_KEYS > BLOCK_N else 1
    ragged, share, first_lane, start, cost, n, ends = _lane_counts(seq_lens_ptr, batch, capacity, uniform_splits,
                                                                   lanes, MIN_CHUNK, BLOCK_N, BLOCK_B, MERGE_BLOCK_S)
    offs_b = tl.arange(0, BLOCK_B)
    b = tl.minimum(tl.sum((ends <= unit).to(tl.int32), 0), batch - 1)  # requests wholly before this unit
    mine = offs_b == b
    n_b = tl.sum(tl.where(mine, n, 0), 0)
    first = tl.sum(tl.where(mine, ends, 0), 0) - n_b
    split = unit - first
    lane = tl.sum(tl.where(mine, first_lane, 0), 0) + split
    b_start = tl.sum(tl.where(mine, start, 0), 0) + UNIT_COST  # the request's first tile, in cost
    b_end = tl.sum(tl.where(mine, start + cost, 0), 0)
    tile_lo = tl.maximum(tl.maximum(lane * share, b_start) - b_start, 0)
    tile_hi = tl.maximum(tl.minimum((lane + 1) * share, b_end) - b_start, 0)
    return b, split, n_b, first, tl.where(ragged, tile_lo, -1), tile_hi


@triton.jit
def _launch_unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, MIN_CHUNK: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNITS_CAP: tl.constexpr):
    # The grid holds batch * uniform_splits units; a chunk of at least total / (that - batch) keys
    # keeps sum_b ceil(L_b / chunk) <= total / chunk + batch within it.
    unit_target = tl.maximum(batch * (uniform_splits - 1), 1)
    return unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, unit_target, MIN_CHUNK, BLOCK_N, BLOCK_B,
                       UNITS_CAP)


@triton.jit
def launch_unit(seq_lens_ptr, unit, batch, capacity, uniform_splits, MIN_CHUNK: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNITS_CAP: tl.constexpr):
    """``(live, b, split, n_splits)`` of unit ``unit`` of a plan whose units each take one program
    of a grid of ``batch * uniform_splits`` units (MLA: no counter; lab/notes/mla-ragged.md "MLA:
    the balanced split (design)"). The plan of :func:`balanced_unit`, its units counted for the
    grid rather than a request: the chunk is at least ``total / (batch * (uniform_splits - 1))``
    keys (so the units fit the grid) and the longest request's keys over ``UNITS_CAP`` (a
    request's units at most). ``live`` is false for the grid's units past the plan's last. An
    equal batch keeps the uniform split: unit ``b * uniform_splits + split``."""
    ragged, n, ends = _launch_unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, MIN_CHUNK, BLOCK_N, BLOCK_B,
                                          UNITS_CAP)
    offs_b = tl.arange(0, BLOCK_B)
    b = tl.minimum(tl.sum((ends <= unit).to(tl.int32), 0), batch - 1)  # requests wholly before this unit
    mine = offs_b == b
    n_b = tl.sum(tl.where(mine, n, 0), 0)
    first = tl.sum(tl.where(mine, ends, 0), 0) - n_b
    return unit < tl.sum(n, 0), b, unit - first, n_b


@triton.jit
def request_units(seq_lens_ptr, b, batch, capacity, uniform_splits, MIN_CHUNK: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNITS_CAP: tl.constexpr):
    """``(n_b, first)``: request ``b``'s unit count and first unit in the plan of
    :func:`launch_unit` (where the merge finds its partials)."""
    ragged, n, ends = _launch_unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, MIN_CHUNK, BLOCK_N, BLOCK_B,
                                          UNITS_CAP)
    mine = tl.arange(0, BLOCK_B) == b
    n_b = tl.sum(tl.where(mine, n, 0), 0)
    return n_b, tl.sum(tl.where(mine, ends, 0), 0) - n_b
