"""Run one decode benchmark shape a few times, for Nsight Compute to profile its kernels.

Usage (on the device, from the repository root)::

    ncu --kernel-name regex:decode_split --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        python benchmarks/ncu_decode.py "decode fp8 64x8192 p16 NHD"
"""

from __future__ import annotations

import sys

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402

from benchmarks import problems  # noqa: E402
from benchmarks.tune_decode import SHAPES  # noqa: E402


def main(argv=None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    shape = next((s for s in SHAPES if args and s.id == args[0]), None)
    if shape is None:
        raise SystemExit("usage: ncu_decode.py SHAPE_ID, one of:\n  " + "\n  ".join(s.id for s in SHAPES))
    device = torch.device("cuda")
    prob = problems.build(shape, device, l2_bytes=torch.cuda.get_device_properties(device).L2_cache_size,
                          workspace_mib=128)
    for _ in range(4):
        prob.sets[0].kvattn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
