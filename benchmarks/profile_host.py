"""Host time of eager kvattn calls: wall microseconds per call and a cProfile of where it goes.

The BENCHMARKS.md target is <= 20 us of host time per eager call at batch-1 decode. The GPU work
of these shapes is shorter than the host path, so the loop below measures the host: calls are
queued back to back and synchronised once at the end.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/profile_host.py [--calls 2000] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(_ROOT))
    sys.path.insert(0, str(_ROOT / "src"))

import torch  # noqa: E402

from benchmarks import problems  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402

SHAPES = [
    Shape("decode", 1, 32768),
    Shape("decode", 1, 4096),
    Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32),
    Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode="ROPE_LLAMA"),
]


def host_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="also print the cProfile of the first shape")
    args = ap.parse_args(argv)
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    for i, shape in enumerate(SHAPES):
        prob = problems.build(shape, device, l2_bytes=l2, workspace_mib=128)
        fn = prob.sets[0].kvattn
        print(f"{shape.id:56s} host {host_us(fn, args.calls):7.1f} us/call", flush=True)
        if args.profile and i == 0:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(500):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            print(s.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
