"""The lanes plan of a ragged batch (common.balance.lane_span / lane_piece), run as
Triton code (the interpreter on the CPU, compiled on a GPU) and checked against what it promises:
every key tile of every request in exactly one unit, a request's units consecutive and in key
order, each lane's units the ones its span lists, no lane over its share, unit numbers under
``batch + lanes``, and a request's units at most the merge's unit cap."""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

from kvattn.ops.common import balance

from ..oracle import ON_GPU


@triton.jit
def _lanes_probe(seq_lens_ptr, unit_ptr, span_ptr, batch, capacity, lanes, MIN_CHUNK: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, LANE_CAP: tl.constexpr):
    # seq_lens_ptr: [batch] int32; span_ptr: [lanes, 4] int32 (ragged, share, first, stop);
    # unit_ptr: [batch + lanes + 1, 7] int32 (lane, b, split, n, first, key_lo, key_hi; -7: no lane walks it)
    lane = tl.program_id(0)
    ragged, share, first, stop = balance.lane_span(seq_lens_ptr, lane, batch, capacity, lanes, MIN_CHUNK, BLOCK_N,
                                                   BLOCK_B, LANE_CAP)
    tl.store(span_ptr + lane * 4, ragged.to(tl.int32))
    tl.store(span_ptr + lane * 4 + 1, share)
    tl.store(span_ptr + lane * 4 + 2, first)
    tl.store(span_ptr + lane * 4 + 3, stop)
    for unit in range(first, stop):
        split, n, first_unit, lo, hi = balance.lane_piece(seq_lens_ptr, unit - lane, lane, share, batch, capacity,
                                                          BLOCK_N, BLOCK_B)
        row = unit_ptr + unit * 7
        tl.store(row, lane)
        tl.store(row + 1, unit - lane)
        tl.store(row + 2, split)
        tl.store(row + 3, n)
        tl.store(row + 4, first_unit)
        tl.store(row + 5, lo)
        tl.store(row + 6, hi)


def _plan(lens, lanes, *, block_n=64, min_chunk=128, capacity=1 << 20, merge_block_s=4, lane_cap=0):
    """(units, spans): per unit number its [lane, b, split, n, first, key_lo, key_hi] (-7: walked by
    no lane), per lane [ragged, share, first, stop]."""
    device = "cuda" if ON_GPU else "cpu"
    batch = len(lens)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    units = torch.full((batch + lanes + 1, 7), -7, dtype=torch.int32, device=device)
    spans = torch.full((lanes, 4), -7, dtype=torch.int32, device=device)
    _lanes_probe[(lanes,)](seq, units, spans, batch, capacity, lanes, MIN_CHUNK=min_chunk, BLOCK_N=block_n,
                           BLOCK_B=triton.next_power_of_2(batch),
                           LANE_CAP=lane_cap or balance.unit_cap(merge_block_s))  # (the plan's choice)
    return units.cpu().tolist(), spans.cpu().tolist()


def _share(lens, lanes, block_n, min_chunk, cap):
    """The plan's share written out again on the host (tiles plus the fixed cost a request)."""
    fixed = max(1, balance.LANE_FIXED_KEYS // block_n)
    cost = [max(1, -(-x // block_n)) + fixed for x in lens]
    return max(-(-sum(cost) // lanes), -(-max(cost) // (cap - 1)), max(1, min_chunk // block_n))


CASES = [
    pytest.param([6000, 3, 0, 970, 5, 64, 2049], 12, 64, id="7-ragged-with-0-12-lanes"),
    pytest.param([1, 88289, 7, 40000, 2, 0, 12000, 1], 33, 64, id="8-one-giant-33-lanes"),
    pytest.param([30000] + [1] * 40, 16, 64, id="41-one-long-many-one-key"),
    pytest.param([513, 17, 4096, 0, 0, 77], 5, 16, id="6-p16-tiles-5-lanes"),
    pytest.param([12000, 1], 132, 128, id="2-requests-132-lanes"),
]


def _check_cover(lens, lanes, block_n, min_chunk=128, merge_block_s=4, lane_cap=0):
    """Every tile of every request in exactly one unit, a request's units consecutive and in key
    order, each lane's units its own requests' pieces, no lane over the share, units under
    ``batch + lanes``, a request's units at most the cap."""
    units, spans = _plan(lens, lanes, block_n=block_n, min_chunk=min_chunk, merge_block_s=merge_block_s,
                         lane_cap=lane_cap)
    cap = lane_cap or balance.unit_cap(merge_block_s)
    share = _share(lens, lanes, block_n, min_chunk, cap)
    batch = len(lens)
    assert all(s[1] == share for s in spans), (spans, share)
    walked = [u for u in range(batch + lanes + 1) if units[u][0] != -7]
    assert walked and max(walked) < batch + lanes
    for lane, (_, _, first, stop) in enumerate(spans):  # a lane's units: its requests' pieces, b + lane
        assert all(units[u][0] == lane and units[u][1] == u - lane for u in range(first, stop)), (lane, first, stop)
    pieces = {b: [] for b in range(batch)}
    lane_tiles = [0] * lanes
    for u in walked:
        lane, b, split, n, first, lo, hi = units[u]
        assert first + split == u and 1 <= n <= cap, (u, units[u])
        assert lo % block_n == 0 and hi > lo, (u, units[u])
        pieces[b].append((split, n, first, lo, hi))
        lane_tiles[lane] += (hi - lo) // block_n
    assert max(lane_tiles) <= share, (lane_tiles, share)
    for b, got in pieces.items():
        got.sort()
        assert got, f"request {b} has no unit"
        n, first = got[0][1], got[0][2]
        assert [p[0] for p in got] == list(range(n)) and all(p[1:3] == (n, first) for p in got), (b, got)
        # consecutive pieces, from key 0 to the request's last tile (an empty request: one tile)
        assert got[0][3] == 0 and all(got[i][4] == got[i + 1][3] for i in range(n - 1)), (b, got)
        assert got[-1][4] == max(1, -(-lens[b] // block_n)) * block_n, (b, got, lens[b])
    return spans


@pytest.mark.parametrize("lens,lanes,block_n", CASES)
def test_the_lanes_cover_every_tile_once_in_order(lens, lanes, block_n):
    spans = _check_cover(lens, lanes, block_n)
    assert all(s[0] == 1 for s in spans), "every case here is ragged"


@pytest.mark.parametrize("seed", range(6))
def test_random_batches_are_covered_too(seed):
    """Random batches (1-40 requests, log-normal lengths with empty and one-key ones), lanes, tiles,
    merge rounds and caps: the same promises, ragged or not (the plan is computed either way)."""
    rng = random.Random(seed)
    batch = rng.randint(1, 40)
    lens = [rng.choice([0, 1, int(rng.lognormvariate(7, 1.5))]) for _ in range(batch)]
    _check_cover(lens, rng.randint(1, 40), rng.choice([16, 32, 64, 128]), min_chunk=rng.choice([16, 128, 512]),
                 merge_block_s=rng.choice([1, 2, 4]), lane_cap=rng.choice([0, 2, 64]))


def test_the_lanes_even_out_a_giant_among_tiny_requests():
    """One 88289-key request among tiny ones on 33 lanes: the busiest lane holds at most one share,
    and every lane but the last at least half of one (the deal's units of <= 2688 keys left half of
    its programs idle for the second half of such a launch on an H200)."""
    lens = [1, 88289, 7, 40000, 2, 0, 12000, 1]
    units, spans = _plan(lens, 33, block_n=64, min_chunk=128)
    share = spans[0][1]
    tiles = [sum((units[u][6] - units[u][5]) // 64 for u in range(first, stop)) for _, _, first, stop in spans]
    assert max(tiles) <= share and min(tiles[:-1]) >= share // 2, (tiles, share)


def test_a_uniform_batch_is_not_ragged():
    """Equal lengths (within 5/4 of the mean) leave the lanes off: the kernel deals the uniform split."""
    _, spans = _plan([1000, 990, 1010, 1000], 8)
    assert all(s[0] == 0 for s in spans)


@pytest.mark.parametrize("merge_block_s,lane_cap,cap", [(1, 0, 16), (4, 0, 32), (4, 64, 64)],
                         ids=["merge-1-cap-16", "merge-4-cap-32", "lane-cap-64"])
def test_a_long_request_takes_at_most_the_unit_cap(merge_block_s, lane_cap, cap):
    """200 lanes, one long request among short ones: the share grows so the long one spans at most
    ``unit_cap`` lanes (its merge's rounds stay bounded), or the config's ``balance_lanes_cap``."""
    units, _ = _plan([100000] + [64] * 30, 200, merge_block_s=merge_block_s, lane_cap=lane_cap)
    ns = [u[3] for u in units if u[0] != -7 and u[1] == 0]
    assert ns and cap // 2 < max(ns) <= cap, ns[:3]
