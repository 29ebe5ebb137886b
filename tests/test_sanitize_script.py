"""``benchmarks/sanitize.sh`` reads each tool's verdict: memcheck and synccheck end with
"ERROR SUMMARY", racecheck with "RACECHECK SUMMARY" (a run that reported hazards once passed as
clean because only the first form was read). Stand-ins for compute-sanitizer, nvidia-smi and the
driver's python3 make this a CPU test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_CS = """#!/bin/bash
case "$*" in
  *"--version"*) echo "stand-in 1.0";;
  *racecheck*) echo "ok variant"; echo "========= RACECHECK SUMMARY: 2 hazards displayed ($FAKE_RACES errors, 0 warnings)";;
  *memcheck*) echo "ok variant"; echo "========= ERROR SUMMARY: $FAKE_MEM errors";;
  *) echo "ok variant"; echo "========= ERROR SUMMARY: 0 errors";;
esac
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("races,mem,status", [(0, 0, 0), (128, 0, 1), (0, 3, 1)],
                         ids=["clean", "racecheck-hazards", "memcheck-errors"])
def test_each_tool_verdict_sets_the_exit_status(tmp_path, races, mem, status):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("compute-sanitizer", FAKE_CS), ("python3", "#!/bin/bash\necho 'ok variant'\n"),
                       ("nvidia-smi", "#!/bin/bash\necho stand-in\n")):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"),
               FAKE_RACES=str(races), FAKE_MEM=str(mem))
    got = subprocess.run(["bash", str(ROOT / "benchmarks" / "sanitize.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == status, got.stdout + got.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert f"({races} errors" in summary and f"ERROR SUMMARY: {mem} errors" in summary
