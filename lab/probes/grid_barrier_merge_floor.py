"""What a grid barrier and a merge inside one persistent launch would cost, against a combine launch
(GPU only; the design in lab/notes/mla-ragged.md "Where FlashInfer's lead is").

A stand-in for the MLA split kernel's epilogue and the combine, sized like the rows where the
combine is kvattn's gap: one program an SM (8 warps) writes its share of the float32 split
partials ``[units, rows, 512]`` and their LSEs, as the split programs do at their end; then

* ``write``: nothing more (the floor: the split launch without a merge);
* ``barrier``: every program arrives on a counter in global memory and spins until all have (a
  generation count: the counter is never reset, so graph replays and repeated calls need nothing);
* ``barrier+merge``: after the barrier the programs merge the rows, ``ROWS`` rows at a time, each
  row's units through their LSEs (``common.softmax_merge.merge_partials``), and store bf16 rows;
* ``write+combine``: the barrier-free write, then a second launch of one 4-warp program a row
  merging it (the combine launch as kvattn runs it, without the programmatic dependent launch).

The difference ``barrier+merge - write`` is what an in-kernel merge adds to a split launch; against
``write+combine - write`` it says whether the grid barrier pays. Times: ``triton.testing.do_bench``
medians (L2 flushed before each call), eager. Every program of a barrier launch must be resident
at once: the grid is the SM count and each program needs far less than an SM; a spin stops after
``SPIN_LIMIT`` polls and flags it (the output then says so rather than hang).

    PYTHONPATH=src python3 lab/probes/grid_barrier_merge_floor.py --json out.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from kvattn.ops.common.softmax_merge import merge_partials

D = 512
SPIN_LIMIT = 1 << 22

# (name, rows = requests x heads, units a row): sw77 (5 x 128 heads, <= 15 units), sw70 (11 x 32,
# <= 33 units: 16 as a mean), 64 x 4096 at 64 and 16 heads (2 units each).
CASES = [("sw77-like", 5 * 128, 16), ("sw70-like", 11 * 32, 16), ("64x4096-Hq64", 64 * 64, 2),
         ("64x4096-Hq16", 64 * 16, 2)]


@triton.jit
def _write_share(part_o_ptr, part_lse_ptr, pid, grid, num_vecs, D: tl.constexpr):
    # part_o_ptr: [num_vecs, D] float32; part_lse_ptr: [num_vecs] float32
    # (num_vecs * D stays far below 2^31 in every case; the interpreter's loop index is a Python int)
    offs_d = tl.arange(0, D)
    one = tl.arange(0, 1)
    for v in range(pid, num_vecs, grid):
        val = (offs_d * 0 + v % 7).to(tl.float32) * 0.125 + offs_d.to(tl.float32) * 1e-3
        tl.store(part_o_ptr + v * D + offs_d, val)
        tl.store(part_lse_ptr + v + one, (one * 0 + v % 5).to(tl.float32))


@triton.jit
def _persistent_kernel(
    part_o_ptr,  # [units, rows, D] float32
    part_lse_ptr,  # [units, rows] float32
    out_ptr,  # [rows, D] bfloat16
    counter_ptr,  # [1] int32, never reset
    flag_ptr,  # [1] int32: set where a spin ran past SPIN_LIMIT polls
    rows, units,
    D: tl.constexpr, BARRIER: tl.constexpr, MERGE: tl.constexpr, ROWS: tl.constexpr, BLOCK_S: tl.constexpr,
    SPIN_LIMIT: tl.constexpr,
):
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    _write_share(part_o_ptr, part_lse_ptr, pid, grid, rows * units, D)
    if BARRIER:
        tl.debug_barrier()  # every thread's partial stores before the release (one thread arrives)
        old = tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
        target = (old // grid + 1) * grid
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        polls = 0
        while (seen - target < 0) & (polls < SPIN_LIMIT):
            seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
            polls += 1
        if polls >= SPIN_LIMIT:
            tl.atomic_max(flag_ptr, 1)
        tl.debug_barrier()
    if MERGE:
        offs_r = tl.arange(0, ROWS)
        offs_d = tl.arange(0, D)
        for r0 in range(pid * ROWS, rows, grid * ROWS):
            r = r0 + offs_r
            ok = r < rows
            m, den, acc = merge_partials(part_o_ptr, part_lse_ptr, r.to(tl.int64), ok, rows, units, D, BLOCK_S,
                                         False)
            o = acc / tl.where(den > 0, den, 1.0)[:, None]
            tl.store(out_ptr + r.to(tl.int64)[:, None] * D + offs_d[None, :], o.to(tl.bfloat16), mask=ok[:, None])


@triton.jit
def _combine_kernel(part_o_ptr, part_lse_ptr, out_ptr, rows, units, D: tl.constexpr, BLOCK_S: tl.constexpr):
    # part_o_ptr: [units, rows, D] float32; part_lse_ptr: [units, rows] float32; out_ptr: [rows, D] bfloat16
    r = tl.program_id(0) + tl.zeros([1], dtype=tl.int64)
    offs_d = tl.arange(0, D)
    m, den, acc = merge_partials(part_o_ptr, part_lse_ptr, r, r < rows, rows, units, D, BLOCK_S, False)
    o = acc / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(out_ptr + r[:, None] * D + offs_d[None, :], o.to(tl.bfloat16))


def _reference(part_o, part_lse):
    w = torch.softmax(part_lse.double() * torch.log(torch.tensor(2.0, dtype=torch.float64)), dim=0)
    return (w[:, :, None] * part_o.double()).sum(0)


def run_case(name, rows, units, sms, warps=8):
    dev = "cuda"
    part_o = torch.empty(units, rows, D, device=dev)
    part_lse = torch.empty(units, rows, device=dev)
    out = torch.empty(rows, D, device=dev, dtype=torch.bfloat16)
    counter = torch.zeros(1, device=dev, dtype=torch.int32)
    flag = torch.zeros(1, device=dev, dtype=torch.int32)
    block_s = triton.next_power_of_2(units)
    rows_at_once = max(1, min(8 * warps // 8, 16 * warps // 8 // block_s))  # ~32 float32 a thread a round

    def persistent(barrier, merge):
        return lambda: _persistent_kernel[(sms,)](part_o, part_lse, out, counter, flag, rows, units, D=D,
                                                  BARRIER=barrier, MERGE=merge, ROWS=rows_at_once,
                                                  BLOCK_S=block_s, SPIN_LIMIT=SPIN_LIMIT, num_warps=warps)

    def write_combine():
        persistent(False, False)()
        _combine_kernel[(rows,)](part_o, part_lse, out, rows, units, D=D, BLOCK_S=block_s, num_warps=4)

    res = {"case": name, "rows": rows, "units": units, "grid": sms, "warps": warps, "rows_at_once": rows_at_once}
    for label, fn in (("write", persistent(False, False)), ("barrier", persistent(True, False)),
                      ("barrier+merge", persistent(True, True)), ("write+combine", write_combine)):
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        if label in ("barrier+merge", "write+combine"):
            err = (out.double() - _reference(part_o, part_lse)).abs().max().item()
            res[f"{label} max err"] = err
        res[label] = triton.testing.do_bench(fn, warmup=25, rep=200)
    res["spin limit hit"] = bool(flag.item())
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--warps", type=int, nargs="+", default=[8], help="warps of the persistent programs")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = [run_case(*c, sms, w) for w in args.warps for c in CASES]
    print(f"{'case':14s} {'write':>8s} {'barrier':>8s} {'b+merge':>8s} {'w+comb':>8s}  (us)  merge adds / combine adds")
    for r in results:
        w = r["write"]
        print(f"{r['case'] + '/' + str(r['warps']):14s} {w * 1e3:8.1f} {r['barrier'] * 1e3:8.1f} {r['barrier+merge'] * 1e3:8.1f} "
              f"{r['write+combine'] * 1e3:8.1f}  {(r['barrier+merge'] - w) * 1e3:6.1f} / "
              f"{(r['write+combine'] - w) * 1e3:6.1f}  err {r['barrier+merge max err']:.1e} / "
              f"{r['write+combine max err']:.1e}{'  SPIN LIMIT HIT' if r['spin limit hit'] else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                           results=results), f, indent=1)


if __name__ == "__main__":
    main()
