"""The combine's view of the balanced MLA plan (common.balance.request_units) against the split
kernel's (common.balance.launch_unit), run as Triton code: for every request, the unit count and
first unit the combine reads are exactly the units the split launch gave it, on equal batches
(which take the uniform split) and ragged ones (which take the balanced chunks)."""

from __future__ import annotations

import random

import pytest
import torch
import triton
import triton.language as tl

from kvattn.ops.common import balance

from ..oracle import ON_GPU


@triton.jit
def _plan_probe(seq_lens_ptr, unit_ptr, request_ptr, batch, capacity, uniform_splits, MIN_CHUNK: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, UNITS_CAP: tl.constexpr):
    # seq_lens_ptr: [batch] int32; unit_ptr: [batch * uniform_splits, 4] int32 (live, b, split, n);
    # request_ptr: [batch, 2] int32 (n, first), written by the first `batch` programs
    pid = tl.program_id(0)
    live, b, split, n = balance.launch_unit(seq_lens_ptr, pid, batch, capacity, uniform_splits, MIN_CHUNK, BLOCK_N,
                                            BLOCK_B, UNITS_CAP)
    tl.store(unit_ptr + pid * 4, live.to(tl.int32))
    tl.store(unit_ptr + pid * 4 + 1, b)
    tl.store(unit_ptr + pid * 4 + 2, split)
    tl.store(unit_ptr + pid * 4 + 3, n)
    if pid < batch:
        n_b, first = balance.request_units(seq_lens_ptr, pid, batch, capacity, uniform_splits, MIN_CHUNK, BLOCK_N,
                                           BLOCK_B, UNITS_CAP)
        tl.store(request_ptr + pid * 2, n_b)
        tl.store(request_ptr + pid * 2 + 1, first)


def _views(lens, uniform_splits, *, capacity=1 << 20, block_n=64, min_chunk=128, cap=32):
    device = "cuda" if ON_GPU else "cpu"
    batch = len(lens)
    seq = torch.tensor(lens, dtype=torch.int32, device=device)
    grid = max(batch * uniform_splits, batch)
    units = torch.full((grid, 4), -7, dtype=torch.int32, device=device)
    requests = torch.full((batch, 2), -7, dtype=torch.int32, device=device)
    _plan_probe[(grid,)](seq, units, requests, batch, capacity, uniform_splits, MIN_CHUNK=min_chunk,
                         BLOCK_N=block_n, BLOCK_B=triton.next_power_of_2(batch), UNITS_CAP=cap)
    return units.cpu().tolist(), requests.cpu().tolist()


def _expected(units, batch):
    """Per request (n, first) from the split launch's live units, which must be consecutive."""
    out = []
    for b in range(batch):
        mine = [u for u, (live, ub, _, _) in enumerate(units) if live and ub == b]
        assert mine == list(range(mine[0], mine[0] + len(mine))), f"request {b}'s units are not consecutive"
        assert [units[u][2] for u in mine] == list(range(len(mine)))
        assert {units[u][3] for u in mine} == {len(mine)}
        out.append([len(mine), mine[0]])
    return out


CASES = [
    ([4096] * 8, 2), ([4096] * 5, 3), ([1] * 4, 2), ([300, 320, 310], 4), ([1000], 6),
    ([1, 30000, 2, 5], 4), ([0, 40, 1, 3], 3), ([12000, 100, 100, 100, 100, 100], 2), ([64] * 3 + [9000], 8),
]


@pytest.mark.parametrize("lens,splits", CASES, ids=[f"B{len(c[0])}-S{c[1]}-{'x'.join(map(str, c[0][:3]))}"
                                                     for c in CASES])
def test_the_combine_reads_the_units_the_split_launch_wrote(lens, splits):
    units, requests = _views(lens, splits)
    assert requests == _expected(units, len(lens))


@pytest.mark.parametrize("seed", range(3))
def test_random_batches_agree_too(seed):
    rng = random.Random(seed)
    batch = rng.randint(1, 24)
    lens = [int(rng.lognormvariate(6, 2)) % 60000 for _ in range(batch)]
    units, requests = _views(lens, rng.randint(2, 6), cap=rng.choice([16, 32]))
    assert requests == _expected(units, batch)


def test_an_equal_batch_takes_the_uniform_split():
    _, requests = _views([2048] * 6, 3)
    assert requests == [[3, 3 * b] for b in range(6)]
