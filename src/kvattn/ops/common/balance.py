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


def unit_cap(merge_block_s: int) -> int:
    """Units of one request at most in a balanced launch whose merge loads ``merge_block_s``
    partials a round (the host's view of ``_unit_counts``' cap)."""
    return MAX_UNITS if merge_block_s * UNIT_CAP_ROUNDS >= MAX_UNITS else MIN_UNITS


@triton.jit
def _request_lens(seq_lens_ptr, batch, capacity, BLOCK_B: tl.constexpr):
    """``(b_ok, lens)`` [BLOCK_B]: the requests' key counts clamped into ``[0, capacity]`` as the
    kernels clamp them, 0 past ``batch``."""
    offs_b = tl.arange(0, BLOCK_B)
    b_ok = offs_b < batch
    lens = tl.load(seq_lens_ptr + offs_b, mask=b_ok, other=0)
    return b_ok, tl.minimum(tl.maximum(lens, 0), capacity)


@triton.jit
def _is_ragged(longest, total, batch):
    """Whether a batch of ``batch`` requests, ``total`` keys (int64), the longest ``longest``, is
    ragged: its longest request holds more than 5/4 of the mean's keys."""
    RAGGED_NUM: tl.constexpr = 5
    RAGGED_DEN: tl.constexpr = 4
    return longest.to(tl.int64) * batch * RAGGED_DEN > RAGGED_NUM * total


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
    b_ok, lens = _request_lens(seq_lens_ptr, batch, capacity, BLOCK_B)
    total = tl.sum(lens.to(tl.int64), 0)
    longest = tl.max(lens, 0)
    ragged = _is_ragged(longest, total, batch)
    n = tl.where(ragged, _ragged_units(lens, total, longest, unit_target, MIN_CHUNK, BLOCK_N, UNITS_CAP),
                 uniform_splits)
    n = tl.where(b_ok, n, 0)
    return ragged, n, tl.cumsum(n, 0)


@triton.jit
def _ragged_units(lens, total, longest, unit_target, MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
                  UNITS_CAP: tl.constexpr):
    """Each request's unit count in a ragged batch (``lens``: its clamped key counts, ``total``
    their sum as int64, ``longest`` their maximum): ``ceil(L_b / chunk)``, at least one, with one
    chunk for the batch (:func:`balanced_unit`)."""
    chunk = tl.maximum(tl.cdiv(total, unit_target), tl.cdiv(longest, UNITS_CAP)).to(tl.int32)
    chunk = tl.maximum(tl.cdiv(chunk, BLOCK_N) * BLOCK_N, MIN_CHUNK)
    return tl.maximum(tl.cdiv(lens, chunk), 1)


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
def _launch_unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, MIN_CHUNK: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNITS_CAP: tl.constexpr):
    return unit_counts(seq_lens_ptr, batch, capacity, uniform_splits, _grid_unit_target(batch, uniform_splits),
                       MIN_CHUNK, BLOCK_N, BLOCK_B, UNITS_CAP)


@triton.jit
def _grid_unit_target(batch, uniform_splits):
    # The grid holds batch * uniform_splits units; a chunk of at least total / (that - batch) keys
    # keeps sum_b ceil(L_b / chunk) <= total / chunk + batch within it.
    return tl.maximum(batch * (uniform_splits - 1), 1)


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
    :func:`launch_unit` (where the merge finds its partials).

    Every program of a combine launch derives it (one a request and head: 1024-4096 of them at
    16-64 heads), so the vector work is what it costs: an equal batch, whose plan is the uniform
    split, stops after the two reductions that tell it so; a ragged one sums the units before
    ``b`` instead of scanning them all."""
    offs_b = tl.arange(0, BLOCK_B)
    b_ok, lens = _request_lens(seq_lens_ptr, batch, capacity, BLOCK_B)
    total = tl.sum(lens.to(tl.int64), 0)
    longest = tl.max(lens, 0)
    # (a tensor like the ragged branch's n_b even where Triton makes a split count of 1 a constexpr)
    n_b = uniform_splits + 0 * b
    first = b * uniform_splits
    if _is_ragged(longest, total, batch):
        unit_target = _grid_unit_target(batch, uniform_splits)
        n = tl.where(b_ok, _ragged_units(lens, total, longest, unit_target, MIN_CHUNK, BLOCK_N, UNITS_CAP), 0)
        n_b = tl.sum(tl.where(offs_b == b, n, 0), 0)
        first = tl.sum(tl.where(offs_b < b, n, 0), 0)
    return n_b, first


# The lanes: a ragged batch's cost cut into one equal share a lane (a lane: the programs of one
# unit, every KV head and row block), instead of units dealt from a counter. The dynamic deal ends
# a launch with programs whose last unit started late (a unit is a program's whole share of an
# SM's bandwidth only when its partner program is busy: lab/notes/decode-ragged-batches.md
# "Timelines of the balanced rows: measured"); equal static shares end together. A request's
# cost is its key tiles plus LANE_FIXED_KEYS, what a piece costs beyond its keys (its start, its
# partial, its share of the merge), charged where the request starts.
LANE_FIXED_KEYS = 128


@triton.jit
def _lane_costs(seq_lens_ptr, batch, capacity, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """``(b_ok, lens, tiles, cost)`` [BLOCK_B] of the lanes plan: each request's keys (clamped as
    the kernels clamp them), key tiles (an empty request one: its rows are written) and cost (its
    tiles plus LANE_FIXED_KEYS in tiles); zero past ``batch``."""
    FIXED: tl.constexpr = max(1, 128 // BLOCK_N)  # LANE_FIXED_KEYS in tiles
    b_ok, lens = _request_lens(seq_lens_ptr, batch, capacity, BLOCK_B)
    tiles = tl.where(b_ok, tl.maximum(tl.cdiv(lens, BLOCK_N), 1), 0)
    return b_ok, lens, tiles, tl.where(b_ok, tiles + FIXED, 0)


@triton.jit
def _lane_share(seq_lens_ptr, batch, capacity, lanes, MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_B: tl.constexpr, LANE_CAP: tl.constexpr):
    """``(ragged, share, b_ok, tiles, cost)``: the 5/4 rule's verdict and one lane's share in key
    tiles of the lanes plan (:func:`lane_span`), with the requests' costs it was cut from."""
    MIN_TILES: tl.constexpr = max(1, MIN_CHUNK // BLOCK_N)
    b_ok, lens, tiles, cost = _lane_costs(seq_lens_ptr, batch, capacity, BLOCK_N, BLOCK_B)
    ragged = _is_ragged(tl.max(lens, 0), tl.sum(lens.to(tl.int64), 0), batch)
    share = tl.maximum(tl.cdiv(tl.sum(cost, 0), lanes), tl.cdiv(tl.max(cost, 0), LANE_CAP - 1))
    return ragged, tl.maximum(share, MIN_TILES), b_ok, tiles, cost


@triton.jit
def lane_span(seq_lens_ptr, lane, batch, capacity, lanes, MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_B: tl.constexpr, LANE_CAP: tl.constexpr):
    """``(ragged, share, first, stop)``: whether the batch takes the lanes plan (the 5/4 rule of
    :func:`unit_counts`), one lane's share in key tiles, and lane ``lane``'s units ``first ..
    stop - 1`` (none where ``stop <= first``).

    The requests' costs (their tiles plus a fixed cost each, charged before their first tile) are
    laid end to end and cut into ``lanes`` equal shares; lane ``l`` takes the tiles in ``[l *
    share, (l + 1) * share)``: the pieces of the requests it touches, each a *unit*. Unit ``b +
    l`` is request ``b``'s piece in lane ``l`` (each next unit is the next lane of a request or the
    next request of a lane, so the numbers are unique and below ``batch + lanes``, and a request's
    units are consecutive: the merge's partials). The share is at least the batch's cost over the
    lanes, ``MIN_CHUNK`` keys, and enough that a request spans at most ``LANE_CAP`` lanes (the
    host's choice: a config's cap, or the merge's ``unit_cap``; its tiles start inside a share, so
    they span one lane more than their length in shares)."""
    tl.static_assert(LANE_CAP >= 2)  # (the share divides by LANE_CAP - 1)
    ragged, share, b_ok, tiles, cost = _lane_share(seq_lens_ptr, batch, capacity, lanes, MIN_CHUNK, BLOCK_N, BLOCK_B,
                                                   LANE_CAP)
    ends = tl.cumsum(cost, 0)
    # the requests with tiles in this lane: contiguous, as both of a request's lane bounds grow with it
    b_first = tl.sum((b_ok & ((ends - 1) // share < lane)).to(tl.int32), 0)
    b_stop = tl.sum((b_ok & ((ends - tiles) // share <= lane)).to(tl.int32), 0)
    return ragged, share, b_first + lane, b_stop + lane


@triton.jit
def lane_piece(seq_lens_ptr, b, lane, share, batch, capacity, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
    """``(split, n_splits, first_unit, key_lo, key_hi)`` of request ``b``'s piece in lane ``lane``
    (unit ``b + lane`` of :func:`lane_span`'s plan of share ``share``): its place among the
    request's ``n_splits`` units from ``first_unit``, and its keys ``key_lo .. key_hi`` (whole tiles:
    the caller clamps to the length)."""
    b_ok, lens, tiles, cost = _lane_costs(seq_lens_ptr, batch, capacity, BLOCK_N, BLOCK_B)
    offs_b = tl.arange(0, BLOCK_B)
    mine = offs_b == b
    tiles_b = tl.sum(tl.where(mine, tiles, 0), 0)
    pos = tl.sum(tl.where(offs_b <= b, cost, 0), 0) - tiles_b  # the cost position of its first tile
    lane_lo = pos // share
    lane_hi = (pos + tiles_b - 1) // share
    tile_lo = tl.maximum(lane * share - pos, 0)
    tile_hi = tl.minimum((lane + 1) * share - pos, tiles_b)
    return lane - lane_lo, lane_hi - lane_lo + 1, b + lane_lo, tile_lo * BLOCK_N, tile_hi * BLOCK_N


@triton.jit
def lane_request_units(seq_lens_ptr, b, batch, capacity, lanes, uniform_splits, MIN_CHUNK: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, LANE_CAP: tl.constexpr):
    """``(ragged, n_b, first)``: whether the batch is ragged, and request ``b``'s unit count and
    first unit in a lanes launch of ``lanes`` lanes (:func:`lane_span`'s plan; a batch found
    uniform: ``uniform_splits`` units a request, in request order), where a combine launch finds
    its partials."""
    ragged, share, _, _, _ = _lane_share(seq_lens_ptr, batch, capacity, lanes, MIN_CHUNK, BLOCK_N, BLOCK_B, LANE_CAP)
    _, n_b, first, _, _ = lane_piece(seq_lens_ptr, b, 0, share, batch, capacity, BLOCK_N, BLOCK_B)
    return ragged, tl.where(ragged, n_b, uniform_splits), tl.where(ragged, first, b * uniform_splits)
