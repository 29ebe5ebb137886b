"""Run one decode benchmark shape a few times, for Nsight Compute to profile its kernels.

Usage (on the device, from the repository root)::

    ncu --kernel-name regex:decode_split --launch-skip 2 --launch-count 1 --section SpeedOfLight \
        python benchmarks/ncu_decode.py "decode fp8 64x8192 p16 NHD"
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(_ROOT))
    sys.path.insert(0, str(_ROOT / "src"))

import torch  # noqa: E402

from benchmarks import problems  # noqa: E402
from benchmarks.tune_decode import SHAPES  # noqa: E402


def main(argv=None) -> int:
    wanted = (argv or sys.argv[1:])[0]
    shape = next(s for s in SHAPES if s.id == wanted)
    device = torch.device("cuda")
    prob = problems.build(shape, device, l2_bytes=torch.cuda.get_device_properties(device).L2_cache_size,
                          workspace_mib=128)
    for _ in range(4):
        prob.sets[0].kvattn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
