"""``kvattn fuzz --jobs N``: N worker processes fuzzing one device, their reports merged into one.

Each worker is a spawned process (a fresh CUDA context; fork would share the parent's) running
:func:`kvattn.fuzz.runner.fuzz` with seed ``seed + i`` and the whole budget. On a GPU the
calls' cost is mostly Triton compiling new kernel classes, which is CPU-bound: N workers compile N
at a time and share Triton's cache on disk, so the rate grows with N up to about half the CPU
cores; with ``--shared-classes`` the workers claim the classes they compile first
(:mod:`kvattn.fuzz.claims`), so no kernel is compiled twice at once. A worker that raises, or dies, becomes an error in the merged report (its traceback or exit
code); the parent ends every worker when the budget's hard end passes or on Ctrl-C.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
import traceback

import torch

from .runner import _NO_COMPILES, Report, Ticker, default_fresh, fuzz

# A worker stops drawing at the budget's end and shrinks for at most a tenth of it past the end;
# the parent allows this much more (spawn, import, CUDA initialisation) before ending it.
STARTUP_SECONDS = 120.0
PROGRESS_EVERY = 0.5  # seconds between a worker's progress messages
DEAD_GRACE = 3.0  # seconds a dead worker's last message may take to arrive


def worker_threads(jobs: int) -> int:
    """CPU threads a worker's torch gets: the cores shared out (the inputs' values are drawn on
    the CPU, and the float64 oracle runs there on CPU runs; more threads than cores between the
    workers only slows them all)."""
    return max(1, (os.cpu_count() or 1) // jobs)


# Share of a GPU's memory a worker's allocator may hold, divided by the number of workers: without
# a cap, blocks one worker's caching allocator keeps would be out of the others' reach.
GPU_MEMORY_SHARE = 0.9


def _worker(index: int, target, kwargs: dict, threads: int, results, jobs: int = 1) -> None:
    """A worker's body: run ``target`` (``fuzz``), put ``("done", i, report JSON)`` or ``("error",
    i, traceback)`` on ``results``; progress as ``("progress", i, calls, mismatches, errors)``.
    (Not a daemon process: Triton may start processes of its own.)"""
    torch.set_num_threads(threads)
    last = [0.0]

    def progress(report: Report) -> None:
        now = time.perf_counter()
        if now - last[0] >= PROGRESS_EVERY:
            last[0] = now
            results.put(("progress", index, report.calls, report.mismatches, report.errors))

    try:
        device = torch.device(kwargs.get("device", "cpu"))
        if device.type == "cuda" and jobs > 1:
            gpu = torch.cuda.current_device() if device.index is None else device.index  # ("cuda" alone)
            torch.cuda.set_per_process_memory_fraction(GPU_MEMORY_SHARE / jobs, gpu)
        report = target(progress=progress, quiet=True, **kwargs)
        results.put(("done", index, report.as_json()))
    except BaseException:  # noqa: BLE001 - a worker's crash (Ctrl-C too) is reported, never lost
        results.put(("error", index, traceback.format_exc()))


def merge(reports: list, device: str, seed: int, modes: tuple, only: tuple, fresh: float, seconds: float) -> Report:
    """One report from the workers' JSON reports (``None`` for a worker that gave none): counts
    and busy seconds summed, failures concatenated (each with its ``worker``)."""
    merged = Report(device, seed, tuple(modes), tuple(only), fresh=fresh, jobs=len(reports), seconds=seconds)
    for i, doc in enumerate(reports):
        if doc is None:
            continue
        merged.calls += doc["calls"]
        merged.mismatches += doc["mismatches"]
        merged.errors += doc["errors"]
        merged.put_off += doc.get("put_off", 0)
        for function, per_mode in doc["counts"].items():
            for mode, cell in per_mode.items():
                into = merged.counts.setdefault(function, {}).setdefault(mode, dict.fromkeys(cell, 0))
                for k in into:
                    into[k] += cell[k]
        for function, busy in doc["busy"].items():
            merged.busy[function] = merged.busy.get(function, 0.0) + busy
        for function, cold in doc["compiles"].items():
            into = merged.compiles.setdefault(function, dict(_NO_COMPILES))
            for k in into:
                into[k] += cold.get(k, 0)
        for function, kinds in doc["classes"].items():
            into = merged.classes.setdefault(function, {"classes": 0, "fresh": 0, "mutated": 0})
            for k in into:
                into[k] += kinds[k]
        merged.failures += [{**f, "worker": i} for f in doc["failures"]]
        summary = f"fuzz: {doc['calls']} calls, {doc['mismatches']} mismatches, {doc['errors']} errors"
        merged.workers.append({"worker": i, "seed": doc["seed"], "calls": doc["calls"], "mismatches": doc["mismatches"],
                               "errors": doc["errors"], "seconds": doc["seconds"], "summary": summary})
    return merged


def _worker_failure(merged: Report, index: int, seed: int, why: str, detail: str) -> None:
    merged.errors += 1
    merged.failures.append({"function": None, "mode": None, "worker": index, "seed": seed,
                            "outcome": {"result": "error", "why": why}, "worker_error": detail})


def fuzz_jobs(device: torch.device, jobs: int, *, calls: int | None = None, seconds: float | None = None,
              seed: int = 0, shared_classes: bool = False, stream=None, quiet: bool = False, target=fuzz,
              **kwargs) -> Report:
    """Run ``jobs`` workers of :func:`kvattn.fuzz.runner.fuzz`, worker ``i`` with seed ``seed + i``
    and the same budget, and merge their reports; ``kwargs`` go to every worker.

    With ``shared_classes`` every worker draws the same fresh classes (``class_seed=seed``; each
    call's runtime values its own): fewer classes in all, but a kernel one worker compiles the
    others load from Triton's disk cache.

    ``target`` is what a worker runs (``fuzz``; a test passes a function that fails). A worker that
    raises or dies is an error of the merged report, with its traceback or exit code.
    """
    if calls is None and seconds is None:
        raise ValueError("calls, seconds: expected a budget, got neither")
    if jobs < 1:
        raise ValueError(f"jobs: expected a number of workers >= 1, got {jobs!r}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    threads = worker_threads(jobs)
    procs = []
    # Shared classes: the first worker to reach a class compiles it, the others put it off
    # (kvattn.fuzz.claims) until Triton's disk cache has its kernels.
    claims = tempfile.mkdtemp(prefix="kvattn-fuzz-claims-") if shared_classes else None
    for i in range(jobs):
        worker_kwargs = dict(kwargs, device=torch.device(device), calls=calls, seconds=seconds, seed=seed + i)
        if shared_classes:
            worker_kwargs.update(class_seed=seed, claims=claims)
        p = ctx.Process(target=_worker, args=(i, target, worker_kwargs, threads, results, jobs),
                        name=f"kvattn-fuzz-{i}")
        p.start()
        procs.append(p)
    ticker = Ticker(calls * jobs if calls is not None else None, None if calls is not None else seconds, stream,
                    quiet)
    live = {i: (0, 0, 0) for i in range(jobs)}
    reports: list = [None] * jobs
    errors: dict = {}
    t0 = time.perf_counter()
    hard_end = None if seconds is None else t0 + 1.1 * seconds + STARTUP_SECONDS
    dead_since: dict = {}
    try:
        while len(errors) + sum(r is not None for r in reports) < jobs:
            try:
                kind, i, *rest = results.get(timeout=0.5)
                _take(kind, i, rest, live, reports, errors)
                # (past the time budget the workers are finishing: the summary follows)
                if kind == "progress" and not quiet and ticker.fraction(live_calls(live)) < 1.0:
                    done, mism, errs = (sum(v[k] for v in live.values()) for k in range(3))
                    ticker.update(Report(str(device), seed, (), (), calls=done, mismatches=mism, errors=errs),
                                  f"{jobs} jobs")
            except queue.Empty:
                pass
            now = time.perf_counter()
            for i, p in enumerate(procs):
                # A worker gone without a report (killed, a crash in C): its last message, if any,
                # is already in the pipe when it exits, so a few seconds' grace suffices.
                if reports[i] is None and i not in errors and not p.is_alive():
                    if now - dead_since.setdefault(i, now) > DEAD_GRACE:
                        errors[i] = (f"exited with code {p.exitcode} and no report", "")
            if hard_end is not None and now > hard_end:
                for i in range(jobs):
                    if reports[i] is None and i not in errors:
                        errors[i] = (f"still running {now - t0:.0f} s after the start (budget {seconds:g} s): "
                                     "ended", "")
                break
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        ticker.done()
        if claims is not None:
            shutil.rmtree(claims, ignore_errors=True)
    first = next((r for r in reports if r is not None), None)
    fresh = first["fresh"] if first else (kwargs.get("fresh") if kwargs.get("fresh") is not None
                                          else default_fresh(device))
    only, modes = (first["only"], first["modes"]) if first else (kwargs.get("only", ()), kwargs.get("modes", ()))
    merged = merge(reports, str(device), seed, modes, only, fresh, time.perf_counter() - t0)
    merged.class_seed = seed if shared_classes else None
    for i in sorted(errors):
        why, detail = errors[i]
        _worker_failure(merged, i, seed + i, why, detail)
    return merged


def live_calls(live: dict) -> int:
    return sum(v[0] for v in live.values())


def _take(kind, i, rest, live, reports, errors) -> None:
    if kind == "progress":
        live[i] = tuple(rest)
    elif kind == "done":
        reports[i] = rest[0]
        live[i] = (rest[0]["calls"], rest[0]["mismatches"], rest[0]["errors"])
    else:
        lines = rest[0].strip().splitlines()
        errors[i] = (f"raised {lines[-1] if lines else 'an exception'}", rest[0])
