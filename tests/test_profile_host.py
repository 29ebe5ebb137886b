"""``benchmarks/profile_host.py --breakdown`` on the faked GPU (any machine): each call's kernel
launches are found and replayed alone, and what is left of the call is reported beside them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_breakdown_replays_each_calls_launches():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled-mode kernels, faked
    env["PYTHONPATH"] = str(ROOT / "src")
    got = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_host.py"), "--fake-gpu", "--breakdown", "--calls", "20"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    lines = [line for line in got.stdout.splitlines() if "host" in line]
    assert len(lines) == 5, got.stdout
    for line in lines:
        found = re.search(r"breakdown: (\d+) launches\s+([\d.]+) us, the rest of the call\s+(-?[\d.]+) us "
                          r"\(whole\s+([\d.]+)\)", line)
        assert found, line
        launches, bare, rest, whole = int(found[1]), float(found[2]), float(found[3]), float(found[4])
        assert launches >= 1 and bare > 0 and whole > 0, line
        assert abs(bare + rest - whole) < 0.2, line  # (each printed to 0.1 us)
