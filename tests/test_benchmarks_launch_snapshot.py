"""benchmarks/launch_snapshot.py: a snapshot records every launch of its calls with each argument by
name (a tensor by its metadata and the memory it shares, not its address), two runs agree, and the
comparison reports a changed argument and a missing call."""

from __future__ import annotations

import json
import os

import pytest
import torch

from benchmarks import launch_snapshot


@pytest.mark.skipif(torch.cuda.is_available(), reason="the snapshot's calls run on CPU tensors under the interpreter "
                    "(kernels defined interpreted): a GPU tier's kernel modules are compiled ones")
def test_snapshots_record_every_launch_and_repeat_exactly():
    first = launch_snapshot.snapshot(only="^(merge-pair|local-lengths-window)$")
    assert set(first["cases"]) == {"merge-pair", "local-lengths-window"}
    merge = first["cases"]["merge-pair"]
    assert [x["kernel"] for x in merge] == ["merge_states_kernel"] * 2  # (the call runs twice)
    args = merge[0]["args"]
    assert args["o_ptr"][:4] == ["tensor", "torch.float32", [35, 64], [64, 1]]
    assert args["PAIR"] == ["bool", True] and args["rows"] == ["int", 35]
    assert args["sinks_ptr"][4] == args["lse_ptr"][4] != args["o_ptr"][4]  # (the LSE stands in for the sinks)
    lengths = first["cases"]["local-lengths-window"][0]
    assert lengths["args"]["HAS_WINDOW"] == ["bool", True] and lengths["options"] == {"num_warps": ["int", 4]}
    again = launch_snapshot.snapshot(only="^(merge-pair|local-lengths-window)$")
    assert json.dumps(again) == json.dumps(first)  # fresh tensors, new addresses: the same record


def test_a_snapshot_leaves_the_environment_as_it_was(monkeypatch):
    """(It once left TRITON_INTERPRET=1 behind in its process: the GPU suite's later tests in that
    worker then refused bfloat16 caches as if interpreted.)"""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        monkeypatch.setattr(launch_snapshot, "calls", lambda: {})  # (the environment alone)
    launch_snapshot.snapshot(only="^merge-pair$")
    assert "TRITON_INTERPRET" not in os.environ


def test_compare_reports_a_changed_argument_and_a_missing_call(tmp_path, capsys):
    launch = {"kernel": "k", "warmup": False, "grid": [4], "options": {"num_warps": ["int", 4]},
              "args": {"n": ["int", 7], "BLOCK": ["int", 32]}}
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    a.write_text(json.dumps({"cases": {"x": [launch], "y": [launch]}}))
    b.write_text(json.dumps({"cases": {"x": [launch], "y": [launch]}}))
    changed = dict(launch, args={"n": ["int", 7], "BLOCK": ["int", 64]})
    c.write_text(json.dumps({"cases": {"x": [changed]}}))
    assert launch_snapshot.compare(str(a), str(b)) == 0
    assert launch_snapshot.compare(str(a), str(c)) == 1
    out = capsys.readouterr().out
    assert "launch 0 args BLOCK: ['int', 32] -> ['int', 64]" in out and "y: only in" in out
