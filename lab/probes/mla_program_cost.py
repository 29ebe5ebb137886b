"""What one MLA program pays besides its tiles, kvattn against FlashInfer's fa3 MLA (GPU; FlashInfer
optional: source ``.peers/flashinfer/activate.sh`` first, carry [".peers"]).

Equal batches sized so that every launch is one wave of one-split programs, one a request and head
block (132 requests at 16 and 64 heads, 66 at 128: two head blocks), each request ``tiles`` 64-key
tiles long, bf16, pages of 64, CUDA-graph replay with L2 flushed (``benchmarks/runner.run_shape``,
as the benchmark times its rows). The time against the tiles a program walks is a line: its slope
the per-tile rate, its intercept what a program costs before and after its tiles (launch, query
staged, pipeline fill, output written). lab/notes/mla-ragged.md "Lanes for the MLA split launch"
asks for it: sw77's programs hold 8-9 tiles, where a fixed cost of a few tiles would explain why
one tile less measured nothing.

    PYTHONPATH=src python3 lab/probes/mla_program_cost.py --json out.json [--tiles 2 4 8 16 32]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))
from benchmarks import ceilings as ceilings_mod  # noqa: E402
from benchmarks.runner import Options, run_shape  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402
from kvattn.benchmarking.timing import Timer  # noqa: E402

LAYOUTS = ((16, 132), (64, 132), (128, 66))  # (heads, requests): one wave of one-split programs


def _fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1e-12)
    return my - slope * mx, slope


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--tiles", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    ap.add_argument("--no-fi", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    timer = Timer(dev, 10, 40)
    ceilings = ceilings_mod.measure(dev, timer)
    opt = Options(peers=not args.no_fi, flex=False, flashinfer=not args.no_fi, graph_only=True, sdpa_backends=())
    opt.l2_bytes = torch.cuda.get_device_properties(dev).L2_cache_size
    rows = []
    for heads, batch in LAYOUTS:
        for tiles in args.tiles:
            shape = Shape("mla", batch, tiles * 64, num_qo_heads=heads, num_kv_heads=1, head_dim=576, page_size=64,
                          kv_dtype="bfloat16", q_dtype="bfloat16")
            recs = run_shape(shape, dev, timer, ceilings, opt, log=lambda *a: None)
            us = {r["impl"]: r.get("graph_us") for r in recs if r.get("status") == "ok"}
            rows.append(dict(heads=heads, batch=batch, tiles=tiles, kvattn=us.get("kvattn"),
                             fi=next((v for k, v in us.items() if k.startswith("fi-")), None)))
            print(f"Hq {heads:3d} B {batch:3d} tiles {tiles:3d}: kvattn {us.get('kvattn')}, FI {rows[-1]['fi']}",
                  flush=True)
    fits = {}
    for heads, _ in LAYOUTS:
        mine = [r for r in rows if r["heads"] == heads]
        for impl in ("kvattn", "fi"):
            pts = [(r["tiles"], r[impl]) for r in mine if r[impl]]
            if len(pts) >= 2:
                fits[f"{impl} Hq {heads}"] = _fit(*zip(*pts))
    for name, (a, b) in fits.items():
        print(f"{name:14s} fixed {a:6.2f} us a program, {b:5.3f} us a tile ({a / b:4.1f} tiles' worth)")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(ceilings=ceilings, rows=rows, fits=fits), indent=1))


if __name__ == "__main__":
    main()
