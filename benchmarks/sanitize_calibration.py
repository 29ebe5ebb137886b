"""Calibration kernels for compute-sanitizer's racecheck: what it reports on exchanges that are
ordered by construction.

kvattn's warp-specialised Gluon kernels pass values between warpgroups through shared memory:
the writer's threads store, meet on a warpgroup barrier, one thread arrives on an mbarrier; the
reader's threads wait on that mbarrier, then load. The writes happen before the reads by the
PTX memory model (the arrive releases, the wait acquires, the barrier orders the writer's other
threads before the arriving one). Whether racecheck follows that chain is a property of the tool,
not of the kernels; these two kernels measure it on the smallest such exchange:

* ``exchange``: one value a row from the default partition to the worker partition and back,
  written once, read once (the MLA kernel's final row-sum exchange);
* ``exchange_loop``: the same slot rewritten on each of ``ROUNDS`` rounds, each write ordered
  after the other partition's read of the previous round by the next round's barriers (the MLA
  kernel's per-tile maxima).

* ``exchange_rows``: as ``exchange_loop``, with the values in the layout of a row of a wgmma
  accumulator (four lanes of a warp hold each row, and all four store it) and the slots slices of
  one buffer, as the MLA kernel's row maxima;
* ``exchange_meet``: both partitions publish, then meet on one barrier of two arrivals and read the
  other's (the row sums at the end of the MLA kernel's earlier version).
* ``exchange_quads``: as ``exchange_rows``, each row stored once per lane of the quad that holds it
  (a ``[64, 4]`` slot, one word a lane) and folded after the load, through the MLA kernel's own
  exchange pieces (``ops/mla/kernels_gluon_ws.py``: ``_publish_rows``, ``_read_rows``).

All check their results (a wrong value would be a real race). ``benchmarks/sanitize_driver.py``
runs them as the variants ``calibration_*`` (lab/notes/robustness.md "compute-sanitizer over every
kernel family").
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from kvattn.ops.common.gluon_compat import cta_barrier
from kvattn.ops.mla.kernels_gluon_ws import _publish_rows, _read_rows

ROWS = 128


@gluon.jit
def _there(x_smem, bars, out_ptr, ROUNDS: gl.constexpr):
    """Default partition (4 warps): round r writes slot 0, reads the worker's answer in slot 1."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout=layout)
    total = gl.zeros([128], gl.float32, layout=layout)
    for r in range(ROUNDS):
        x_smem.index(0).store(offs.to(gl.float32) + r)
        cta_barrier()
        mbarrier.arrive(bars.index(0), count=1)
        mbarrier.wait(bars.index(1), r & 1)
        total += x_smem.index(1).load(layout)
    gl.store(out_ptr + offs, total)


@gluon.jit
def _back(x_smem, bars, out_ptr, ROUNDS: gl.constexpr):
    """Worker partition (4 warps): reads slot 0, answers in slot 1 with the value doubled."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    for r in range(ROUNDS):
        mbarrier.wait(bars.index(0), r & 1)
        v = x_smem.index(0).load(layout)
        x_smem.index(1).store(2.0 * v)
        cta_barrier()
        mbarrier.arrive(bars.index(1), count=1)


@gluon.jit
def exchange_kernel(out_ptr,  # [128] float32: sum over rounds of 2 * (row + round)
                    ROUNDS: gl.constexpr):
    x_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    x_smem = gl.allocate_shared_memory(gl.float32, [2, 128], x_layout)
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    mbarrier.init(bars.index(1), count=1)
    gl.warp_specialize([(_there, (x_smem, bars, out_ptr, ROUNDS)), (_back, (x_smem, bars, out_ptr, ROUNDS))],
                       [4], [128])


ROW_LAYOUT: gl.constexpr = gl.constexpr(gl.SliceLayout(1, gl.NVMMADistributedLayout(
    version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])))


@gluon.jit
def _rows_there(x_smem, bars, out_ptr, ROUNDS: gl.constexpr, MEET: gl.constexpr):
    offs = gl.arange(0, 64, layout=ROW_LAYOUT)
    total = gl.zeros([64], gl.float32, layout=ROW_LAYOUT)
    if MEET:
        x_smem.slice(128, 64).store(offs.to(gl.float32))
        cta_barrier()
        mbarrier.arrive(bars.index(2), count=1)
        mbarrier.wait(bars.index(2), 0)
        total = x_smem.slice(192, 64).load(ROW_LAYOUT)
    else:
        for r in range(ROUNDS):
            x_smem.slice(0, 64).store(offs.to(gl.float32) + r)
            cta_barrier()
            mbarrier.arrive(bars.index(0), count=1)
            mbarrier.wait(bars.index(1), r & 1)
            total += x_smem.slice(64, 64).load(ROW_LAYOUT)
    gl.store(out_ptr + offs, total)


@gluon.jit
def _rows_back(x_smem, bars, out_ptr, ROUNDS: gl.constexpr, MEET: gl.constexpr):
    offs = gl.arange(0, 64, layout=ROW_LAYOUT)
    if MEET:
        x_smem.slice(192, 64).store(2.0 * offs.to(gl.float32))
        cta_barrier()
        mbarrier.arrive(bars.index(2), count=1)
        mbarrier.wait(bars.index(2), 0)
        mine = x_smem.slice(128, 64).load(ROW_LAYOUT)
        gl.store(out_ptr + 64 + offs, mine)
    else:
        for r in range(ROUNDS):
            mbarrier.wait(bars.index(0), r & 1)
            v = x_smem.slice(0, 64).load(ROW_LAYOUT)
            x_smem.slice(64, 64).store(2.0 * v)
            cta_barrier()
            mbarrier.arrive(bars.index(1), count=1)


@gluon.jit
def exchange_rows_kernel(out_ptr,  # [128] float32
                         ROUNDS: gl.constexpr, MEET: gl.constexpr):
    x_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    x_smem = gl.allocate_shared_memory(gl.float32, [256], x_layout)
    bars = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    mbarrier.init(bars.index(1), count=1)
    mbarrier.init(bars.index(2), count=2)
    gl.warp_specialize([(_rows_there, (x_smem, bars, out_ptr, ROUNDS, MEET)),
                        (_rows_back, (x_smem, bars, out_ptr, ROUNDS, MEET))], [4], [128])


@gluon.jit
def _quads_there(x_smem, bars, out_ptr, ROUNDS: gl.constexpr):
    offs = gl.arange(0, 64, layout=ROW_LAYOUT)
    total = gl.zeros([64], gl.float32, layout=ROW_LAYOUT)
    for r in range(ROUNDS):
        _publish_rows(x_smem, 0, offs.to(gl.float32) + r)
        cta_barrier()
        mbarrier.arrive(bars.index(0), count=1)
        mbarrier.wait(bars.index(1), r & 1)
        total += _read_rows(x_smem, 1, ROW_LAYOUT)
    gl.store(out_ptr + offs, total)


@gluon.jit
def _quads_back(x_smem, bars, out_ptr, ROUNDS: gl.constexpr):
    for r in range(ROUNDS):
        mbarrier.wait(bars.index(0), r & 1)
        v = _read_rows(x_smem, 0, ROW_LAYOUT)
        _publish_rows(x_smem, 1, 2.0 * v)
        cta_barrier()
        mbarrier.arrive(bars.index(1), count=1)


@gluon.jit
def exchange_quads_kernel(out_ptr,  # [128] float32 (the first 64 written)
                          ROUNDS: gl.constexpr):
    x_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    x_smem = gl.allocate_shared_memory(gl.float32, [128, 4], x_layout)
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    mbarrier.init(bars.index(1), count=1)
    gl.warp_specialize([(_quads_there, (x_smem, bars, out_ptr, ROUNDS)),
                        (_quads_back, (x_smem, bars, out_ptr, ROUNDS))], [4], [128])


def run(rounds: int, layout: str, meet: bool = False) -> None:
    """One calibration exchange and the check of its values: ``layout`` "thread" (``exchange``: 128
    values, one a thread), "rows" (``exchange_rows``: 64 values in a wgmma row layout, with the
    two-arrival ``meet`` or ``rounds`` one-way rounds) or "quads" (``exchange_quads``: the same 64
    values stored once a lane, ``rounds`` rounds)."""
    if layout == "thread":
        out = torch.full((ROWS,), float("nan"), device="cuda")
        exchange_kernel[(1,)](out, ROUNDS=rounds, num_warps=4)
        rows = torch.arange(ROWS, device="cuda", dtype=torch.float32)
    elif layout == "quads":
        out = torch.zeros(2 * 64, device="cuda")
        exchange_quads_kernel[(1,)](out, ROUNDS=rounds, num_warps=4)
        rows = torch.arange(64, device="cuda", dtype=torch.float32)
    else:
        out = torch.zeros(2 * 64, device="cuda")
        exchange_rows_kernel[(1,)](out, ROUNDS=rounds, MEET=meet, num_warps=4)
        rows = torch.arange(64, device="cuda", dtype=torch.float32)
    if meet:
        assert torch.equal(out[:64], 2.0 * rows) and torch.equal(out[64:], rows), "the meeting read too early"
    else:
        want = sum(2.0 * (rows + r) for r in range(rounds))
        assert torch.equal(out[: rows.numel()], want), "the exchange read a value before it was written"
