"""benchmarks/run.py --batch-invariant: the suites run with kvattn in batch-invariant mode (the
lead measures the mode's cost with it), and the results record the mode."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import kvattn  # noqa: E402
from benchmarks import run as bench_run  # noqa: E402


def test_batch_invariant_flag_turns_the_mode_on_for_the_run(monkeypatch, tmp_path):
    # main() sets the variable itself, past monkeypatch: set it here first, so that the
    # teardown removes it again whatever main() left (a leaked "1" turns the mode on for every
    # later test of the process).
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", "0")
    monkeypatch.delenv("KVATTN_BATCH_INVARIANT")
    seen = []
    monkeypatch.setattr(bench_run, "run", lambda suites, **kw: seen.append((suites, kvattn.is_batch_invariant())))
    assert bench_run.main(["--suite", "decode,mla,prefill", "--batch-invariant", "--out", str(tmp_path / "r.json")]) == 0
    assert seen == [(["decode", "mla", "prefill"], True)]
    monkeypatch.delenv("KVATTN_BATCH_INVARIANT")
    seen.clear()
    assert bench_run.main(["--suite", "decode", "--out", str(tmp_path / "r.json")]) == 0
    assert seen == [(["decode"], False)]


def test_environment_records_the_mode(monkeypatch):
    import torch
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", "1")
    assert bench_run.environment(torch.device("cpu"), "cmd")["batch_invariant"] is True
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", "0")
    assert bench_run.environment(torch.device("cpu"), "cmd")["batch_invariant"] is False
