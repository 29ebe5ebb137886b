"""Tune the prefill kernel: time launch-config variants on the prefill benchmark shapes.

A variant is ``BLOCK_M x BLOCK_N x warps x stages`` (``128x64w8s3``), with a trailing ``o`` for the
overlapped full-tile loop (``128x64w8s3o``: ``PrefillConfig.overlap``, the next tile's Q.K^T on the
tensor cores during a softmax), and replaces the sm90 table's
entry of the shape's operand kind and head_dim for every call; shapes and inputs come from the
benchmark registry. Times are medians of CUDA-graph replays (``do_bench``, L2 flushed); the winners
go into ``src/kvattn/ops/prefill_configs.py``.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/tune_prefill.py --filter "1x8192x8192" --variants default,128x128w8s3,128x64w8s3o
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(_ROOT))
    sys.path.insert(0, str(_ROOT / "src"))

import torch  # noqa: E402

from benchmarks import problems, shapes  # noqa: E402
from benchmarks.timing import Timer  # noqa: E402

_VARIANT = re.compile(r"(\d+)x(\d+)w(\d+)s(\d+)(o?)")


@contextlib.contextmanager
def _forced(key: tuple, name: str):
    from kvattn.ops import prefill_configs

    table = prefill_configs.TABLES["sm90"]
    old = table[key]
    if name != "default":
        *sizes, overlap = _VARIANT.fullmatch(name).groups()
        table[key] = prefill_configs.PrefillConfig(*map(int, sizes), overlap=overlap == "o")
    try:
        yield
    finally:
        table[key] = old


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="default")
    ap.add_argument("--filter", action="append", default=[], help="keep shape ids containing this")
    ap.add_argument("--rep", type=int, default=100)
    args = ap.parse_args(argv)

    device = torch.device("cuda")
    timer = Timer(device, warmup_ms=25, rep_ms=args.rep)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    for shape in shapes._prefill_grid():
        if args.filter and not any(f in shape.id for f in args.filter):
            continue
        prob = problems.build(shape, device, l2_bytes=l2, workspace_mib=128)
        fns = [s.kvattn for s in prob.sets]
        if shape.q_dtype == "fp8" and shape.kv_dtype == "fp8":
            kind = "fp8"
        else:
            kind = "half" if shape.kv_dtype in ("bfloat16", "float16") else "dequant"
        key = (kind, shape.head_dim)
        for name in [v for v in args.variants.split(",") if v]:
            try:
                us = timer.graph(fns, context=lambda name=name: _forced(key, name))
            except Exception as exc:  # noqa: BLE001 - a variant that fails to compile is reported
                print(f"{shape.id:40s} {name:12s} FAILED {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
            print(f"{shape.id:40s} {name:12s} {us:9.1f} us {prob.work.flops / us * 1e-6:7.1f} TFLOP/s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
