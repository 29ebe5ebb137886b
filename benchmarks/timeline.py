"""Per-program timelines of decode launches, in the benchmark's measurement (L2 flushed, graph replay).

Where the time of a split launch goes: when its programs start and end (``%globaltimer``), on
which SM (``%smid``), how many share an SM, when the combine kernel leaves its grid-dependency
wait and ends. Bare reads of the same bytes, with a static grid-stride split and with blocks
claimed from an atomic counter, are traced the same way for comparison. The package is not
changed: the decode kernels are instrumented in a temporary copy of ``src/kvattn`` (text patches
that fail loudly when the kernel source moves) and imported from there.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/timeline.py --out $OUT/timeline.json
    PYTHONPATH=src python benchmarks/timeline.py --filter "L32768" --variants stream128nohint --no-readers

Times are microseconds from the first program's start, medians over ``--reps`` replays.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
REGION = 1 << 20  # int64 slots: split programs [0, R), combine programs [R, 2R), merges [2R, 3R), marker at 3R

# (old, new) text patches of ops/decode/kernels.py: timestamps at entry, after gdc_wait, at the end.
_HELPERS = '''import os
from benchmarks.timeline import _now as _gtime, _smid
TRACE_ADDR = tl.constexpr(int(os.environ.get("KVATTN_TRACE_ADDR", "0")))


@triton.jit
def _trace_put(slot, value):
    base = tl.full([1], TRACE_ADDR, tl.int64).to(tl.pointer_type(tl.int64))
    tl.store(base + slot + tl.arange(0, 1), value.to(tl.int64) + tl.zeros([1], tl.int64))


'''
PATCHES = [
    ("try:  # grid dependency control", _HELPERS + "try:  # grid dependency control"),
    ("    if USE_PDL:\n        gdc_wait()\n    # Two call sites",
     "    pid0 = tl.program_id(0)\n    t0 = _gtime(pid0)\n    if USE_PDL:\n        gdc_wait()\n"
     "    t1 = _gtime(pid0)\n    # Two call sites"),
    ("    if USE_PDL:\n        # At the end, not the start",
     "    t2 = _gtime(pid0)\n    _trace_put(pid0 * 4, _smid(pid0))\n    _trace_put(pid0 * 4 + 1, t0)\n"
     "    _trace_put(pid0 * 4 + 2, t1)\n    _trace_put(pid0 * 4 + 3, t2)\n"
     "    if USE_PDL:\n        # At the end, not the start"),
    ("    h = tl.program_id(1)\n    if USE_PDL:\n        gdc_wait()",
     "    h = tl.program_id(1)\n    c0 = _gtime(h)\n    if USE_PDL:\n        gdc_wait()\n    c1 = _gtime(h)"),
    ("        tl.store(lse_ptr + t.to(tl.int64) * stride_lse_t + heads, lse2, mask=row_ok)\n\n\n__all__",
     "        tl.store(lse_ptr + t.to(tl.int64) * stride_lse_t + heads, lse2, mask=row_ok)\n    c2 = _gtime(h)\n"
     f"    cs = {REGION} + (t * NUM_HEADS + h) * 4\n    _trace_put(cs, _smid(h))\n    _trace_put(cs + 1, c0)\n"
     "    _trace_put(cs + 2, c1)\n    _trace_put(cs + 3, c2)\n\n\n__all__"),
    # the in-kernel merge (MERGE): when the item's last split program starts and ends merging
    ("            tl.atomic_xchg(count_ptr, 0, sem=\"relaxed\", scope=\"gpu\")\n",
     "            tl.atomic_xchg(count_ptr, 0, sem=\"relaxed\", scope=\"gpu\")\n"
     f"            _trace_put({2 * REGION} + item * 2, _gtime(item))\n"),
    ("                tl.store(lse_ptr + mg_rows * stride_lse_t + mg_heads, mg_lse2, mask=mg_ok)\n",
     "                tl.store(lse_ptr + mg_rows * stride_lse_t + mg_heads, mg_lse2, mask=mg_ok)\n"
     f"            _trace_put({2 * REGION} + item * 2 + 1, _gtime(item))\n"),
]


@triton.jit
def _now(x):
    """The global nanosecond timer (``x``: any scalar, to give the asm an operand)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _smid(x):
    """The SM the program runs on."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _record(tr_ptr, pid, t0, t2):
    o = tl.arange(0, 1)
    z = tl.zeros([1], tl.int64)
    tl.store(tr_ptr + pid * 4 + o, _smid(pid).to(tl.int64) + z)
    tl.store(tr_ptr + pid * 4 + 1 + o, t0 + z)
    tl.store(tr_ptr + pid * 4 + 2 + o, t0 + z)
    tl.store(tr_ptr + pid * 4 + 3 + o, t2 + z)


@triton.jit
def marker(ptr):
    tl.store(ptr + tl.arange(0, 1), _now(tl.program_id(0)) + tl.zeros([1], tl.int64))


@triton.jit
def static_reader(x_ptr, out_ptr, tr_ptr, n_blocks, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t0 = _now(pid)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(pid, n_blocks, tl.num_programs(0)):
        acc += tl.load(x_ptr + i.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))
    _record(tr_ptr, pid, t0, _now(pid))


@triton.jit
def claiming_reader(x_ptr, out_ptr, ctr_ptr, tr_ptr, n_claims, BLOCK: tl.constexpr, SUB: tl.constexpr):
    pid = tl.program_id(0)
    t0 = _now(pid)
    acc = tl.zeros([BLOCK], tl.float32)
    c = tl.atomic_add(ctr_ptr, 1, sem="relaxed")
    while c < n_claims:
        nxt = tl.atomic_add(ctr_ptr, 1, sem="relaxed")  # the next claim's latency overlaps these loads
        base = c.to(tl.int64) * (SUB * BLOCK)
        for j in tl.static_range(SUB):
            acc += tl.load(x_ptr + base + j * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
        c = nxt
    tl.store(out_ptr + pid, tl.sum(acc))
    _record(tr_ptr, pid, t0, _now(pid))


def instrumented_copy(dest: Path) -> Path:
    """Copy ``src/kvattn`` under ``dest`` with the timeline patches applied; returns the path to
    put first on ``sys.path``."""
    shutil.copytree(ROOT / "src" / "kvattn", dest / "kvattn", ignore=shutil.ignore_patterns("__pycache__"))
    path = dest / "kvattn" / "ops" / "decode" / "kernels.py"
    text = path.read_text()
    for old, new in PATCHES:
        if text.count(old) != 1:
            raise RuntimeError(f"timeline patch no longer applies to decode/kernels.py: {old[:60]!r}")
        text = text.replace(old, new)
    path.write_text(text)
    return dest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--filter", action="append", default=[], help="keep shape ids containing this")
    ap.add_argument("--variants", default="", help="tune_decode variants to trace besides the default")
    ap.add_argument("--no-readers", action="store_true", help="skip the bare reads")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--noflush", action="store_true", help="replay without flushing L2 before each replay")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch

    dev = torch.device("cuda")
    trace = torch.full((3 * REGION + 64,), -1, dtype=torch.int64, device=dev)
    os.environ["KVATTN_TRACE_ADDR"] = str(trace.data_ptr())  # read when the copy's kernels are defined
    tmp = Path(tempfile.mkdtemp(prefix="kvattn-timeline-"))
    sys.path[:0] = [str(instrumented_copy(tmp)), str(ROOT)]
    for name in [m for m in sys.modules if m == "kvattn" or m.startswith("kvattn.")]:
        del sys.modules[name]
    import kvattn

    assert str(tmp) in kvattn.__file__, kvattn.__file__
    from benchmarks import problems
    from benchmarks.shapes import Shape
    from kvattn.benchmarking.timing import capture_graphs
    from benchmarks.tune_decode import variant

    sms = torch.cuda.get_device_properties(dev).multi_processor_count

    def summarise(tr, mark: int) -> dict:
        split = tr[:REGION].view(-1, 4)
        written = split[:, 1] > 0
        split = split[written]
        pids = torch.nonzero(written).flatten()
        sm, t0, t1, t2 = (split[:, i] - (0 if i == 0 else mark) for i in range(4))
        per_sm_max = 0
        for s in sm.unique().tolist():
            sel = sm == s
            ev = sorted([(a, 1) for a in t0[sel].tolist()] + [(b, -1) for b in t2[sel].tolist()])
            live = 0
            for _, d in ev:
                live += d
                per_sm_max = max(per_sm_max, live)
        first = int(t0.min())
        q = torch.quantile((t2 - first).double() / 1e3, torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0], dtype=torch.float64))
        r = {"programs": len(split), "sms": int(sm.unique().numel()), "max_per_sm": per_sm_max,
             "start_spread_us": float(t0.max() - first) / 1e3,
             "end_us": [round(float(v), 2) for v in q], "end_us_quantiles": [0, 0.1, 0.5, 0.9, 1.0],
             "duration_us": {int(p): float(d) / 1e3 for p, d in zip(pids.tolist(), (t2 - t1).tolist())},
             "sm_of": {int(p): int(s) for p, s in zip(pids.tolist(), sm.tolist())}}
        comb = tr[REGION:2 * REGION].view(-1, 4)
        comb = comb[comb[:, 1] > 0]
        if len(comb):
            r["combine_wait_exit_us"] = float(comb[:, 2].min() - mark - first) / 1e3
            r["combine_end_us"] = float(comb[:, 3].max() - mark - first) / 1e3
        merge = tr[2 * REGION:3 * REGION].view(-1, 2)
        merge = merge[merge[:, 0] > 0]
        if len(merge):
            r["merge_start_us"] = float(merge[:, 0].max() - mark - first) / 1e3
            r["merge_us"] = float((merge[:, 1] - merge[:, 0]).max()) / 1e3
        r["total_us"] = r.get("combine_end_us", float(q[-1]))
        return r

    def trace_fns(fns, reps: int) -> dict:
        graphs = capture_graphs(fns)
        flush = torch.empty(256 << 20, dtype=torch.int8, device=dev)
        runs = []
        for i in range(reps + 3):
            trace[:3 * REGION].fill_(-1)
            if not args.noflush:
                flush.zero_()  # as do_bench does before each timed call
            marker[(1,)](trace[3 * REGION:])
            graphs[i % len(graphs)].replay()
            torch.cuda.synchronize()
            if i >= 3:
                tr = trace.cpu()
                runs.append(summarise(tr, int(tr[3 * REGION])))
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("start_spread_us", "total_us", "combine_wait_exit_us", "combine_end_us", "merge_start_us",
                         "merge_us") if k in runs[0]}
        med["end_us"] = [statistics.median(r["end_us"][j] for r in runs) for j in range(5)]
        med.update({k: runs[0][k] for k in ("programs", "sms", "max_per_sm", "end_us_quantiles")})
        # per-program durations, averaged over the first and second halves of the replays: how
        # consistently the same programs (on the same SMs) are the slow ones
        pids = sorted(runs[0]["duration_us"])
        halves = [[statistics.mean(r["duration_us"].get(p, 0.0) for r in part) for p in pids]
                  for part in (runs[:len(runs) // 2], runs[len(runs) // 2:])]
        a, b = (torch.tensor(h, dtype=torch.float64) for h in halves)
        med["duration_consistency"] = float(torch.corrcoef(torch.stack([a, b]))[0, 1]) if len(pids) > 2 else 1.0
        med["duration_us_by_program"] = [round(float(v), 2) for v in (a + b) / 2]
        med["duration_rel_spread"] = float((a.max() - a.min()) / a.mean())
        return med

    def line(name: str, r: dict) -> str:
        ends = " ".join(f"{v:6.1f}" for v in r["end_us"])
        comb = f"  combine end {r['combine_end_us']:6.1f}" if "combine_end_us" in r else ""
        if "merge_us" in r:
            comb += f"  last merge starts {r['merge_start_us']:6.1f}, longest merge {r['merge_us']:5.2f}"
        return (f"{name:56s} {r['programs']:5d} programs, <= {r['max_per_sm']} an SM; ends (min/p10/med/p90/max) "
                f"{ends}{comb}; program durations spread {r['duration_rel_spread']:.3f}, "
                f"consistency {r['duration_consistency']:.2f}")

    shapes = [
        Shape("decode", 16, 4096),
        Shape("decode", 1, 32768),
        Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32),
        Shape("single_decode", 1, 32768, num_qo_heads=32, num_kv_heads=32),
        Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode="ROPE_LLAMA"),
    ]
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "triton": triton.__version__,
           "rows": {}}
    for shape in shapes:
        if args.filter and not any(f in shape.id for f in args.filter):
            continue
        prob = problems.build(shape, dev, l2_bytes=l2, workspace_mib=128)
        fns = [s.kvattn for s in prob.sets]
        for name in ["default"] + [v for v in args.variants.split(",") if v]:
            with variant(name):
                r = out["rows"][f"{shape.id} | kvattn {name}"] = trace_fns(fns, args.reps)
            print(line(f"{shape.id} | kvattn {name}", r), flush=True)
        if args.no_readers or shape.pos_encoding_mode != "NONE":
            continue
        x = torch.randn(int(prob.work.bytes) // 2, dtype=torch.float16, device=dev)
        res = torch.empty(16 * sms, device=dev)
        ctr = torch.zeros(1, dtype=torch.int32, device=dev)
        readers = {}
        for per_sm, block in ((4, 4096), (8, 2048)):
            def static(p=per_sm * sms, b=block, x=x):
                static_reader[(p,)](x, res, trace, x.numel() // b, BLOCK=b, num_warps=4)
            readers[f"static read {per_sm}/SM x {block * 2 // 1024} KB"] = static
        for per_sm, block, sub in ((4, 4096, 4), (8, 2048, 4), (8, 2048, 8)):
            def claim(p=per_sm * sms, b=block, s=sub, x=x):
                ctr.zero_()
                claiming_reader[(p,)](x, res, ctr, trace, x.numel() // (b * s), BLOCK=b, SUB=s, num_warps=4)
            readers[f"claiming read {per_sm}/SM x {sub} x {block * 2 // 1024} KB"] = claim
        for name, fn in readers.items():
            r = out["rows"][f"{shape.id} | {name}"] = trace_fns([fn], args.reps)
            print(line(f"{shape.id} | {name}", r), flush=True)
        del prob, x
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
