"""``benchmarks/host_time.py``'s forms table and its time budget: one round calls every (row,
form) once, beside each row's bare launch (the replay's launcher alone) and bare allocations, so
rows compare with each other; ``--seconds`` bounds a run whatever ``--calls`` asks.

The runs use the faked GPU (``benchmarks/profile_host.py``): Triton's GPU side faked, kvattn's
Python real, on any machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvattn.runtime import fast_launch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import host_time  # noqa: E402

FORMS = {"out", "no out", "out+lse", "lse", "no out+lse"}


def _run(tmp_path, *args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compiled-mode kernels, faked
    env["PYTHONPATH"] = str(ROOT / "src")
    out = tmp_path / "host_time.json"
    t0 = time.perf_counter()
    got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_time.py"), "--fake-gpu", *args,
                          "--json", str(out)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    assert got.returncode == 0, got.stderr[-2000:]
    return got.stdout, json.loads(out.read_text()), time.perf_counter() - t0


def test_a_round_calls_every_function_once_in_a_shuffled_order():
    log, prepared = [], []
    fns = {name: (lambda name=name: log.append(name)) for name in "abcdef"}
    before = {"c": lambda: prepared.append(len(log))}  # (the log's length when c's hook ran)
    got = host_time.interleaved_times(fns, 30, seed=0, before=before, warmup=0)
    rounds = [log[i:i + 6] for i in range(0, len(log), 6)]
    assert len(rounds) == 30 and all(sorted(r) == list("abcdef") for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # shuffled every round
    assert [log[j] for j in prepared] == ["c"] * 30  # each hook right before its function's call
    assert set(got) == set(fns) and all(n == 30 and hits == 0 and p90 >= med >= 0
                                        for med, p90, hits, n in got.values())
    log.clear()
    host_time.interleaved_times(fns, 3, seed=None, warmup=0)
    assert log == list("abcdef") * 3  # fixed: the order of fns
    log.clear()
    got = host_time.interleaved_times(fns, 1000, deadline=0.0, warmup=0)  # a deadline long passed
    assert {n for *_, n in got.values()} == {host_time.MIN_ROUNDS}


@pytest.mark.skipif(not fast_launch.TRITON_SUPPORTED, reason="replays take the fast path (Triton 3.6 / 3.7)")
def test_forms_table_interleaves_every_row_beside_its_bare_launch(tmp_path):
    stdout, doc, _ = _run(tmp_path, "--forms-only", "--form-calls", "20", "--seconds", "0")
    rows, meta = doc["forms"], doc["forms_rounds"]
    assert len(rows) == 20 and all("error" not in row for row in rows), [r.get("error") for r in rows]
    # one round: every form, each allocating form's bare allocations, each row's launch, torch.add
    calls = sum(len(row["forms"]) + sum("alloc" in f for f in row["forms"].values()) + 1 for row in rows) + 1
    assert meta["rounds"] == 20 and meta["calls_a_round"] == calls and meta["order"] == "shuffled, seed 0"
    assert meta["torch_add"][0] > 0
    for row in rows:
        expected = FORMS - {"no out", "no out+lse"} if row["function"] == "xqa" else FORMS
        assert set(row["forms"]) == expected, row
        for form, got in row["forms"].items():
            assert got["replayed"] and got["p90"] >= got["median"] > 0, (row["function"], form)
            assert got["ratio"] == pytest.approx(got["median"] / row["forms"][host_time.BASELINE[form]]["median"])
        launch, out = row["launch"], row["forms"]["out"]["median"]
        assert launch["p90"] >= launch["median"] > 0 and row["launches"] >= 1
        if row["function"] == "MLA h16":  # the split and the combine
            assert row["launches"] == 2
        assert row["own"] == pytest.approx(out - launch["median"])
        line = f"{row['function']:16s} {row['page'] or '-':>4} {row['kv']:4s} {out:5.1f}  {launch['median']:6.1f} "
        assert line + f"{row['own']:6.1f}" in stdout, line
    assert "out launch    own" in stdout and "kvattn's own share" in stdout
    assert "net of their bare allocations" in stdout


@pytest.mark.skipif(not fast_launch.TRITON_SUPPORTED, reason="replays take the fast path (Triton 3.6 / 3.7)")
def test_breakdown_keeps_to_its_seconds(tmp_path):
    """Unbounded, these counts take minutes here (SDPA alone ~40 ms a call on this CPU); within
    ``--seconds`` every timing stops at its share, and what was not reached is marked skipped."""
    stdout, doc, wall = _run(tmp_path, "--breakdown", "--calls", "5000", "--form-calls", "5000", "--seconds", "4")
    # (the 20-call minima, the first calls of the rows begun before the budget ran out, start-up)
    assert doc["run_s"] < 4 + 15, doc["run_s"]
    assert doc["forms_rounds"]["rounds"] < 5000
    for row in doc["rows"]:
        assert row.get("skipped") or row["cache_on"][0] > 0, row
        if row.get("skipped"):
            assert f"{row['function']:28s} skipped: --seconds spent" in stdout
    assert set(doc["breakdown"]) == {row["function"] for row in doc["rows"] if not row.get("skipped")}
    assert "(timed part of the run:" in stdout
