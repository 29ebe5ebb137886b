"""Per-kernel GPU time of the kvattn call of benchmark rows (grid or sweep), by torch.profiler.

Where a row's time goes between its launches (split, combine, plan), to tell which one a change
slowed. Eager calls after a warm-up, L2 not flushed (relative numbers: run every tree the same way).
Run from a tree's root with that tree's ``src`` first on the path; the registry comes from this
tree's ``benchmarks``.

    PYTHONPATH=src python3 lab/probes/kernel_times.py --filter sw71 --filter "Hq64 64x4096" --json out.json
    PYTHONPATH=src python3 lab/probes/kernel_times.py --filter "Hq64 64x4096" --ab unif:mla:min_chunk=2048

``--ab`` (benchmarks/run.py's spelling) also times each row under that config override. ``--fi``
also profiles FlashInfer's kernels of each row (staged in .peers: carry [".peers"], source
``.peers/flashinfer/activate.sh`` first; its modules built before the timing, as ``--fi-prebuild``),
to tell a peer's main kernel from its merge.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path.cwd()))
from benchmarks import problems, shapes, sweep  # noqa: E402
from benchmarks.run import parse_ab  # noqa: E402
from benchmarks.runner import _config_override  # noqa: E402


def _per_kernel(call, calls: int) -> dict:
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    per = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name[:60]] += ev.device_time / calls
    return dict(per)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--filter", action="append", required=True)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--label", default="")
    ap.add_argument("--ab", action="append", default=[], metavar="LABEL:FAMILY:FIELD=VALUE[,...]")
    ap.add_argument("--fi", action="store_true", help="also FlashInfer's kernels of each row")
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = shapes.select(shapes.GRID, filters=args.filter)
    rows += sweep.select(sweep.SWEEP, filters=args.filter)
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    report = {}
    if args.fi:
        from benchmarks import peers_flashinfer

        peers_flashinfer.prebuild(rows, log=lambda m: print(m, file=sys.stderr, flush=True))
    for shape in rows:
        prob = problems.build(shape, dev, l2_bytes=l2, workspace_mib=256)
        if args.fi:
            for name, build in peers_flashinfer.variants(prob):
                try:
                    peer = build()
                except Exception as exc:  # a peer that refuses the shape, or no flashinfer
                    print(f"{name} {shape.id}: not run ({type(exc).__name__}: {exc})"[:300], flush=True)
                    continue
                per = _per_kernel(peer.fns[0], args.calls)
                report[f"{name} {shape.id}"] = per
                print(f"{name} {shape.id}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items())), flush=True)
        call = prob.sets[0].kvattn
        arms = [(args.label, None)] + [(label, _config_override(fam, fields))
                                       for label, fam, fields in map(parse_ab, args.ab)]
        for label, context in arms:
            if context is None:
                per = _per_kernel(call, args.calls)
            else:
                with context():
                    per = _per_kernel(call, args.calls)
            report[f"{label} {shape.id}".strip()] = per
            print(f"{label} {shape.id}: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items())), flush=True)
        del prob
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
