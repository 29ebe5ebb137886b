"""The loop the config-tuning scripts share: time named variants of a family's launch config on
the registry's shapes (CUDA-graph replay, ``do_bench`` median, L2 flushed) and print one line each.

A variant that fails (e.g. does not compile) is reported and the loop goes on.
"""

from __future__ import annotations

import argparse
from typing import Callable, ContextManager, Iterable

import torch

from benchmarks import problems
from benchmarks.shapes import Shape
from kvattn.benchmarking.timing import Timer


def parse_args(doc: str, argv=None, extra: Callable[[argparse.ArgumentParser], object] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if extra is not None:
        extra(ap)
    ap.add_argument("--variants", default="default", help="comma-separated variant names")
    ap.add_argument("--filter", action="append", default=[], help="keep shape ids containing this")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    return ap.parse_args(argv)


def time_variants(grid: Iterable[Shape], args: argparse.Namespace,
                  context_for: Callable[[Shape, str], Callable[[], ContextManager]], *, workspace_mib: int) -> None:
    """For every shape of ``grid`` kept by ``args.filter`` and every variant of ``args.variants``:
    capture the kvattn call under ``context_for(shape, name)()`` and print its replay time."""
    device = torch.device("cuda")
    timer = Timer(device, warmup_ms=25, rep_ms=args.rep)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    for shape in grid:
        if args.filter and not any(f in shape.id for f in args.filter):
            continue
        prob = problems.build(shape, device, l2_bytes=l2, workspace_mib=workspace_mib)
        fns = [s.kvattn for s in prob.sets]
        for name in [v for v in args.variants.split(",") if v]:
            try:
                us = timer.graph(fns, context=context_for(shape, name))
            except Exception as exc:  # noqa: BLE001 - a variant that fails to compile is reported
                print(f"{shape.id:40s} {name:12s} FAILED {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
            print(f"{shape.id:40s} {name:12s} {us:9.1f} us {prob.work.flops / us * 1e-6:7.1f} TFLOP/s "
                  f"{prob.work.bytes / us * 1e-3:7.1f} GB/s", flush=True)
