"""``benchmarks/host_time.py --breakdown`` on the faked GPU (any machine): every function's replayed
call is split into its key check, the replay of its launches and each launcher alone (and the
full key of a call the check does not find); the forms table
times every call form of each function, every one replayed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvattn.runtime import fast_launch

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not fast_launch.TRITON_SUPPORTED, reason="replays take the fast path (Triton 3.6 / 3.7)")
def test_breakdown_splits_every_replayed_call(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled-mode kernels, faked
    env["PYTHONPATH"] = str(ROOT / "src")
    out = tmp_path / "host_time.json"
    got = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "host_time.py"), "--fake-gpu", "--breakdown", "--calls", "30",
         "--form-calls", "20", "--seconds", "0", "--json", str(out)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    doc = json.loads(out.read_text())
    rows = doc["breakdown"]
    assert set(rows) == {row["function"] for row in doc["rows"]}
    for name, row in rows.items():
        assert row is not None, f"{name}: not replayed"
        assert row["launches"] == len(row["launcher"]) >= 1
        if "h16" in name:  # the split and the combine
            assert row["launches"] == 2
        assert all(t > 0 for t in (row["whole"], row["key"], row["replay"], row["full_key"], *row["launcher"])), name
        assert abs(row["whole"] - row["key"] - row["replay"] - row["rest"]) < 1e-6
        assert f"{name:28s} {row['whole']:6.1f} {row['key']:6.1f}" in got.stdout
    assert "torch.add floor" in got.stdout
    forms = doc["forms"]
    assert {row["function"] for row in forms} == {"batch decode", "xqa", "single decode", "MLA h16", "MLA h128",
                                                  "prefill 16 rows"}
    for row in forms:
        assert "error" not in row, row
        expected = 3 if row["function"] == "xqa" else 5  # (xqa's output is always given)
        assert len(row["forms"]) == expected and all(f["replayed"] for f in row["forms"].values()), row
        for form, got_form in row["forms"].items():  # the allocating forms' bare allocations, timed beside them
            allocating = form in ("no out", "lse", "no out+lse")
            assert ("alloc" in got_form) == allocating and got_form.get("alloc", 1.0) > 0, (row["function"], form)
            assert got_form["net_ratio"] <= got_form["ratio"]
        assert row["launch"]["median"] > 0 and row["own"] > 0, row  # (the bare launch, in the same rounds)
        line = next(x for x in got.stdout.splitlines() if x.startswith(f"{row['function']:16s} {row['page'] or '-':>4}"
                                                                      f" {row['kv']:4s}"))
        assert "*" not in line
    assert "a new length every call" in got.stdout
    assert "net of their bare allocations" in got.stdout
