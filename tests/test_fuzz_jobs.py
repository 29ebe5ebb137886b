"""``kvattn fuzz --jobs N`` (kvattn.fuzz.jobs): the workers' reports merged into one, and a worker
that raises, dies or outlives the budget becomes an error of the merged report, never a loss.

The workers are spawned processes: the failing workers below are functions of this module, which
the spawned child imports by name (it inherits the parent's ``sys.path``)."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from kvattn import cli
from kvattn.fuzz import jobs

CPU = torch.device("cpu")


@pytest.fixture
def one_thread_workers(monkeypatch, reference_backend):
    # Spawned children read the environment: the reference backend, one thread each.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield


def _raises(**kwargs):
    raise RuntimeError("planted failure in a fuzz worker")


def _dies(**kwargs):
    os._exit(3)


def _hangs(**kwargs):
    time.sleep(600)


def _raises_in_one(seed, **kwargs):
    if seed % 2:
        raise RuntimeError(f"planted failure in the worker of seed {seed}")
    from kvattn.fuzz import fuzz

    return fuzz(seed=seed, **kwargs)


def test_two_workers_merge_their_counts(capsys, tmp_path, one_thread_workers):
    path = tmp_path / "fuzz.json"
    rc = cli.main(["fuzz", "--device", "cpu", "--calls", "4", "--seed", "5", "--jobs", "2", "--only", "xqa",
                   "--only", "single_decode", "--modes", "plain", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.strip().splitlines()[-1] == "fuzz: 8 calls, 0 mismatches, 0 errors"
    assert "worker 0 (seed 5): fuzz: 4 calls" in out and "worker 1 (seed 6): fuzz: 4 calls" in out
    doc = json.loads(path.read_text())
    assert (doc["calls"], doc["jobs"], doc["errors"], doc["failures"]) == (8, 2, 0, [])
    assert [w["seed"] for w in doc["workers"]] == [5, 6]
    assert doc["counts"] == {"xqa": {"plain": {"calls": 4, "mismatches": 0, "errors": 0}},
                             "single_decode": {"plain": {"calls": 4, "mismatches": 0, "errors": 0}}}
    assert doc["timing"]["calls_per_second"] > 0
    assert sum(f["calls"] for f in doc["timing"]["per_function"].values()) == 8
    assert doc["classes"]["xqa"]["fresh"] == 4  # on the CPU every call is fresh


def test_merge_sums_counts_and_tags_failures():
    def doc(seed, calls, failures):
        return {"seed": seed, "calls": calls, "mismatches": len(failures), "errors": 0, "seconds": 1.0,
                "counts": {"mla": {"plain": {"calls": calls, "mismatches": len(failures), "errors": 0}}},
                "busy": {"mla": 0.5}, "classes": {"mla": {"classes": 2, "fresh": 2, "mutated": calls - 2}},
                "compiles": {"mla": {"kernels": 1, "cold_calls": 1, "warm_seconds": 0.25}}, "failures": failures}

    merged = jobs.merge([doc(0, 3, []), doc(1, 5, [{"function": "mla", "mode": "plain"}])], "cuda", 0, ("plain",),
                        ("mla",), 0.03, 2.0)
    assert (merged.calls, merged.mismatches, merged.jobs) == (8, 1, 2)
    assert merged.counts["mla"]["plain"] == {"calls": 8, "mismatches": 1, "errors": 0}
    assert merged.failures == [{"function": "mla", "mode": "plain", "worker": 1}]
    assert merged.classes["mla"] == {"classes": 4, "fresh": 4, "mutated": 4}
    assert merged.timing()["per_function"]["mla"]["warm_ms_per_call"] == round(1000 * 0.5 / 6, 1)
    assert merged.timing()["calls_per_second"] == 4.0


@pytest.mark.parametrize("target, words", [(_raises, "RuntimeError: planted failure"),
                                           (_dies, "exited with code 3")], ids=["raises", "dies"])
def test_a_failing_worker_is_an_error(target, words, one_thread_workers):
    report = jobs.fuzz_jobs(CPU, 2, calls=2, seed=0, quiet=True, target=target)
    assert report.failed and report.errors == 2 and report.calls == 0
    assert [f["worker"] for f in report.failures] == [0, 1]
    assert all(words in f["outcome"]["why"] for f in report.failures), [f["outcome"] for f in report.failures]


def test_one_failing_worker_keeps_the_others_report(capsys, one_thread_workers):
    report = jobs.fuzz_jobs(CPU, 2, calls=2, seed=0, quiet=True, target=_raises_in_one, only=("single_decode",),
                            modes=("plain",))
    assert (report.calls, report.errors) == (2, 1)
    (failure,) = report.failures
    assert failure["worker"] == 1 and "seed 1" in failure["outcome"]["why"]
    assert "Traceback" in failure["worker_error"]
    from kvattn.fuzz import print_report

    print_report(report)
    out = capsys.readouterr().out
    assert "worker 1 (seed 1) raised RuntimeError: planted" in out
    assert out.strip().endswith("fuzz: 2 calls, 0 mismatches, 1 errors")


def test_the_budget_ends_a_worker_that_hangs(monkeypatch, one_thread_workers):
    monkeypatch.setattr(jobs, "STARTUP_SECONDS", 8.0)
    t0 = time.perf_counter()
    report = jobs.fuzz_jobs(CPU, 1, seconds=0.5, seed=0, quiet=True, target=_hangs)
    assert time.perf_counter() - t0 < 60
    (failure,) = report.failures
    assert report.errors == 1 and "ended" in failure["outcome"]["why"]


def test_jobs_argument_errors(capsys):
    for argv in (["--jobs", "0"], ["--fresh", "1.5"], ["--fresh", "x"]):
        rc = cli.main(["fuzz", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and argv[0] in err, (argv, err)


@pytest.mark.gpu
@pytest.mark.runs_long
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the workers fuzz the GPU")
def test_two_workers_on_the_gpu(monkeypatch, triton_backend):
    report = jobs.fuzz_jobs(torch.device("cuda"), 2, calls=38, seed=0, quiet=True)
    failures = [(f["function"], f["mode"], f["outcome"]["why"], f.get("snippet")) for f in report.failures]
    assert report.calls == 76 and not report.failed, failures
    assert len(report.workers) == 2 and report.fresh == 0.03
    for function, per_mode in report.counts.items():
        want = {"plain", "graph", "determinism"} | ({"invariant"} if function != "single_decode" else set())
        assert set(per_mode) == want, (function, per_mode)
    timing = report.timing()
    assert sum(t["kernels_compiled"] for t in timing["per_function"].values()) > 0
    assert sum(s["mutated"] for s in report.classes.values()) > 0


def _class_seed(device, seed, class_seed=None, **kwargs):
    from kvattn.fuzz.runner import Report

    return Report(str(device), seed if class_seed is None else 1000 + class_seed, (), ())


@pytest.mark.parametrize("shared", [False, True], ids=["own-classes", "shared-classes"])
def test_shared_classes_give_every_worker_the_class_seed(shared, one_thread_workers):
    report = jobs.fuzz_jobs(CPU, 2, calls=1, seed=7, quiet=True, target=_class_seed, shared_classes=shared)
    assert not report.failed, report.failures
    assert [w["seed"] for w in report.workers] == ([1007, 1007] if shared else [7, 8])
    assert report.as_json()["class_seed"] == (7 if shared else None)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_gpu_worker_caps_its_memory_and_reports_under_its_own_index(device, monkeypatch):
    """A GPU worker caps its allocator at its share of the device (``"cuda"`` alone: the current
    device) and reports under its own index: reading the device's index once shadowed the worker's,
    and every worker reported as worker 0, so the merge kept one report of twelve."""
    capped = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # (the worker's, not this process's)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda share, gpu: capped.append((share, gpu)))

    class Done:
        def as_json(self):
            return {"calls": 1}

    results = []

    class Results:
        put = results.append

    jobs._worker(5, lambda **kwargs: Done(), {"device": device}, 1, Results(), jobs=4)
    assert capped == [(jobs.GPU_MEMORY_SHARE / 4, 0 if device == "cuda" else 1)]
    assert results == [("done", 5, {"calls": 1})]


def test_long_tests_are_collected_first(request):
    """``tests/conftest.py`` puts the ``runs_long`` tests (this file's GPU job among them) at the
    head of the collection, every other test in its order after them (fails without the hook
    whenever the GPU job is collected, as in every whole-suite run)."""
    items = request.session.items
    flags = [item.get_closest_marker("runs_long") is not None for item in items]
    assert flags == sorted(flags, reverse=True)
    gpu_job = [item for item in items if item.name == "test_two_workers_on_the_gpu"]
    assert all(item.get_closest_marker("runs_long") for item in gpu_job)
