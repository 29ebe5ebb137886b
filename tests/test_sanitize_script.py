"""``benchmarks/sanitize.sh`` reads each tool's verdict: memcheck and synccheck end with
"ERROR SUMMARY", racecheck with "RACECHECK SUMMARY" (a run that reported hazards once passed as
clean because only the first form was read). Stand-ins for compute-sanitizer, nvidia-smi and the
driver's python3 make this a CPU test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_CS = """#!/bin/bash
case "$*" in
  *"--version"*) echo "stand-in 1.0";;
  *racecheck*) echo "ok variant"; printf '%b' "$FAKE_BLOCKS"; echo "========= RACECHECK SUMMARY: 2 hazards displayed ($FAKE_RACES errors, 0 warnings)";;
  *memcheck*) echo "ok variant"; echo "========= ERROR SUMMARY: $FAKE_MEM errors";;
  *) echo "ok variant"; echo "========= ERROR SUMMARY: 0 errors";;
esac
"""


def _def_line(path: Path, kernel: str) -> int:
    return next(i for i, s in enumerate(path.read_text().splitlines(), 1) if s.startswith(f"def {kernel}("))


PREFILL_WS = ROOT / "src" / "kvattn" / "ops" / "prefill" / "kernels_gluon_ws.py"
WS_DEF = _def_line(PREFILL_WS, "prefill_ws_kernel")
WS_CALL = next(i for i, s in enumerate(PREFILL_WS.read_text().splitlines(), 1) if "gl.warp_specialize(" in s)


def _block(first: tuple, *others: tuple) -> str:
    """A racecheck hazard block (``--racecheck-report analysis``) between the given accesses."""
    kernel, name, line = first
    text = f"========= Error: Race reported between Read access at {kernel}+0x1f0 in {name}:{line}\n"
    for kernel, name, line in others:
        text += f"=========     and Write access at {kernel}+0x114d0 in {name}:{line} [42 hazards]\n"
    return text + "========= \n"


PROLOGUE = _block(("prefill_ws_kernel", "kernels_gluon_ws.py", WS_DEF), ("prefill_ws_kernel", "kernels_gluon_ws.py", WS_DEF),
                  ("prefill_ws_kernel", "kernels_gluon_ws.py", WS_CALL))
IN_KERNEL = _block(("prefill_ws_kernel", "kernels_gluon_ws.py", WS_DEF), ("prefill_ws_kernel", "kernels_gluon_ws.py", WS_DEF - 10))
CALIBRATION = _block(("exchange_rows_kernel", "sanitize_calibration.py", 120),
                     ("exchange_rows_kernel", "sanitize_calibration.py", 98))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("races,mem,blocks,status", [
    (0, 0, "", 0), (2, 0, IN_KERNEL, 1), (2, 0, PROLOGUE + CALIBRATION, 0), (0, 3, "", 1),
], ids=["clean", "racecheck-hazard-in-a-kernel", "racecheck-prologue-and-calibration-only", "memcheck-errors"])
def test_each_tool_verdict_sets_the_exit_status(tmp_path, races, mem, blocks, status):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("compute-sanitizer", FAKE_CS), ("python3", "#!/bin/bash\necho 'ok variant'\n"),
                       ("nvidia-smi", "#!/bin/bash\necho stand-in\n")):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"),
               FAKE_RACES=str(races), FAKE_MEM=str(mem), FAKE_BLOCKS=blocks.replace("\n", "\\n"),
               TRIAGE_PYTHON=sys.executable)  # (the stand-in python3 only plays the driver)
    got = subprocess.run(["bash", str(ROOT / "benchmarks" / "sanitize.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == status, got.stdout + got.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert f"({races} errors" in summary and f"ERROR SUMMARY: {mem} errors" in summary


def test_triage_sorts_hazards_by_place():
    """A hazard with one access off the prologue lines is kvattn's; one touching the calibration
    kernels is calibration; one on the kernel's def line and warp_specialize call only is Triton's
    prologue. A log without racecheck's summary (a run cut short) fails."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import racecheck_triage as rt

    sources = rt.Sources([ROOT / "src", ROOT / "benchmarks"])
    kinds = rt.triage(PROLOGUE + IN_KERNEL + CALIBRATION + PROLOGUE, sources)
    assert [len(kinds[k]) for k in ("kvattn", "prologue", "calibration")] == [1, 2, 1]
    # The same line numbers in MLA's kernel of the same file name are not prefill's def line.
    mla = _block(("mla_gluon_ws_kernel", "kernels_gluon_ws.py", WS_DEF))
    assert len(rt.triage(mla, sources)["kvattn"]) == 1
    # The constexpr branch opening a warp_specialize call counts as the call; another branch does not.
    lines = PREFILL_WS.read_text().splitlines()
    opening = next(i for i, s in enumerate(lines, 1) if s.strip().startswith("if _converter_on(")
                   and "warp_specialize(" in next(t for t in lines[i:] if t.strip() and not t.strip().startswith("#")))
    other = next(i for i, s in enumerate(lines, 1) if s.strip().startswith("if ") and i > WS_DEF
                 and "warp_specialize(" not in lines[i])
    branch = _block(("prefill_ws_kernel", "kernels_gluon_ws.py", WS_DEF), ("prefill_ws_kernel", "kernels_gluon_ws.py", opening))
    assert len(rt.triage(branch, sources)["prologue"]) == 1
    off = _block(("prefill_ws_kernel", "kernels_gluon_ws.py", WS_DEF), ("prefill_ws_kernel", "kernels_gluon_ws.py", other))
    assert len(rt.triage(off, sources)["kvattn"]) == 1


def test_triage_fails_a_log_cut_short(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import racecheck_triage as rt

    log = tmp_path / "racecheck.log"
    log.write_text(PROLOGUE)
    assert rt.main([str(log), str(ROOT / "src")]) == 1
    log.write_text(PROLOGUE + "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n")
    assert rt.main([str(log), str(ROOT / "src")]) == 0
