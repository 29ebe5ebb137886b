"""``kvattn fuzz`` (kvattn.fuzz): the command and its exit codes, fixed-seed runs on the reference
backend and in Triton's interpreter, the shrinker on planted bugs (a monkeypatched wrong function
must be caught, shrunk, and its snippet must reproduce it), and a short fuzz on the GPU in every
mode."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvattn
from kvattn import cli
from kvattn.fuzz import draws, fuzz, replay, run_spec
from kvattn.fuzz.calls import build, request_rows
from kvattn.fuzz.oracle import compare
from kvattn.fuzz.runner import environment
from kvattn.fuzz.shrink import candidates

ON_GPU = torch.cuda.is_available()
SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture(autouse=True)
def _one_thread():
    """The fuzz calls here are tiny: one CPU thread runs them faster than two that synchronise
    (and CI's two cores are shared by the suite's other work)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_cli(capsys, *argv):
    rc = cli.main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def _interpreter_usable() -> bool:
    try:
        cli.check_interpreter_numpy()
    except cli.UsageError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------
def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["fuzz", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in ("--calls", "--seconds", "--seed", "--only", "--device", "--modes", "--fresh", "--jobs",
                   "--shared-classes", "--json"):
        assert option in out
    assert "fuzz: N calls, M" in out
    assert "fuzz" in cli.build_parser().format_help()


@pytest.mark.parametrize("argv, words", [
    (("--calls", "0"), ("--calls",)),
    (("--calls", "3", "--seconds", "2"), ("--seconds", "not allowed with")),
    (("--seconds", "-1"), ("--seconds",)),
    (("--only", "decode"), ("--only", "batch_decode")),
    (("--modes", "plain,fast"), ("--modes", "fast")),
    (("--seed", "x"), ("--seed",)),
    (("--json", "/nonexistent-folder/x.json"), ("--json", "does not exist")),
    (("--device", "cpu", "--modes", "graph"), ("--modes graph", "cuda")),
    (("--device", "cpu", "--modes", "invariant", "--only", "single_decode"), ("--modes invariant", "single_decode")),
], ids=["calls-0", "calls-and-seconds", "negative-seconds", "bad-function", "bad-mode", "bad-seed", "bad-json",
        "graph-on-cpu", "invariant-single-decode"])
def test_argument_errors_exit_2(capsys, argv, words):
    rc, out, err = run_cli(capsys, "fuzz", *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1, (rc, out, err)
    for w in words:
        assert w in err, err


def test_fixed_seed_run_on_the_reference_passes(capsys, tmp_path, monkeypatch, reference_backend):
    monkeypatch.setenv("KVATTN_DEBUG", "1")  # every drawn call passes the device-value checks too
    path = tmp_path / "fuzz.json"
    rc, out, err = run_cli(capsys, "fuzz", "--device", "cpu", "--calls", "12", "--seed", "7", "--json", str(path))
    assert rc == 0, out + err
    assert out.strip().splitlines()[-1] == "fuzz: 12 calls, 0 mismatches, 0 errors"
    assert "fuzz [" in err  # the progress bar, on stderr
    doc = json.loads(path.read_text())
    assert (doc["calls"], doc["mismatches"], doc["errors"], doc["failures"]) == (12, 0, 0, [])
    assert set(doc["counts"]) == set(draws.FUNCTIONS)
    modes = {m for per_mode in doc["counts"].values() for m in per_mode}
    assert modes == {"plain", "determinism", "invariant"}  # graph needs CUDA


def test_only_is_repeatable_and_seconds_bounds_the_run(capsys, reference_backend):
    rc, out, err = run_cli(capsys, "fuzz", "--device", "cpu", "--seconds", "1", "--only", "xqa", "--only",
                           "single_decode", "--modes", "plain")
    assert rc == 0, out + err
    assert "batch_decode" not in out and "xqa" in out
    assert out.strip().splitlines()[-1].startswith("fuzz: ")


@pytest.mark.parametrize("module", ["kvattn.fuzz", "kvattn.fuzz.runner"])
def test_docstring_examples(module, reference_backend):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_tolerances_are_the_checks():
    from kvattn.fuzz import oracle

    assert (oracle.TOL_16BIT, oracle.TOL_NVFP4) == (cli.TOL_16BIT, cli.TOL_NVFP4)


def test_nvfp4_vectors_are_held_to_the_formats_own_error():
    """An NVFP4 output vector may err as much as 1.5 times storing its exact value does: vectors
    the format alone rounds past TOL_NVFP4 (a fuzz find: prefill, D 64, o_sf_scale 0.5, the
    kernel's error 0.161 equal to the format's own) pass when rounded as the format rounds them,
    and fail when they err well beyond it."""
    from types import SimpleNamespace

    from kvattn.fuzz import oracle

    g = torch.Generator().manual_seed(4)
    # Small outputs: their e4m3 block scales (o_sf_scale * amax / 6) fall among the subnormals,
    # whose coarse steps the format's own error follows.
    exact = torch.randn(64, 2, 64, generator=g).double() * 0.01
    call = SimpleNamespace(out_kind="nvfp4", stored_scale=1.0, o_sf_scale=0.5)
    floor = oracle.nvfp4_floor(exact, 0.5)
    assert float(floor.max()) > oracle.TOL_NVFP4  # (the case needs vectors the format alone fails)
    rounded = oracle.nvfp4_round_trip(exact, 0.5)
    assert compare(call, rounded, None, exact, None)["ok"]
    worst = int(floor.argmax())
    off = rounded.clone().reshape(-1, 64)
    norms = exact.reshape(-1, 64).norm(dim=-1)
    scale = max(float(norms[worst]), float(norms.square().mean().sqrt()))  # (vector_error's denominator)
    # A constant c on 64 values is an error of 8c: 3 floors added, at least 2 beyond the rounding.
    off[worst] += 3.0 * float(floor[worst]) * scale / 8.0
    outcome = compare(call, off.reshape(rounded.shape), None, exact, None)
    assert not outcome["ok"] and f"output vector {worst} " in outcome["why"], outcome


def test_python_dash_m(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVATTN_")}
    env.update(KVATTN_BACKEND="reference", PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "kvattn", "fuzz", "--device", "cpu", "--calls", "2", "--only",
                           "single_decode", "--modes", "plain"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "fuzz: 2 calls, 0 mismatches, 0 errors"


def test_progress_bar_redraws_on_a_terminal_and_steps_elsewhere(reference_backend):
    class Stream(io.StringIO):
        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            return self.tty

    tty, log = Stream(True), Stream(False)
    fuzz(torch.device("cpu"), calls=3, seed=0, only=("single_decode",), modes=("plain",), stream=tty)
    fuzz(torch.device("cpu"), calls=3, seed=0, only=("single_decode",), modes=("plain",), stream=log)
    assert "\r" in tty.getvalue() and "fuzz [" in tty.getvalue()
    lines = log.getvalue().splitlines()
    assert lines and "\r" not in log.getvalue() and lines[-1].startswith("fuzz [####################] 3 calls")


def test_same_seed_same_calls():
    env = draws.Env()
    a = [draws.draw(f, random.Random(3), env) for f in draws.FUNCTIONS]
    b = [draws.draw(f, random.Random(3), env) for f in draws.FUNCTIONS]
    assert a == b
    json.dumps(a)  # specs are plain data (they go into the JSON report)


# ---------------------------------------------------------------------------------------------
# The generators
# ---------------------------------------------------------------------------------------------
def test_every_argument_of_every_function_is_drawn():
    """A new argument of a public function must get a drawer (draws.ARGS) and a place in its
    builder: every parameter of the signature appears in a built call."""
    import inspect

    from kvattn.fuzz.calls import public

    env = draws.Env(interpreter=True)  # tiny shapes
    for function in draws.FUNCTIONS:
        names = set(inspect.signature(public(function)).parameters)
        seen = set(build(draws.draw(function, random.Random(0), env), "cpu").kwargs)
        assert names <= seen, (function, names - seen)


def test_draws_reach_the_edges():
    env = environment(torch.device("cpu"))
    rng = random.Random(0)
    specs = [draws.draw("batch_decode", rng, env) for _ in range(400)]
    lens = [n for s in specs for n in s["lens"]]
    assert 0 in lens and 1 in lens
    assert any(s["batch"] == 0 for s in specs)
    assert any(n == s["page"] + 1 for s in specs for n in s["lens"])
    assert any(s["view"] == "strided" for s in specs) and any(s["bmm1_scale"]["tensor"] for s in specs)
    assert {s["kv_format"] for s in specs} == {"half", "fp8", "nvfp4"}
    assert any(s["out"] == "fp8" for s in specs) and any(s["mask"] for s in specs)
    tiles = env.tiles["decode"]
    assert any(n in (t - 1, t + 1) for s in specs for n in s["lens"] for t in tiles)


def test_more_requests_than_sms_on_a_gpu_keep_the_oracle_small():
    env = draws.Env(device="cuda", sm_count=132, tiles={"decode": [64]})
    rng = random.Random(1)
    specs = [draws.draw("batch_decode", rng, env) for _ in range(300)]
    big = [s for s in specs if s["batch"] > 132]
    assert big
    for s in specs:
        width = s["kv_heads"] * s["group"] * s["head_dim"]
        assert len(s["lens"]) * max(s["lens"] + [0]) * width <= draws.ORACLE_ELEMENTS or max(s["lens"]) <= s["q_len"]


def test_unused_cache_slots_are_nan_and_outputs_poisoned():
    rng = random.Random(5)
    spec = draws.draw("batch_decode", rng, draws.Env())
    spec.update(kv_format="half", form="stacked", lens=[5, 40], batch=2, out="query", dtype="float16", q_len=1)
    call = build(spec, "cpu")
    assert torch.isnan(call.kwargs["kv_cache"].float()).any()
    call.poison()
    assert torch.isnan(call.kwargs["out"]).all()


# ---------------------------------------------------------------------------------------------
# Planted bugs: caught, shrunk, reproduced
# ---------------------------------------------------------------------------------------------
def _plant_long_request_bug(monkeypatch):
    """Batch decode that adds 1 to the rows of every request longer than 20 tokens."""
    real = kvattn.decode.xqa_batch_decode_with_kv_cache

    def wrong(*args, **kw):
        result = real(*args, **kw)
        out = result[0] if isinstance(result, tuple) else result
        q = kw.get("q_len_per_req") or 1
        lens = kw["seq_lens"].to(torch.int64).tolist()
        cu = kw.get("q_cu_seq_lens")
        cu = [b * q for b in range(len(lens) + 1)] if cu is None else cu.tolist()  # ragged drafts: packed rows
        for b, n in enumerate(lens):
            if n > 20:
                out[cu[b]:cu[b + 1]] += 1
        return result

    monkeypatch.setattr(kvattn.decode, "xqa_batch_decode_with_kv_cache", wrong)


def test_planted_bug_is_caught_shrunk_and_reproduced(capsys, monkeypatch, reference_backend):
    _plant_long_request_bug(monkeypatch)
    report = fuzz(torch.device("cpu"), calls=6, seed=11, only=("batch_decode",), modes=("plain",), quiet=True)
    assert report.mismatches >= 1 and report.failed
    assert all("snippet" in f for f in report.failures)
    shrunk = next(f for f in report.failures if "shrunk_spec" in f)
    small = shrunk["shrunk_spec"]
    assert small["batch"] == 1 and 20 < small["lens"][0] <= 40, small
    for key, off in draws.OPTIONS["batch_decode"].items():
        if key not in ("head_dim", "page", "q_len"):
            assert small[key] == off, (key, small[key])  # no option is needed to show the bug
    assert small["group"] == 1 and small["kv_heads"] == 1
    # The snippet reproduces it while the bug is there, and passes once it is gone.
    with pytest.raises(AssertionError):
        exec(compile(shrunk["snippet"], "<snippet>", "exec"), {})
    monkeypatch.undo()
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    exec(compile(shrunk["snippet"], "<snippet>", "exec"), {})
    assert "batch_decode (plain): ok" in capsys.readouterr().out


def test_planted_bug_exits_1_with_a_snippet(capsys, monkeypatch, reference_backend):
    _plant_long_request_bug(monkeypatch)
    rc, out, err = run_cli(capsys, "fuzz", "--device", "cpu", "--calls", "4", "--seed", "11", "--only",
                           "batch_decode", "--modes", "plain")
    assert rc == 1
    assert "from kvattn.fuzz import replay" in out and "replay(spec, mode='plain'" in out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("fuzz: 4 calls, ") and not summary.endswith(" 0 mismatches, 0 errors")


def test_a_crash_is_an_error(capsys, monkeypatch, reference_backend):
    def crash(**kw):
        raise RuntimeError("planted crash")

    monkeypatch.setattr(kvattn.mla, "xqa_batch_decode_with_kv_cache_mla", crash)
    report = fuzz(torch.device("cpu"), calls=2, seed=0, only=("mla",), modes=("plain",), quiet=True)
    assert report.errors == 2 and report.mismatches == 0
    assert report.failures[0]["outcome"]["why"] == "RuntimeError: planted crash"
    assert report.failures[0]["shrunk_spec"]["batch"] <= 1


def test_determinism_mode_catches_run_to_run_noise(monkeypatch, reference_backend):
    real = kvattn.xqa.xqa

    def noisy(*args, **kw):
        result = real(*args, **kw)
        kw["output"].add_(torch.rand(()).item() * 1e-3)
        return result

    monkeypatch.setattr(kvattn.xqa, "xqa", noisy)
    spec = draws.normalise(dict(draws.draw("xqa", random.Random(4), draws.Env()), lens=[10, 3]))
    outcome = run_spec(spec, "determinism", "cpu", 0)
    assert outcome["result"] == "mismatch" and "different output bits" in outcome["why"], outcome


def test_invariant_mode_catches_a_batch_dependent_result(monkeypatch, reference_backend):
    real = kvattn.prefill.trtllm_batch_context_with_kv_cache

    def batch_dependent(*args, **kw):  # one unit in the last place more when not alone
        result = real(*args, **kw)
        out = result[0] if isinstance(result, tuple) else result
        if kw["batch_size"] > 1:
            out.view(torch.int16).add_(1)
        return result

    spec = dict(draws.draw("prefill", random.Random(2), draws.Env()), lens=[30, 12, 50], q_lens=[5, 12, 1],
                out_dtype="none", fp8_query=False, dtype="float16")
    spec = draws.normalise(spec)
    assert run_spec(spec, "invariant", "cpu", 0)["result"] == "ok"
    monkeypatch.setattr(kvattn.prefill, "trtllm_batch_context_with_kv_cache", batch_dependent)
    assert run_spec(spec, "plain", "cpu", 0)["result"] == "ok"  # within tolerance: only the bits show it
    outcome = run_spec(spec, "invariant", "cpu", 0)
    assert outcome["result"] == "mismatch" and "batch-invariant mode" in outcome["why"], outcome


def test_request_rows_pick_the_request(reference_backend):
    """The invariant mode's slices: request b's rows of the batch output are request b's call."""
    env = draws.Env()
    rng = random.Random(9)
    for function in ("batch_decode", "xqa", "mla", "prefill"):
        spec = dict(draws.draw(function, rng, env), lens=[33, 7, 50])
        if function == "prefill":
            spec["q_lens"] = [3, 7, 1]
        spec = draws.normalise(spec)
        call = build(spec, "cpu")
        whole, _ = call.run()
        alone_call = call.request(2)
        alone, _ = alone_call.run()
        rows = request_rows(call, 2)
        torch.testing.assert_close(whole[rows].float(), alone.float(), equal_nan=False)
        torch.testing.assert_close(call.expected()[0][rows], alone_call.expected()[0])


@pytest.mark.parametrize("function", draws.FUNCTIONS)
def test_graph_mode_rewrites_stay_legal(function, monkeypatch, reference_backend):
    """The CUDA-graph mode's in-place step (permuted table rows, shorter lengths, new scale values)
    leaves a legal call (the debug checks pass) whose oracle follows the new values."""
    monkeypatch.setenv("KVATTN_DEBUG", "1")
    rng = random.Random(8)
    for _ in range(3):
        spec = draws.draw(function, rng, draws.Env(interpreter=True))
        call = build(spec, "cpu")
        call.rewrite(random.Random(1))
        out, lse = call.run()
        exact, exact_lse = call.expected()
        assert compare(call, out, lse, exact, exact_lse)["ok"]
    if function != "single_decode":  # (its step draws new query values)
        spec = draws.normalise(dict(spec, lens=[40, 25], q_lens=[3, 2]))
        call = build(spec, "cpu")
        before = call.expected()[0].clone()
        call.rewrite(random.Random(1))
        assert not torch.equal(before, call.expected()[0])


def test_old_reproducers_still_build():
    """A spec without an option registered later builds with that option off."""
    spec = draws.draw("batch_decode", random.Random(0), draws.Env())
    del spec["enable_pdl"], spec["o_scale"]
    call = build(spec, "cpu")
    assert call.kwargs["enable_pdl"] is None and call.kwargs["o_scale"] == 1.0


def test_shrink_candidates_are_smaller():
    spec = draws.draw("prefill", random.Random(0), draws.Env())
    spec = draws.normalise(dict(spec, lens=[40, 9], q_lens=[40, 2], group=4, kv_heads=2))
    cands = list(candidates(spec))
    assert any(c["lens"] == [40] for c in cands) and any(c["group"] == 1 for c in cands)
    assert all(c != spec for c in cands)


# ---------------------------------------------------------------------------------------------
# The Triton interpreter (CPU tier) and the GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(ON_GPU, reason="the GPU runs the compiled kernels: test_short_fuzz_on_gpu_in_every_mode")
@pytest.mark.skipif(not _interpreter_usable(), reason="this Triton's interpreter cannot run with this numpy")
def test_fixed_seed_run_in_the_interpreter(triton_backend):
    from kvattn.runtime import backend as _backend

    assert _backend.use_triton("batch_decode", torch.device("cpu"))  # the kernels, not the reference
    report = fuzz(torch.device("cpu"), calls=24, seed=1, modes=("plain", "invariant"), quiet=True)
    assert report.calls == 24
    assert not report.failed, [(f["function"], f["mode"], f["outcome"]["why"]) for f in report.failures]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and the compiled kernels need a GPU")
def test_short_fuzz_on_gpu_in_every_mode(triton_backend):
    # Round-robin over the 19 (function, mode) pairs: three calls each (most of the time goes to
    # compiling the kernels each new shape needs).
    report = fuzz(torch.device("cuda"), calls=57, seed=0, quiet=True)
    failures = [(f["function"], f["mode"], f["outcome"]["why"], f.get("snippet")) for f in report.failures]
    assert not report.failed, failures
    for function in draws.FUNCTIONS:
        modes = set(report.counts[function])
        want = {"plain", "graph", "determinism"} | ({"invariant"} if function != "single_decode" else set())
        assert modes == want, (function, modes)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_graph_mode_capture_out_of_memory_hands_the_cache_back_and_captures_again(monkeypatch):
    """A capture cannot free the ordinary pool's cached blocks, so a worker whose share of the
    GPU sat in that cache failed its captures (1,437 of a ten-minute run's 53,549 calls, every one
    in graph mode): the graph mode now empties the cache and captures once more."""
    from kvattn.fuzz import modes

    seen = []

    def doubled(x):
        seen.append(torch.cuda.is_current_stream_capturing())
        if len(seen) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory (planted)")
        return x * 2

    emptied = []
    real_empty = torch.cuda.empty_cache
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True) or real_empty())
    x = torch.ones(8, device="cuda")
    graph, y = modes._capture(doubled, {"x": x}, x.device)
    x.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    assert seen == [True, True] and emptied == [True]
    assert (y == 6).all()


# ---------------------------------------------------------------------------------------------
# FlashInfer 0.7.2.post1's arguments (docs/semantics.md): drawn, and checked by the oracle
# ---------------------------------------------------------------------------------------------
def test_draws_reach_the_release_arguments():
    env = draws.Env()
    rng = random.Random(3)
    specs = {f: [draws.draw(f, rng, env) for _ in range(300)] for f in ("batch_decode", "xqa", "mla", "prefill")}
    for f in ("batch_decode", "xqa"):
        ragged = [s for s in specs[f] if s["drafts"] is not None]
        assert ragged and any(s["mask"] for s in ragged), f
        assert any(0 in s["drafts"] for s in ragged) and any(s["q_len"] in s["drafts"] for s in ragged), f
        assert {s["cu_dtype"] for s in ragged} == {"int32", "uint32"}, f
        for s in ragged:  # no request with more draft rows than keys or than Q
            assert all(q <= min(n, s["q_len"]) for q, n in zip(s["drafts"], s["lens"])), s
    xqa = specs["xqa"]
    assert any(s["q_len"] > 1 and s["drafts"] is None and s["mask"] for s in xqa)
    assert any(s["kv_format"] == "nvfp4" and s["kv_scale"] for s in xqa)
    assert any(s["out"] == "fp8" and s["rcp_out_scale"] != 1.0 for s in xqa)
    assert {s["enable_pdl"] for s in xqa} == {None, True, False}
    assert {s["q_len"] for s in specs["mla"]} == {1, 2, 3, 4}
    prefill = specs["prefill"]
    assert any(not s["causal"] for s in prefill)
    assert all(s["window_left"] == -1 and not s["skip_softmax"] for s in prefill if not s["causal"])
    assert {s["sf_name"] for s in prefill if s["kv_format"] == "nvfp4"} == {"kv_cache_sf", "kv_block_scales"}
    assert {s["backend"] for s in prefill} == {"trtllm-gen", "cake"} and any(s["counter_buffer"] for s in prefill)
    assert {s["use_fp16_softmax"] for s in prefill} == {None, True, False}
    assert {s["uses_spcompress"] for s in prefill} == {None, True, False}


def _spec(function, seed, **fixed):
    return draws.normalise(dict(draws.draw(function, random.Random(seed), draws.Env()), **fixed))


def _altered(module, name, monkeypatch, change):
    """Plant a bug: the public function called with ``change(kwargs)`` in place of its arguments."""
    real = getattr(module, name)

    def wrong(**kw):
        return real(**change(dict(kw)))

    monkeypatch.setattr(module, name, wrong)


RELEASE_CASES = {
    # name: (function, spec keys, module, public name, the planted change of the arguments)
    "batch_decode-ragged-mask-ignored": (
        "batch_decode", dict(q_len=3, ragged=True, drafts=[3, 0, 2], lens=[40, 9, 17], mask=True, out="query",
                             kv_format="half", window_left=-1),
        "decode", "xqa_batch_decode_with_kv_cache", lambda kw: dict(kw, mask=None)),
    "batch_decode-ragged-offsets-shifted": (
        "batch_decode", dict(q_len=3, ragged=True, drafts=[1, 3, 2], lens=[40, 9, 17], mask=False, out="query",
                             kv_format="half", window_left=-1),
        # all the rows handed to the first request that can take them: request 0 three, 1 two, 2 one
        "decode", "xqa_batch_decode_with_kv_cache",
        lambda kw: dict(kw, q_cu_seq_lens=torch.tensor([0, 3, 5, 6], dtype=torch.int32))),
    "xqa-drafts-mask-ignored": (
        "xqa", dict(q_len=4, ragged=False, lens=[40, 20], mask=True, kv_format="half", sliding_win_size=0),
        "xqa", "xqa", lambda kw: dict(kw, mask=None)),
    "xqa-ragged-mask-ignored": (
        "xqa", dict(q_len=4, ragged=True, drafts=[4, 0, 3], lens=[40, 5, 20], mask=True, kv_format="half",
                    sliding_win_size=0),
        "xqa", "xqa", lambda kw: dict(kw, mask=None)),
    "xqa-nvfp4-kv-scale-ignored": (
        "xqa", dict(kv_format="nvfp4", kv_scale=True, lens=[40, 20], q_len=1, ragged=False),
        "xqa", "xqa", lambda kw: dict(kw, kv_scale=None)),
    "xqa-rcp-out-scale-ignored": (
        "xqa", dict(kv_format="fp8", out="fp8", rcp_out_scale=2.0, lens=[40, 20], q_len=1, ragged=False),
        "xqa", "xqa", lambda kw: dict(kw, rcp_out_scale=1.0)),
    "prefill-bidirectional-as-causal": (
        "prefill", dict(causal=False, lens=[30, 12], q_lens=[5, 12], out_dtype="none", fp8_query=False),
        "prefill", "trtllm_batch_context_with_kv_cache", lambda kw: dict(kw, causal=True)),
}


@pytest.mark.parametrize("case", sorted(RELEASE_CASES))
def test_release_arguments_pass_and_a_planted_bug_in_them_is_caught(case, monkeypatch, reference_backend):
    """The oracle of each new argument agrees with the reference and tells a call that ignores
    the argument (or gets its offsets wrong) from a right one."""
    function, fixed, module, name, change = RELEASE_CASES[case]
    spec = _spec(function, 21, **fixed)
    for key, value in fixed.items():
        assert spec[key] == value, (key, spec[key])  # normalise kept the case
    assert run_spec(spec, "plain", "cpu", 0)["result"] == "ok"
    _altered(getattr(kvattn, module), name, monkeypatch, change)
    outcome = run_spec(spec, "plain", "cpu", 0)
    assert outcome["result"] == "mismatch", outcome


def test_mla_multi_token_causality_is_checked(monkeypatch, reference_backend):
    """Q > 1 MLA tokens are causal among themselves: a call where every token sees every key fails."""
    spec = _spec("mla", 4, q_len=3, lens=[40, 3, 17], out="none", dtype="bfloat16", kv_dtype="bfloat16")
    assert run_spec(spec, "plain", "cpu", 0)["result"] == "ok"
    real = kvattn.mla.xqa_batch_decode_with_kv_cache_mla

    def all_keys(**kw):  # token by token over the whole request: no causality among the drafts
        q = kw["query"]
        results = [real(**dict(kw, query=q[:, r:r + 1].contiguous(), out=None, lse=None))
                   for r in range(q.shape[1])]
        if kw["return_lse"]:
            return (torch.stack([o for o, _ in results], 1), torch.stack([l_ for _, l_ in results], 1))
        return torch.stack(results, 1)

    monkeypatch.setattr(kvattn.mla, "xqa_batch_decode_with_kv_cache_mla", all_keys)
    assert run_spec(spec, "plain", "cpu", 0)["result"] == "mismatch"


def test_prefill_block_scales_under_either_name_and_old_reproducers(reference_backend):
    """kv_cache_sf (the release's position 20) and kv_block_scales (the seed's keyword) build the
    same call; a spec written before these options builds with them off."""
    base = dict(kv_format="nvfp4", lens=[30, 12], q_lens=[5, 12], out_dtype="none", fp8_query=False)
    a = build(_spec("prefill", 6, sf_name="kv_cache_sf", **base), "cpu")
    b = build(_spec("prefill", 6, sf_name="kv_block_scales", **base), "cpu")
    assert a.kwargs["kv_cache_sf"] is not None and a.kwargs["kv_block_scales"] is None
    assert b.kwargs["kv_block_scales"] is not None and b.kwargs["kv_cache_sf"] is None
    torch.testing.assert_close(a.run()[0], b.run()[0], rtol=0, atol=0)
    old = draws.draw("prefill", random.Random(0), draws.Env())
    for key in ("causal", "sf_name", "counter_buffer", "use_fp16_softmax", "uses_spcompress", "backend"):
        del old[key]
    call = build(old, "cpu")
    assert call.kwargs["causal"] is True and call.kwargs["backend"] == "trtllm-gen"
    assert call.kwargs["multi_ctas_kv_counter_buffer"] is None


def test_shrinking_a_ragged_batch_keeps_its_drafts():
    spec = _spec("batch_decode", 2, q_len=3, ragged=True, drafts=[3, 0, 2], lens=[40, 9, 17])
    for c in candidates(spec):
        c = draws.normalise(c)
        if c["drafts"] is not None:
            assert len(c["drafts"]) == len(c["lens"])
            assert all(q <= min(n, c["q_len"]) for q, n in zip(c["drafts"], c["lens"])), c


# ---------------------------------------------------------------------------------------------
# Reproducers of what the fuzzer found (its shrunk snippets)
# ---------------------------------------------------------------------------------------------
# xqa with ragged drafts, Q = 2: a request of one draft row whose mask row hides its own key. The
# kernels and the reference read that row's mask bit; the float64 side ran the request as a
# one-token decode, which reads no mask, and called the right answer wrong (docs/semantics.md:
# the mask is read whenever the call's Q > 1).
ONE_ROW_REQUEST_MASK = {
    "function": "xqa", "seed": 1182428127, "dtype": "bfloat16", "kv_format": "half", "head_dim": 64,
    "kv_heads": 1, "group": 1, "page": 16, "batch": 1, "q_len": 2, "ragged": True, "lens": [2], "drafts": [1],
    "cu_dtype": "int32", "extra_pages": 0, "pool": "flat", "view": "contiguous", "arg_views": False,
    "seq_lens_dtype": "uint32", "q_scale": "plain", "kv_scale": False, "sliding_win_size": 0, "sinks": False,
    "sm_count": None, "enable_pdl": None, "mask": True, "out": "query", "rcp_out_scale": 1.0,
    "return_lse": False, "lse_given": False,
}


@pytest.mark.parametrize("mode", ["plain", "invariant"])
def test_reproducer_one_row_request_reads_its_mask(mode, reference_backend):
    assert replay(ONE_ROW_REQUEST_MASK, mode=mode, device="cpu", mode_seed=1879774259)["result"] == "ok"
    call = build(ONE_ROW_REQUEST_MASK, "cpu")
    assert int(call.kwargs["mask"][0, 0]) & 1 == 0, "the case hides the row's own key"


def test_one_row_request_mask_bit_moves_the_float64_result():
    """Not vacuous: the dense formulation gives the one-row request a different result with its
    own key hidden than with it visible."""
    from kvattn import dense

    call = build(ONE_ROW_REQUEST_MASK, "cpu")
    kw = call.kwargs
    pages = kw["k_cache"].reshape(-1, 16, 1, 64), kw["v_cache"].reshape(-1, 16, 1, 64)
    q = kw["q"].reshape(-1, 1, 64)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    hidden = torch.zeros(1, 2, dtype=torch.uint16)
    shown = torch.ones(1, 2, dtype=torch.uint16)
    common = dict(kv_cache=pages, block_tables=kw["page_table"], seq_lens=kw["seq_lens"].reshape(-1).to(torch.int32),
                  q_len_per_req=2, q_cu_seq_lens=cu)
    a = dense.batch_decode(q, mask=hidden, **common)
    b = dense.batch_decode(q, mask=shown, **common)
    assert not torch.allclose(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="the Gluon prefill kernel runs on a Hopper GPU only")
@pytest.mark.parametrize("mode", ["plain", "graph"])
def test_prefill_query_rows_padded_by_8_reproducer(mode, triton_backend):
    """Found by the fuzzer on an H200 (shrunk): a float16 query whose rows are padded by 8
    elements (``arg_views``) failed to compile in the Gluon prefill kernel (its ``cp.async`` row
    copies could only be proven 2-byte aligned); such a query now takes the Triton kernel."""
    spec = {'function': 'prefill',
            'seed': 354718023,
            'dtype': 'float16',
            'kv_format': 'half',
            'fp8_query': False,
            'head_dim': 128,
            'kv_heads': 1,
            'group': 1,
            'page': 8,
            'batch': 1,
            'lens': [1],
            'q_lens': [1],
            'extra_pages': 0,
            'layout': 'HND',
            'form': 'stacked',
            'split_tables': False,
            'view': 'contiguous',
            'arg_views': True,
            'seq_lens_dtype': 'int32',
            'bmm1_scale': 'plain',
            'bmm2_scale': 'plain',
            'causal': True,
            'window_left': -1,
            'sinks': None,
            'out_dtype': 'none',
            'out': False,
            'o_sf_scale': None,
            'o_sf_vec_size': 16,
            'skip_softmax': 0.0,
            'return_lse': False,
            'lse_given': False,
            'enable_pdl': None,
            'sf_name': 'kv_block_scales',
            'counter_buffer': False,
            'use_fp16_softmax': False,
            'uses_spcompress': True,
            'backend': 'trtllm-gen'}
    replay(spec, mode=mode, device="cuda", mode_seed=1060411765)
