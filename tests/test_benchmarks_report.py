"""What ``benchmarks/`` writes says how the run was made: a CPU run claims no L2 flush, no CUDA graphs
and no Triton kernel it did not time; ``plot.py`` fails loudly without matplotlib."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import plot, report  # noqa: E402


def _doc(device: str, backend: str) -> dict:
    rec = {"shape": "decode bf16 2x64 p16 NHD h4/2 D64", "suite": "decode", "impl": "kvattn", "family": "kvattn",
           "includes": "", "status": "ok", "note": "", "eager_us": 1500.0, "graph_us": None if device == "cpu" else 9.0,
           "us": 1500.0, "backend": backend, "metric": "0.0450 GB/s", "fraction": 0.01, "rel_err": 2e-3}
    peer = dict(rec, impl="sdpa-flash", family="sdpa", backend=None, us=20.0, fraction=0.5)
    return {"env": {"date": "2026-11-26T03:04:45+00:00", "device": device, "torch": "2.13.0", "triton": "3.6.0",
                    "kvattn": "0.1.0", "git": "abc", "command": "python benchmarks/run.py"},
            "ceilings": {"copy_gbps": 6.0, "matmul_bf16_tflops": 1.0, "matmul_fp8_tflops": None},
            "records": [rec, peer]}


def test_cpu_markdown_claims_no_gpu_method():
    md = report.markdown(_doc("cpu", "reference"))
    assert "L2 flushed" not in md and "CUDA-graph replay" not in md
    assert "CPU run" in md and "no L2 flush, no CUDA graphs" in md
    assert "plain-PyTorch reference (no Triton kernel was timed)" in md


def test_gpu_markdown_keeps_its_method_and_names_the_backend():
    md = report.markdown(_doc("NVIDIA H100 80GB HBM3", "triton"))
    assert "L2 flushed" in md and "CUDA-graph replay" in md and "kvattn ran its Triton kernels" in md
    mixed = _doc("NVIDIA H100 80GB HBM3", "triton")
    mixed["records"].append(dict(mixed["records"][0], shape="mla bf16 Hq16 2x64 p16", backend="reference"))
    assert "and the reference for mla" in report.markdown(mixed)


def test_run_environment_lists_only_the_ops_the_device_runs(monkeypatch):
    from benchmarks import run

    monkeypatch.delenv("KVATTN_BACKEND", raising=False)
    env = run.environment(torch.device("cpu"), "test")
    assert env["triton_ops"] == []  # a CPU runs the reference
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    env = run.environment(torch.device("cpu"), "test")
    assert env["triton_ops"] == ["batch_decode", "context", "mla_decode", "single_decode"]


def test_plot_without_matplotlib_exits_1(tmp_path, monkeypatch, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_doc("cpu", "reference")))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert plot.main([str(path)]) == 1
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert not (tmp_path / "r.png").exists()


def test_plot_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_doc("cpu", "reference")))
    assert plot.main([str(path)]) == 0
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
