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


# -- kvattn / best FlashInfer ---------------------------------------------------------------------


def _fi_rec(shape, impl, graph_us, **kw):
    rec = {"shape": shape, "suite": "decode", "impl": impl, "family": "flashinfer", "includes": "", "status": "ok",
           "note": "", "eager_us": None, "graph_us": graph_us, "us": graph_us, "fraction": 0.9,
           "fraction_copy_bw": 0.9 * 100.0 / graph_us}
    rec.update(kw)
    return rec


def _kv_rec(shape, graph_us, frac):
    return {"shape": shape, "suite": "decode", "impl": "kvattn", "family": "kvattn", "includes": "", "status": "ok",
            "note": "", "eager_us": 2 * graph_us, "graph_us": graph_us, "us": graph_us, "metric": "1 GB/s",
            "fraction": frac, "fraction_copy_bw": frac, "backend": "triton"}


def test_ratio_is_against_the_fastest_flashinfer_kernel_that_agreed():
    recs = [_kv_rec("a", 110.0, 0.8), _fi_rec("a", "fi-fa2-tc", 100.0), _fi_rec("a", "fi-xqa", 90.0, check_failed=True),
            _fi_rec("a", "fi-fa2", 80.0, status="error"), dict(_fi_rec("a", "fi-fa2x", 85.0), graph_us=None),
            {"shape": "a", "impl": "sdpa-flash", "family": "sdpa", "status": "ok", "graph_us": 50.0}]
    report.attach_fi_ratio(recs)
    kv = recs[0]
    assert kv["fi_best"] == "fi-fa2-tc" and kv["fi_best_us"] == 100.0
    assert kv["fi_ratio"] == pytest.approx(1.1) and kv["fi_best_fraction_copy_bw"] == pytest.approx(0.9)
    assert recs[1]["kvattn_ratio"] == pytest.approx(1.1) and "kvattn_ratio" not in recs[2]
    none = [_kv_rec("b", 10.0, 0.5), _fi_rec("b", "fi-xqa", 9.0, status="not available")]
    report.attach_fi_ratio(none)
    assert none[0]["fi_ratio"] is None and "fi_best" not in none[0]
    no_graph = [dict(_kv_rec("c", 10.0, 0.5), graph_us=None), _fi_rec("c", "fi-xqa", 9.0)]
    report.attach_fi_ratio(no_graph)
    assert no_graph[0]["fi_ratio"] is None and no_graph[0]["fi_best"] == "fi-xqa"


def _ratio_doc() -> dict:
    doc = _doc("NVIDIA H200", "triton")
    doc["records"] = []
    shapes = {}
    # (shape, class info, kvattn us, best FI us, kvattn copy fraction)
    lognorm = dict(suite="decode", kv_dtype="bfloat16", ragged=True, len_dist="lognormal")
    rows = [("d1", dict(lognorm, page_size=16), 120, 100, 0.7),
            ("d2", dict(lognorm, page_size=64), 90, 100, 0.9),
            ("d3", dict(suite="decode", kv_dtype="fp8", ragged=False, page_size=16), 100, 100, 0.8),
            ("m1", dict(suite="mla", kv_dtype="bfloat16", num_qo_heads=16, ragged=True, page_size=64), 130, 100, 0.75),
            ("n1", dict(suite="decode", kv_dtype="nvfp4", ragged=False, page_size=64), 50, None, 0.6)]
    for shape, info, kv_us, fi_us, frac in rows:
        recs = [_kv_rec(shape, kv_us, frac)]
        if fi_us:
            recs.append(_fi_rec(shape, "fi-fa2-tc", fi_us))
        report.attach_fi_ratio(recs)
        doc["records"] += recs
        shapes[shape] = info
    doc["shapes"] = shapes
    return doc


def test_summary_per_class_and_overall():
    groups = {g["class"]: g for g in report.summary(_ratio_doc())}
    lognorm = groups["decode bf16 lognormal"]
    assert lognorm["rows"] == 2 and lognorm["with_fi"] == 2
    assert lognorm["geomean_ratio"] == pytest.approx((1.2 * 0.9) ** 0.5)
    assert lognorm["worst_ratio"] == pytest.approx(1.2) and lognorm["worst_shape"] == "d1"
    assert lognorm["copy_fraction_geomean"] == pytest.approx((0.7 * 0.9) ** 0.5)
    assert lognorm["copy_fraction_min"] == pytest.approx(0.7)
    assert groups["mla bf16 Hq16"]["worst_ratio"] == pytest.approx(1.3)
    assert groups["decode nvfp4 equal"]["with_fi"] == 0 and groups["decode nvfp4 equal"]["geomean_ratio"] is None
    assert groups["decode ragged, pages of 16"]["rows"] == 1 and groups["decode fp8 caches"]["rows"] == 1
    overall = groups["all"]
    assert overall["rows"] == 5 and overall["with_fi"] == 4
    assert overall["geomean_ratio"] == pytest.approx((1.2 * 0.9 * 1.0 * 1.3) ** 0.25)
    assert overall["worst_ratio"] == pytest.approx(1.3) and overall["worst_shape"] == "m1"
    assert list(groups)[-1] == "all"


def test_table_and_markdown_show_the_ratio_and_the_summary():
    doc = _ratio_doc()
    table = report.table(doc)
    assert "kv/FI" in table and "1.200 fa2-tc" in table and "kv/FI geomean" in table
    md = report.markdown(doc)
    assert "| kvattn / FI |" in md and "1.200 fa2-tc" in md
    assert "| all | 5 | 4 |" in md and "Summary (kvattn / best FlashInfer kernel" in md
    row = next(line for line in md.splitlines() if line.startswith("| n1 "))
    assert row.count("|") == md.splitlines()[7].count("|")  # every row has the header's columns


def test_geomean_ignores_missing_and_never_passes_nan():
    assert report.geomean([]) is None and report.geomean([None, float("nan")]) is None
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
