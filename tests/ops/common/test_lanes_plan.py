"""The lanes plan of a ragged batch (``common.balance.lane_items`` / ``lane_unit``), read back from
the kernel side for every lane and unit (a small kernel, interpreted on the CPU): the lanes take
consecutive units and every unit once, each request's units tile its keys in order without a gap
or an overlap, a request never has more units than the merge's cap, the units number at most
lanes + batch (the host's workspace bound), and no lane's cost passes the share, so the lanes
end within a unit's fixed cost of one another."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kvattn.ops.common import balance

BLOCK_N = 64
MIN_CHUNK = 512
MERGE_BLOCK_S = 4


@triton.jit
def _read_lanes(seq_lens_ptr, out_lane_ptr, out_unit_ptr, batch, capacity, uniform_splits, lanes, max_units,
                MIN_CHUNK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, MERGE_BLOCK_S: tl.constexpr):
    # out_lane_ptr: [lanes, 3] (first, end, ragged) units of each lane
    # out_unit_ptr: [max_units, 6] (b, split, n_splits, first_unit, tile_lo, tile_hi) of each unit
    lane = tl.program_id(0)
    # (one item a unit, a program a lane)
    ragged, first, end = balance.lane_items(seq_lens_ptr, lane, lanes, batch, capacity, uniform_splits, 1, MIN_CHUNK,
                                            BLOCK_N, BLOCK_B, MERGE_BLOCK_S)
    tl.store(out_lane_ptr + lane * 3, first)
    tl.store(out_lane_ptr + lane * 3 + 1, end)
    tl.store(out_lane_ptr + lane * 3 + 2, ragged.to(tl.int32))
    if not ragged:  # a uniform batch's units, which the kernel deals: every lane reads them all
        first = 0
        end = batch * uniform_splits
    for unit in range(first, tl.minimum(end, max_units)):
        b, split, n_b, first_unit, lo, hi = balance.lane_unit(seq_lens_ptr, unit, lanes, batch, capacity,
                                                              uniform_splits, MIN_CHUNK, BLOCK_N, BLOCK_B,
                                                              MERGE_BLOCK_S)
        row = out_unit_ptr + unit * 6
        tl.store(row, b)
        tl.store(row + 1, split)
        tl.store(row + 2, n_b)
        tl.store(row + 3, first_unit)
        tl.store(row + 4, lo)
        tl.store(row + 5, hi)


def _plan(lens: list[int], lanes: int, uniform_splits: int = 3):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seq = torch.tensor(lens, dtype=torch.int32, device=dev)
    max_units = lanes + len(lens) + len(lens) * uniform_splits
    out_lane = torch.full((lanes, 3), -7, dtype=torch.int32, device=dev)
    out_unit = torch.full((max_units, 6), -7, dtype=torch.int32, device=dev)
    block_b = triton.next_power_of_2(len(lens))
    _read_lanes[(lanes,)](seq, out_lane, out_unit, len(lens), max(lens) + 1, uniform_splits, lanes, max_units,
                          MIN_CHUNK=MIN_CHUNK, BLOCK_N=BLOCK_N, BLOCK_B=block_b, MERGE_BLOCK_S=MERGE_BLOCK_S)
    return out_lane.cpu().tolist(), out_unit.cpu().tolist()


RAGGED = {
    "one-giant-among-tiny": [88289, 3, 0, 97, 5, 1, 640, 2049],
    "sw07-like": [31000, 85831, 64000, 2, 40000, 51000, 12000, 77000, 9000, 1, 66000],
    "empty-and-one-key": [5000, 0, 1, 0, 700],
    "lengths-off-the-tile": [65, 63, 129, 4097, 1],
}


@pytest.mark.parametrize("lanes", [7, 33, 132], ids=lambda n: f"lanes{n}")
@pytest.mark.parametrize("lens", list(RAGGED.values()), ids=list(RAGGED))
def test_lanes_cover_every_key_tile_once(lens, lanes):
    lane_rows, unit_rows = _plan(lens, lanes)
    cap = balance.unit_cap(MERGE_BLOCK_S)
    # lanes take consecutive units, from unit 0, each unit once
    ends = [0]
    for first, end, ragged in lane_rows:
        assert first == ends[-1] and end >= first and ragged == 1, lane_rows
        ends.append(end)
    units = ends[-1]
    assert units <= lanes + len(lens)
    units_of = {b: [] for b in range(len(lens))}
    for u in range(units):
        b, split, n_b, first_unit, lo, hi = unit_rows[u]
        assert 0 <= b < len(lens) and first_unit + split == u, unit_rows[u]
        units_of[b].append((split, n_b, first_unit, lo, hi))
    tile_cost = max(1, 128 // BLOCK_N)
    for b, mine in units_of.items():
        tiles = -(-lens[b] // BLOCK_N)
        assert mine, f"request {b} has no unit"
        n_b = mine[0][1]
        assert len(mine) == n_b <= cap, (b, mine)
        assert [m[0] for m in mine] == list(range(n_b))
        # the units tile the request's keys in order: [0, tiles) with no gap or overlap
        at = 0
        for _, _, _, lo, hi in mine:
            assert lo == at and hi >= lo, (b, mine)
            at = hi
        assert at == tiles, (b, at, tiles)
    # each lane's cost (its tiles, plus a unit's fixed cost where a request's first unit is) is
    # within the share: over it by less than a fixed cost where a lane edge cuts one
    tiles_of, loads = [], []
    for first, end, _ in lane_rows:
        spans = [unit_rows[u] for u in range(first, end)]
        tiles_of.append(sum(hi - lo for _, _, _, _, lo, hi in spans))
        loads.append(tiles_of[-1] + sum(tile_cost for _, split, *_ in spans if split == 0))
    total = sum(-(-n // BLOCK_N) + tile_cost for n in lens)
    share = max(-(-total // lanes), -(-max(-(-n // BLOCK_N) + tile_cost for n in lens) // (cap - 1)),
                -(-MIN_CHUNK // BLOCK_N))
    assert max(tiles_of) <= share and max(loads) < share + tile_cost, (loads, share)
    if share == -(-total // lanes):  # (not raised by the cap or the shortest unit) every lane busy but the last
        assert min(loads[:-1]) > share - 2 * tile_cost, (loads, share)


def test_a_uniform_batch_keeps_the_uniform_split_for_the_deal():
    lens = [1000, 990, 1010, 1000]
    lane_rows, unit_rows = _plan(lens, lanes=5, uniform_splits=3)
    assert all(ragged == 0 for _, _, ragged in lane_rows), lane_rows
    for u in range(12):
        b, split, n_b, first_unit, lo, _ = unit_rows[u]
        assert (b, split, n_b, first_unit, lo) == (u // 3, u % 3, 3, u - u % 3, -1)


def test_the_kernels_unit_cost_is_the_hosts():
    import inspect

    for fn in (balance._lane_counts, balance.lane_unit):
        assert f"UNIT_KEYS: tl.constexpr = {balance.LANE_UNIT_KEYS}" in inspect.getsource(fn.fn)
