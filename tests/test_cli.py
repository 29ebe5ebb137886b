"""The ``kvattn`` command: check, info, bench, --version, ``python -m kvattn``, and every user
error as one line on stderr with exit status 2 (CPU; a GPU machine runs the same with --device cpu)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvattn
from kvattn import bench, cli, cli_check, cli_info

ROOT = Path(__file__).resolve().parent.parent


def _interpreter_usable() -> bool:
    """Triton 3.6's interpreter cannot run with numpy >= 2.4 (the CLI says so, tested below); the
    GPU machine's environment is such a pair."""
    try:
        cli.check_interpreter_numpy()
    except cli.UsageError:
        return False
    return True


needs_interpreter = pytest.mark.skipif(not _interpreter_usable(),
                                       reason="this Triton's interpreter cannot run with this numpy")


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def assert_usage_error(rc, out, err, *words):
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvattn: error: "), err
    assert "Traceback" not in err and out == "", (out, err)
    for w in words:
        assert w in lines[0], (w, lines[0])


def _python_m(*argv, env=None, timeout=300):
    e = dict(os.environ if env is None else env)
    e["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "kvattn", *argv], capture_output=True, text=True, env=e,
                          cwd=ROOT, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------
def test_python_m_version_and_help():
    got = _python_m("--version")
    assert got.returncode == 0 and got.stdout.strip() == f"kvattn {kvattn.__version__}", got
    got = _python_m("check", "--help")
    assert got.returncode == 0 and "--interpret" in got.stdout and "--device" in got.stdout, got


def test_python_m_usage_error_is_one_line_without_traceback():
    got = _python_m("check", "--reps", "-3")
    assert got.returncode == 2, got
    assert got.stderr.strip().count("\n") == 0 and "Traceback" not in got.stderr, got.stderr
    assert "--reps" in got.stderr


def test_version_matches_package_and_pyproject():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"]["attr"] == "kvattn._version.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvattn.__version__)
    module, func = meta["project"]["scripts"]["kvattn"].split(":")
    assert module == "kvattn.cli" and callable(getattr(cli, func))
    assert (ROOT / "src" / "kvattn" / "py.typed").exists()
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["kvattn"]


def test_no_command_prints_help(capsys):
    rc, out, err = run_cli(capsys)
    assert rc == 0 and "check" in out and "info" in out and "bench" in out


# ---------------------------------------------------------------------------------------------
# user errors: one line, exit 2
# ---------------------------------------------------------------------------------------------
def _missing_cuda() -> str:
    """A CUDA device this machine does not have."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize("command", ["check", "info", "bench"])
def test_device_errors(capsys, command):
    rc, out, err = run_cli(capsys, command, "--device", _missing_cuda())
    assert_usage_error(rc, out, err, "--device", "cuda")
    rc, out, err = run_cli(capsys, command, "--device", "gpu0")
    assert_usage_error(rc, out, err, "not a device name")
    rc, out, err = run_cli(capsys, command, "--device", "meta")
    assert_usage_error(rc, out, err, "cuda or cpu")


@pytest.mark.parametrize("argv, words", [
    (("check", "--reps", "-3"), ("--reps", "-3")),
    (("check", "--reps", "0"), ("--reps",)),
    (("check", "--reps", "many"), ("--reps", "many")),
    (("bench", "--rep-ms", "-1"), ("--rep-ms",)),
    (("check", "--only", "decode"), ("--only", "batch_decode")),
    (("bench", "--only", "xqa,nope"), ("--only",)),
    (("check", "--json", "/nonexistent-folder/x.json"), ("--json", "does not exist")),
    (("bench", "--json", "/nonexistent-folder/x.json"), ("--json",)),
    (("frobnicate",), ("invalid choice",)),
    (("check", "--no-such-flag"), ("--no-such-flag",)),
])
def test_argument_errors(capsys, argv, words):
    rc, out, err = run_cli(capsys, *argv)
    assert_usage_error(rc, out, err, *words)


@pytest.mark.parametrize("command", ["check", "info", "bench"])
@pytest.mark.parametrize("name", ["KVATTN_DEBUG", "KVATTN_FAST_LAUNCH", "KVATTN_GLUON"])
def test_bad_flag_switch(capsys, monkeypatch, command, name):
    monkeypatch.setenv(name, "2")
    rc, out, err = run_cli(capsys, command, "--device", "cpu")
    assert_usage_error(rc, out, err, name, "'2'")


@pytest.mark.parametrize("argv, help_of", [(("check", "--bogus"), "kvattn check --help"),
                                           (("info", "--bogus"), "kvattn info --help"),
                                           (("--bogus",), "kvattn --help")], ids=["check", "info", "top-level"])
def test_unknown_argument_points_to_its_commands_help(capsys, argv, help_of):
    rc, out, err = run_cli(capsys, *argv)
    assert_usage_error(rc, out, err, "unrecognized arguments: --bogus", f"(see {help_of})")


@pytest.mark.parametrize("command", ["check", "info", "bench"])
def test_bad_backend_switch(capsys, monkeypatch, command):
    monkeypatch.setenv("KVATTN_BACKEND", "tritonn")
    rc, out, err = run_cli(capsys, command, "--device", "cpu")
    assert_usage_error(rc, out, err, "KVATTN_BACKEND", "tritonn")


def test_triton_backend_on_cpu_without_interpreter(capsys, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rc, out, err = run_cli(capsys, "check", "--device", "cpu")
    assert_usage_error(rc, out, err, "KVATTN_BACKEND=triton", "--interpret")
    rc, out, err = run_cli(capsys, "bench", "--device", "cpu")
    assert_usage_error(rc, out, err, "KVATTN_BACKEND=triton")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to be a valid --device")
def test_interpret_needs_cpu(capsys):
    rc, out, err = run_cli(capsys, "check", "--device", "cuda", "--interpret")
    assert_usage_error(rc, out, err, "--interpret", "cpu")


@needs_interpreter
def test_interpret_after_compiled_kernels_loaded(capsys, monkeypatch):
    import kvattn.ops  # noqa: F401  (loaded as this process loads it)

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rc, out, err = run_cli(capsys, "check", "--device", "cpu", "--interpret")
    assert_usage_error(rc, out, err, "--interpret", "fresh process")


def test_interpret_with_numpy_the_interpreter_cannot_use(capsys, monkeypatch):
    import numpy
    import triton

    monkeypatch.setattr(triton, "__version__", "3.6.0")
    monkeypatch.setattr(numpy, "__version__", "2.4.1")
    rc, out, err = run_cli(capsys, "check", "--device", "cpu", "--interpret")
    assert_usage_error(rc, out, err, "numpy < 2.4", "2.4.1")
    monkeypatch.setattr(triton, "__version__", "3.7.1")  # 3.7's interpreter works with numpy 2.4
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(cli, "check", lambda *a, **k: 0)
    assert cli.main(["check", "--device", "cpu", "--interpret"]) == 0


def test_plot_without_matplotlib_fails_before_running(capsys, monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    ran = []
    monkeypatch.setattr(bench, "run", lambda *a, **k: ran.append(1))
    rc, out, err = run_cli(capsys, "bench", "--device", "cpu", "--plot", str(tmp_path / "b.png"))
    assert_usage_error(rc, out, err, "--plot", "matplotlib")
    assert not ran and not (tmp_path / "b.png").exists()


# ---------------------------------------------------------------------------------------------
# kvattn check
# ---------------------------------------------------------------------------------------------
def test_check_on_cpu_reference(capsys, tmp_path):
    path = tmp_path / "check.json"
    rc, out, err = run_cli(capsys, "check", "--device", "cpu", "--reps", "1", "--json", str(path))
    assert rc == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith(f"kvattn {kvattn.__version__} check, torch {torch.__version__}")
    assert lines[1].startswith("device: cpu")
    assert any(line.startswith("mode:") and "reference" in line for line in lines)
    assert "--interpret" in out  # the CPU run says how to check the kernels
    header = next(line for line in lines if line.strip().startswith("case"))
    assert "tol" in header and "rel err" in header
    for short, _, _ in cli.FUNCTIONS:  # a title line naming the shape, per function
        assert any(line.startswith(f"{short}: ") and "tokens" in line for line in lines), short
    assert not re.search(r"(^|\s)0\.0+ ", out) and "TFLOP/s" not in out  # CPU rates in units that show a value
    assert re.search(r"\d (k|M|G)B/s", out) and re.search(r"\d (k|M|G)FLOP/s", out)
    doc = json.loads(path.read_text())
    assert doc["mode"] == "reference" and len(doc["cases"]) == 12
    for case in doc["cases"]:
        assert case["result"] == "ok" and case["backend"] == "reference", case
        assert 0 < case["rel_err"] <= case["tolerance"], case
    assert {c["tolerance"] for c in doc["cases"]} == {cli.TOL_16BIT, cli.TOL_NVFP4}
    assert lines[-1] == "12 passed, 0 failed"
    assert "check [" in err  # progress on stderr


def test_check_fails_out_of_tolerance(capsys, monkeypatch):
    monkeypatch.setattr(cli_check, "TOL_16BIT", 1e-9)
    rc, out, err = run_cli(capsys, "check", "--device", "cpu", "--only", "single_decode", "--reps", "1")
    assert rc == 1
    assert out.count(" FAIL ") == 3 and "1e-09" in out
    assert out.splitlines()[-1] == "0 passed, 3 failed"


def test_check_reports_an_error_and_goes_on(capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("seq_lens: broken on purpose")

    monkeypatch.setattr(kvattn.xqa, "xqa", broken)
    rc, out, err = run_cli(capsys, "check", "--device", "cpu", "--only", "xqa,single_decode", "--reps", "1")
    assert rc == 1
    assert " ERROR " in out and "ValueError: seq_lens: broken on purpose" in out
    assert out.splitlines()[-1] == "3 passed, 1 failed"


@needs_interpreter
def test_interpret_sets_and_restores_the_switches(capsys, monkeypatch):
    seen = {}

    def fake_check(device, big, reps, interpret=False, json_path=None, only=()):
        seen.update(TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET"), KVATTN_BACKEND=os.environ.get("KVATTN_BACKEND"),
                    interpret=interpret, reps=reps, device=device)
        return 0

    monkeypatch.setattr(cli, "check", fake_check)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("KVATTN_BACKEND", raising=False)
    rc, _, _ = run_cli(capsys, "check", "--device", "cpu", "--interpret")
    assert rc == 0
    assert seen == {"TRITON_INTERPRET": "1", "KVATTN_BACKEND": "triton", "interpret": True, "reps": 0,
                    "device": torch.device("cpu")}
    assert "KVATTN_BACKEND" not in os.environ


@needs_interpreter
def test_check_interpret_runs_the_kernels():
    """In a fresh process without TRITON_INTERPRET: --interpret switches the interpreter on itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KVATTN_BACKEND")}
    got = _python_m("check", "--device", "cpu", "--interpret", "--only", "xqa", env=env, timeout=600)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "Triton's interpreter" in got.stdout and "fp16" in got.stdout
    row = next(line for line in got.stdout.splitlines() if "flat pools" in line)
    assert " triton " in row and " ok " in row, row
    assert got.stdout.splitlines()[-1] == "1 passed, 0 failed"


def test_mla_is_skipped_in_the_interpreter_with_a_reason(capsys, monkeypatch):
    cases = cli_check._mla_cases(torch.device("cpu"), False, torch.float16, interpret=True)
    assert len(cases) == 1 and "bf16" in cases[0].skip and cases[0].run is None


# ---------------------------------------------------------------------------------------------
# kvattn info
# ---------------------------------------------------------------------------------------------
def test_info_on_cpu(capsys, monkeypatch):
    import triton

    from kvattn.runtime import versions as _versions

    monkeypatch.delenv("KVATTN_BACKEND", raising=False)
    monkeypatch.setenv("KVATTN_GLUON", "0")
    monkeypatch.setenv("KVATTN_GLUON_WS", "0")
    rc, out, err = run_cli(capsys, "info", "--device", "cpu")
    assert rc == 0 and err == ""
    assert out.startswith(f"kvattn {kvattn.__version__} (")
    assert f"torch {torch.__version__}" in out
    assert f"triton {triton.__version__} (no GPU here: used only by the interpreter" in out
    assert "verified on the GPU" not in out  # (a fact about kvattn's GPU runs, not this machine)
    assert "device: cpu" in out
    for name in ("KVATTN_BACKEND", "KVATTN_BATCH_INVARIANT", "KVATTN_DEBUG", "KVATTN_FAST_LAUNCH",
                 "KVATTN_FUSED_MERGE", "KVATTN_GLUON", "KVATTN_GLUON_WS", "TRITON_INTERPRET"):
        assert re.search(rf"^  {name} ", out, re.M), name
    assert re.search(r"^  KVATTN_GLUON\s+'0'\s+off", out, re.M)
    assert re.search(r"^  KVATTN_GLUON_WS\s+'0'\s+off", out, re.M)
    for _, public, _ in cli.FUNCTIONS:
        assert re.search(rf"^  {re.escape(public)}\s+reference", out, re.M), public
    assert "fast paths: none apply on cpu" in out
    for name in ("KVATTN_CALL_CACHE", "KVATTN_FAST_LAUNCH", "KVATTN_FUSED_MERGE", "KVATTN_GLUON", "KVATTN_GLUON_WS"):
        assert re.search(rf"^  {name} .*\(no effect here: it acts on compiled GPU launches\)$", out, re.M), name
    switch_lines = [line for line in out.splitlines() if re.match(r"^  (KVATTN|TRITON)_", line)]
    columns = {line.index(" '") if " '" in line else line.index(" unset ") for line in switch_lines}
    assert len(columns) == 1, switch_lines  # the value column lines up, the longest name included


def test_info_interpreted_kernels(capsys, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rc, out, _ = run_cli(capsys, "info", "--device", "cpu")
    assert rc == 0
    assert out.count("in Triton's interpreter") == 5


@pytest.mark.parametrize("version,expected", [
    ("3.6.0", "verified on the GPU"), ("3.7.1", "verified on the GPU"),
    ("3.9.0", "tested in the CPU interpreter only, not on a GPU"), ("3.8.0", "untested"), ("3.10.0", "untested"),
    ("not installed", "not installed"),
])
def test_triton_support_levels(version, expected):
    from kvattn.runtime import versions as _versions

    assert _versions.support(version) == expected


@pytest.mark.parametrize("version,raw,expected", [
    ("3.6.0", None, True), ("3.7.1", None, True), ("3.9.0", None, False), ("3.8.0", None, False),
    ("3.9.0", "1", True), ("3.7.1", "0", False),
], ids=["3.6-default", "3.7.1-default", "3.9-default-off", "3.8-default-off", "3.9-forced", "3.7.1-switched-off"])
def test_gluon_kernels_gated_on_gpu_verified_tritons(version, raw, expected, monkeypatch, capsys):
    """KVATTN_GLUON unset: the Gluon kernels serve only on the Triton releases they were verified
    with on a GPU; ``kvattn info`` says which and why."""
    from kvattn.runtime import versions as _versions

    monkeypatch.setattr(_versions, "triton_version", lambda: version)
    if raw is None:
        monkeypatch.delenv("KVATTN_GLUON", raising=False)
    else:
        monkeypatch.setenv("KVATTN_GLUON", raw)
    assert _versions.gluon_on() is expected
    state = _versions.fast_paths()["gluon"]
    assert state.startswith("on" if expected else "off"), state
    if not expected and raw is None:
        assert "KVATTN_GLUON=1" in state


@pytest.mark.parametrize("gluon,ws,want", [("1", "1", "Gluon kernel for 16-bit caches with 64+ heads and pages "
                                                     "of 64+ tokens (warp-specialised; also fewer heads over 16-bit "
                                                     "caches, padded to 64 rows, and an fp8 query over fp8 caches "
                                                     "with 17+ heads, or fewer where a program holds 1024+ keys "
                                                     "on an H200)"),
                                          ("1", "0", "pages of 64+ tokens"), ("0", "1", "latent decode")],
                         ids=["ws", "gluon", "triton"])
def test_info_names_mla_kernels_on_hopper(gluon, ws, want, monkeypatch):
    """On a Hopper GPU (faked) MLA's line says which Gluon kernel serves it, as the switches say."""
    from kvattn.runtime import backend as _backend, device as _device

    monkeypatch.setattr(_backend, "use_triton", lambda op, device: True)
    monkeypatch.setattr(_device, "is_hopper", lambda device: True)
    monkeypatch.setenv("KVATTN_GLUON", gluon)
    monkeypatch.setenv("KVATTN_GLUON_WS", ws)
    text = cli_info._served_by("mla_decode", torch.device("cuda"), {"gluon": "on (Gluon kernels on Hopper)"})
    assert text.endswith(want), text


@pytest.mark.parametrize("gluon,want", [("1", "staged once a call into the workspace"),
                                         ("0", "(pages of 64+ tokens by TMA on Hopper)")], ids=["gluon", "triton"])
def test_info_names_the_prefill_kernel_on_hopper(gluon, want, monkeypatch):
    """On a Hopper GPU (faked) prefill's line names the Gluon kernel unless it is switched off."""
    from kvattn.runtime import backend as _backend, device as _device

    monkeypatch.setattr(_backend, "use_triton", lambda op, device: True)
    monkeypatch.setattr(_device, "is_hopper", lambda device: True)
    monkeypatch.setenv("KVATTN_GLUON", gluon)
    text = cli_info._served_by("context", torch.device("cuda"), {"gluon": "on (Gluon kernels on Hopper)"})
    assert want in text, text
    assert ("Gluon" in text) == (gluon == "1"), text


def test_info_without_fast_paths_report(monkeypatch):
    """(On a GPU, info then prints "not reported by this kvattn"; on a CPU no fast path applies.)"""
    from kvattn.runtime import versions as _versions

    monkeypatch.delattr(_versions, "fast_paths")
    assert cli_info._fast_paths() == {}


# ---------------------------------------------------------------------------------------------
# kvattn bench
# ---------------------------------------------------------------------------------------------
def _bench_doc():
    long_shape = "B=64 requests x 8192 tokens, Hq=32 Hkv=8 D=128, pages of 64 tokens, bfloat16 cache, NHD layout"
    recs = []
    for fn in ("batch decode", "prefill"):
        recs.append(dict(function=fn, shape=long_shape, impl="kvattn", status="ok", graph_us=717.0, eager_us=730.5,
                         us=717.0, rate=3.2e12, unit="B/s", rel_err=None, note=""))
        recs.append(dict(function=fn, shape=long_shape, impl="sdpa-cudnn", status="ok", graph_us=718.0, eager_us=731.0,
                         us=718.0, rate=3.19e12, unit="B/s", rel_err=1.2e-3,
                         note="K/V gathered from the pages into contiguous tensors before the timed call; " * 3))
        recs.append(dict(function=fn, shape=long_shape, impl="flex", status="n/a", note="fails to compile " * 10))
    env = dict(kvattn=kvattn.__version__, device="NVIDIA H100 80GB HBM3", date="2026-11-26T18:23:00",
               torch="2.11.0+cu130", triton="3.6.0")
    return dict(env=env, method="Median of triton.testing.do_bench over CUDA-graph replays, L2 flushed before "
                                "every repetition, " * 3, records=recs)


def test_bench_table_fits_120_columns_unless_wide():
    from kvattn import bench

    out = io.StringIO()
    bench.print_report(_bench_doc(), out=out)
    lines = out.getvalue().splitlines()
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    flat = " ".join(out.getvalue().split())
    assert flat.count("batch decode: B=64 requests x 8192 tokens") == 1 and "fails to compile" in flat
    wide = io.StringIO()
    bench.print_report(_bench_doc(), out=wide, wide=True)
    rows = [line for line in wide.getvalue().splitlines() if "sdpa-cudnn" in line]
    assert len(rows) == 2 and all("K/V gathered" in line for line in rows)  # one line a record
    assert max(map(len, wide.getvalue().splitlines())) > 120


def test_bench_on_cpu(capsys, tmp_path):
    path = tmp_path / "bench.json"
    rc, out, err = run_cli(capsys, "bench", "--device", "cpu", "--rep-ms", "1", "--json", str(path))
    assert rc == 0, out + err
    assert "kvattn bench [" in err  # progress on stderr
    flat = " ".join(out.split())  # (the default table wraps its text at 120 columns)
    assert "CPU" in out and "only show that the command works" in flat and "L2 flushed" not in flat
    assert max(map(len, out.splitlines())) <= 120
    doc = json.loads(path.read_text())
    assert doc["env"]["device"] == "cpu" and doc["env"]["kvattn"] == kvattn.__version__
    recs = doc["records"]
    functions = [r["function"] for r in recs if r["impl"] == "kvattn"]
    assert functions == ["batch decode", "xqa", "single decode", "MLA decode", "prefill"]
    for r in recs:
        if r["impl"] == "kvattn":
            assert r["status"] == "ok" and r["eager_us"] > 0 and r["graph_us"] is None, r
            assert r["backend"] == "reference" and r["rate"] > 0
        elif r["impl"] == "sdpa-flash" and r["function"] != "MLA decode":  # torch's CPU flash kernel
            assert r["status"] == "ok" and r["rel_err"] < 2e-2, r
        elif r["impl"] == "flex":
            assert r["status"] == "skipped", r
    mla_flash = next(r for r in recs if r["function"] == "MLA decode" and r["impl"] == "sdpa-flash")
    assert mla_flash["status"] == "n/a" and "last dimension" in mla_flash["note"]
    assert not any(r["function"] == "xqa" and r["impl"] != "kvattn" for r in recs)
    header = next(line for line in out.splitlines() if line.startswith("  impl"))
    for col in ("impl", "us graph", "us eager", "rate", "time / kvattn's", "err vs kvattn"):
        assert col in header
    assert f"wrote {path}" in out


def test_bench_kvattn_failure_exits_1(capsys, monkeypatch):
    real = bench.build

    def build(key, device):
        prob = real(key, device)

        def boom():
            raise RuntimeError("kernel failed on purpose")

        prob.run = boom
        return prob

    monkeypatch.setattr(bench, "build", build)
    rc, out, _ = run_cli(capsys, "bench", "--device", "cpu", "--only", "single_decode", "--no-peers", "--rep-ms", "1")
    assert rc == 1 and "error: RuntimeError: kernel failed on purpose" in out


def test_bench_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "b.png"
    rc, out, _ = run_cli(capsys, "bench", "--device", "cpu", "--only", "prefill", "--rep-ms", "1", "--plot", str(png))
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="times the Triton kernels and torch's GPU peers")
def test_bench_on_gpu(capsys, tmp_path):
    path = tmp_path / "bench.json"
    rc, out, err = run_cli(capsys, "bench", "--only", "single_decode,xqa", "--rep-ms", "20", "--json", str(path))
    assert rc == 0, out + err
    assert "L2 flushed" in out
    recs = json.loads(path.read_text())["records"]
    for r in (r for r in recs if r["impl"] == "kvattn"):
        assert r["status"] == "ok" and r["backend"] == "triton" and r["graph_us"] > 0 and r["eager_us"] > 0, r
    peers = [r for r in recs if r["impl"].startswith("sdpa-") and r["status"] == "ok"]
    assert peers and all(r["rel_err"] < 2e-2 and r["graph_us"] > 0 for r in peers), peers
    flex = next(r for r in recs if r["impl"] == "flex")
    assert flex["status"] in ("ok", "error"), flex  # timed, or its failure recorded without ending the run


def test_progress_bar_redraws_on_a_terminal():
    class Tty:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    t = Tty()
    p = bench.Progress(2, "x", stream=t)
    p.step("one")
    p.step("two")
    p.done()
    assert t.text.count("\r") >= 3 and "\n" not in t.text and "2/2" in t.text


# ---------------------------------------------------------------------------------------------
# units
# ---------------------------------------------------------------------------------------------
def test_units():
    assert cli.format_rate(2.5e12, "FLOP") == "2.5 TFLOP/s"
    assert cli.format_rate(3.35e12, "B") == "3350 GB/s"
    assert cli.format_rate(7.1e6, "B") == "7.1 MB/s"
    assert cli.format_rate(4.2e7, "FLOP") == "42 MFLOP/s"
    assert cli.format_time(3.2e-5) == "32.0 us" and cli.format_time(0.25) == "250.00 ms"
    for k in range(2, 15):  # never a rate that reads as zero
        for unit in ("B", "FLOP"):
            text = cli.format_rate(10.0 ** k * 1.7, unit)
            assert float(text.split()[0]) >= 1, text


@needs_interpreter
def test_interpreter_switches_in_the_environment_mean_interpret(capsys, monkeypatch):
    """``TRITON_INTERPRET=1 KVATTN_BACKEND=triton kvattn check`` on a CPU runs as ``--interpret``:
    float16 cases (the interpreter has no bfloat16), the checked call alone timed."""
    seen = {}

    def fake_check(device, big, reps, interpret=False, json_path=None, only=()):
        seen.update(interpret=interpret, reps=reps)
        return 0

    monkeypatch.setattr(cli, "check", fake_check)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    rc, _, _ = run_cli(capsys, "check", "--device", "cpu")
    assert rc == 0 and seen == {"interpret": True, "reps": 0}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs the interpreter on in this process (the CPU tier)")
def test_interpreter_switches_in_the_environment_check_the_kernels_with_progress(capsys, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    rc, out, err = run_cli(capsys, "check", "--device", "cpu", "--only", "xqa")
    assert rc == 0, out + err
    assert "Triton's interpreter" in out and "fp16" in out
    row = next(line for line in out.splitlines() if "flat pools" in line)
    assert " triton " in row and " ok " in row, row
    assert "check [" in err and "1/1" in err  # a progress line a case, on stderr
