"""The bare read of a decode row's paged K and V at a given number of programs an SM: the floor under
the decode kernel's per-SM read rate on a ragged batch (lab/notes/decode-ragged-batches.md "sw12:
the lanes' request cap measured, and where its time goes").

Each program reads one equal, contiguous share of the batch's 64-key tiles (the lanes plan without
its cap or fixed costs), every tile's key rows found through the row's page table as the kernel
finds them (a random page permutation; each KV head's keys as a request of their own), K and V
into two products with a fixed 16-row operand (the decode kernel's pipelined copies and products
without its softmax). Arms:
1 / 2 / 3 / 4 programs an SM, the pages in table order or contiguous (the table the identity), 3 or 4
stages. Times and the copy ceiling as the benchmark takes them (``Timer.eager``,
``benchmarks/ceilings.py``); rows from the grid or the sweep.

    PYTHONPATH=src python lab/probes/paged_read_floor.py --filter "sw12 " --filter "16x4096 p64 NHD" --json x.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks import shapes, sweep  # noqa: E402
from benchmarks.ceilings import copy_gbps  # noqa: E402
from kvattn.benchmarking.timing import Timer  # noqa: E402

BLOCK_N = 64


@triton.jit
def paged_read_kernel(
    k_ptr,  # [pages * page, D] 16-bit key rows (one KV head)
    v_ptr,  # [pages * page, D] 16-bit value rows
    tile_rows_ptr,  # [tiles, BLOCK_N] int64 row of each key of each tile (a request's last tile padded)
    tile_lo_ptr,  # [programs + 1] int32 first tile of each program's share
    out_ptr,  # [programs, D] float32 sums (kept so the loads are not dropped)
    BLOCK_N: tl.constexpr, D: tl.constexpr,
):
    p = tl.program_id(0)
    lo = tl.load(tile_lo_ptr + p).to(tl.int64)
    hi = tl.load(tile_lo_ptr + p + 1).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    offs_m = tl.arange(0, 16)
    # A fixed 16-row operand: K and V feed two products, as in the decode kernel (Triton pipelines
    # the copies of loads that feed a dot through shared memory; elementwise uses stay plain loads),
    # but no softmax, scaling or masks.
    q = (offs_m[:, None] == offs_d[None, :] % 16).to(tl.float16)
    acc = tl.zeros([16, D], dtype=tl.float32)
    for t in range(lo, hi):
        # (the rows' load from the loop index: the pipeliner puts it a stage ahead of the copies)
        rows = tl.load(tile_rows_ptr + t * BLOCK_N + offs_n)
        k = tl.load(k_ptr + rows[:, None] * D + offs_d[None, :])
        v = tl.load(v_ptr + rows[:, None] * D + offs_d[None, :])
        s = tl.dot(q, tl.trans(k))
        acc += tl.dot(s.to(tl.float16), v)
    tl.store(out_ptr + p * D + offs_d, tl.sum(acc, 0))


def tile_rows(lens: list, page: int, table: torch.Tensor) -> torch.Tensor:
    """``[tiles, BLOCK_N]`` int64: each 64-key tile's key rows in the ``[pages * page, D]`` view,
    request by request (a request's last tile padded with its last key; an empty request none)."""
    out = []
    for b, n in enumerate(lens):
        if n <= 0:
            continue
        keys = torch.arange(-(-n // BLOCK_N) * BLOCK_N).clamp(max=n - 1)
        out.append(table[b, keys // page].long() * page + keys % page)
    return torch.cat(out).view(-1, BLOCK_N)


def shares(tiles: int, programs: int) -> torch.Tensor:
    """``[programs + 1]`` int32 bounds of equal contiguous shares of ``tiles``."""
    return (torch.arange(programs + 1, dtype=torch.int64) * tiles // programs).to(torch.int32)


def read_case(lens, page, head_dim, device, *, per_sm, sms, stages, contiguous, seed=0, timer=None):
    """``(us, bytes, sums, inputs)`` of one arm (``us`` None without a ``timer``: the interpreter
    checks the sums)."""
    g = torch.Generator().manual_seed(seed)
    width = max(-(-n // page) for n in lens)
    pages = len(lens) * width
    order = torch.arange(pages) if contiguous else torch.randperm(pages, generator=g)
    table = order.view(len(lens), width).to(torch.int32)
    k = torch.randn(pages * page, head_dim, generator=g).to(torch.float16).to(device)
    v = torch.randn(pages * page, head_dim, generator=g).to(torch.float16).to(device)
    rows = tile_rows(lens, page, table)
    programs = per_sm * sms
    lo = shares(rows.shape[0], programs)
    rows_d, lo_d = rows.to(device), lo.to(device)
    out = torch.empty(programs, head_dim, dtype=torch.float32, device=device)

    def call():
        paged_read_kernel[(programs,)](k, v, rows_d, lo_d, out, BLOCK_N=BLOCK_N, D=head_dim, num_warps=4,
                                       num_stages=stages)

    call()
    nbytes = rows.numel() * head_dim * 2 * 2
    us = timer.eager([call]) if timer is not None else None
    return us, nbytes, out.cpu(), (k.float().cpu(), v.float().cpu(), rows, lo)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--filter", action="append", required=True)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    timer = Timer(dev)
    copy = copy_gbps(timer)
    print(f"copy {copy:.0f} GB/s", flush=True)
    report = {"copy_gbs": copy, "rows": {}}
    for shape in shapes.select(shapes.GRID, filters=args.filter) + sweep.select(sweep.SWEEP, filters=args.filter):
        lens = [n for n in shape.seq_lens() for _ in range(shape.num_kv_heads)]  # (a KV head's keys: a request)
        for contiguous in (False, True):
            for per_sm in (1, 2, 3, 4):
                for stages in (3, 4):
                    us, nbytes, _, _ = read_case(lens, shape.page_size, shape.head_dim, dev, per_sm=per_sm, sms=sms,
                                                 stages=stages, contiguous=contiguous, timer=timer)
                    gbs = nbytes / us / 1e3
                    key = f"{shape.id} | {'contiguous' if contiguous else 'paged'} {per_sm}/SM {stages} stages"
                    report["rows"][key] = {"us": us, "bytes": nbytes, "gbs": gbs, "copy_frac": gbs / copy}
                    print(f"{key}: {us:.1f} us, {gbs:.0f} GB/s = {gbs / copy:.2f} of copy", flush=True)
                    if args.json:  # after every arm: a call's time limit keeps what was measured
                        Path(args.json).write_text(json.dumps(report, indent=1))
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
