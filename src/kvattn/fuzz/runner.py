"""The fuzz loop: draw, run, check, shrink the failures, count, report."""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass, field

import torch

from ..runtime import env as _env
from .claims import Claims, family
from .compiles import CompileCounter
from .corpus import FRESH_CPU, FRESH_CUDA, Corpus, class_key, mutate
from .draws import FUNCTIONS, Env, tile_sizes
from .modes import MODES, applicable, run_spec
from .shrink import shrink, snippet

SHRINK_PER_KIND = 2  # failures shrunk per (function, mode, result); the rest are recorded as drawn, with snippets
SHRINK_BUDGET = 150  # tries per shrink


def default_fresh(device: torch.device) -> float:
    """``--fresh``'s default: mostly classes already compiled on a GPU, every call fresh elsewhere."""
    return FRESH_CUDA if torch.device(device).type == "cuda" else FRESH_CPU


_NO_COMPILES = {"kernels": 0, "cold_calls": 0, "warm_seconds": 0.0, "from_disk_cache": 0}


@dataclass
class Report:
    device: str
    seed: int
    modes: tuple
    only: tuple
    calls: int = 0
    mismatches: int = 0
    errors: int = 0
    seconds: float = 0.0
    counts: dict = field(default_factory=dict)  # function -> mode -> {"calls", "mismatches", "errors"}
    failures: list = field(default_factory=list)
    fresh: float = 1.0
    class_seed: int | None = None  # the fresh classes' own seed (--shared-classes), or None
    jobs: int = 1
    busy: dict = field(default_factory=dict)  # function -> seconds its calls took (shrinking not counted)
    # function -> {"kernels": compiled or loaded by its calls, "cold_calls": calls that compiled one,
    # "warm_seconds": seconds its other calls took, "from_disk_cache": kernels of "kernels" that
    # Triton loaded from its disk cache (another worker's or an earlier run's compile)}
    compiles: dict = field(default_factory=dict)
    classes: dict = field(default_factory=dict)  # function -> {"classes", "fresh", "mutated"} (summed over jobs)
    workers: list = field(default_factory=list)  # --jobs: one summary a worker
    put_off: int = 0  # turns put off while another worker compiled the class (--shared-classes)

    def timing(self) -> dict:
        """Calls a second over the run, and per function its calls, the seconds they took and
        their share of the rate (calls of the function per second of the run)."""
        wall = max(self.seconds, 1e-9)
        per = {}
        for function, per_mode in self.counts.items():
            n = sum(c["calls"] for c in per_mode.values())
            busy = self.busy.get(function, 0.0)
            cold = self.compiles.get(function, _NO_COMPILES)
            warm = n - cold["cold_calls"]
            per[function] = {"calls": n, "seconds": round(busy, 2), "calls_per_second": round(n / wall, 2),
                             "ms_per_call": round(1000 * busy / n, 1) if n else None,
                             "kernels_compiled": cold["kernels"], "cold_calls": cold["cold_calls"],
                             "kernels_from_disk_cache": cold.get("from_disk_cache", 0),
                             "warm_ms_per_call": round(1000 * cold["warm_seconds"] / warm, 1) if warm else None}
        return {"calls_per_second": round(self.calls / wall, 2), "per_function": per}

    def add_call(self, function: str, mode: str, seconds: float, kernels: int, from_disk: int = 0) -> dict:
        """Count one call that took ``seconds`` and compiled ``kernels`` (``from_disk`` of them
        loaded from Triton's disk cache); its count cell."""
        self.busy[function] = self.busy.get(function, 0.0) + seconds
        cold = self.compiles.setdefault(function, dict(_NO_COMPILES))
        if kernels:
            cold["kernels"] += kernels
            cold["cold_calls"] += 1
            cold["from_disk_cache"] += from_disk
        else:
            cold["warm_seconds"] += seconds
        cell = self.counts.setdefault(function, {}).setdefault(mode, {"calls": 0, "mismatches": 0, "errors": 0})
        cell["calls"] += 1
        self.calls += 1
        return cell

    @property
    def summary(self) -> str:
        return f"fuzz: {self.calls} calls, {self.mismatches} mismatches, {self.errors} errors"

    @property
    def failed(self) -> bool:
        return bool(self.mismatches or self.errors)

    def as_json(self) -> dict:
        return {"command": "fuzz", "device": self.device, "seed": self.seed, "modes": list(self.modes),
                "only": list(self.only), "calls": self.calls, "mismatches": self.mismatches, "errors": self.errors,
                "seconds": round(self.seconds, 2), "fresh": self.fresh, "class_seed": self.class_seed,
                "jobs": self.jobs, "timing": self.timing(),
                "classes": self.classes, "workers": self.workers, "counts": self.counts, "busy": self.busy,
                "compiles": self.compiles, "put_off": self.put_off, "failures": self.failures}


class Ticker:
    """A progress bar on stderr: redrawn in place on a terminal (at most 10 times a second), a
    line every tenth of the way (or every 30 s) otherwise."""

    def __init__(self, calls: int | None, seconds: float | None, stream=None, quiet: bool = False):
        self.stream = stream if stream is not None else sys.stderr
        self.calls, self.seconds, self.quiet = calls, seconds, quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = self.last = time.perf_counter()
        self.last_fraction = 0.0

    def fraction(self, done: int) -> float:
        if self.calls:
            return done / self.calls
        return min((time.perf_counter() - self.t0) / self.seconds, 1.0) if self.seconds else 0.0

    def update(self, report: Report, label: str) -> None:
        if self.quiet:
            return
        now = time.perf_counter()
        f = self.fraction(report.calls)
        if self.tty:
            if now - self.last < 0.1 and f < 1.0:
                return
        elif f - self.last_fraction < 0.1 and now - self.last < 30 and f < 1.0:
            return
        self.last, self.last_fraction = now, f
        filled = int(20 * f)
        text = (f"fuzz [{'#' * filled}{'.' * (20 - filled)}] {report.calls} calls, {report.mismatches} mismatches, "
                f"{report.errors} errors, {now - self.t0:.0f} s  {label}")
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r" + text[:width].ljust(width))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty and not self.quiet:
            self.stream.write("\r" + " " * (shutil.get_terminal_size((100, 20)).columns - 1) + "\r")
            self.stream.flush()


def environment(device: torch.device) -> Env:
    interpreter = device.type == "cpu" and _env.backend_override() == "triton" and _env.triton_interpret()
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
    return Env(device=device.type, interpreter=interpreter, sm_count=sm_count, tiles=tile_sizes())


def reference_outcome(spec: dict, mode_seed: int) -> dict:
    """The same spec on the CPU reference backend, plain: tells a kernel bug (the reference passes)
    from a generator or oracle problem (it fails too)."""
    with _env.switches(KVATTN_BACKEND="reference"):
        return run_spec(spec, "plain", "cpu", mode_seed)


def fuzz(device: torch.device, *, calls: int | None = None, seconds: float | None = None, seed: int = 0,
         only=FUNCTIONS, modes=MODES, stream=None, quiet: bool = False, shrink_budget: int = SHRINK_BUDGET,
         fresh: float | None = None, class_seed: int | None = None, progress=None,
         claims: str | None = None) -> Report:
    """Run random legal calls until ``calls`` are done or ``seconds`` have passed.

    Parameters
    ----------
    device : torch.device
        Where the calls run (CPU: the reference, or the kernels in Triton's interpreter with
        ``KVATTN_BACKEND=triton`` and ``TRITON_INTERPRET=1``).
    calls, seconds : int or float, optional
        The budget: at least one of them.
    seed : int
        Seed of the draws: the same seed draws the same calls.
    only : tuple of str
        Functions to fuzz (``kvattn.fuzz.FUNCTIONS``); the calls go round them and the modes in turn.
    modes : tuple of str
        Of ``kvattn.fuzz.MODES``; a mode a function or device cannot take is left out for it.
    stream : file, optional
        Where the progress bar goes (default stderr); ``quiet`` turns it off.
    shrink_budget : int
        Tries a shrink may take.
    fresh : float, optional
        Chance that a call is a fresh draw (a possibly new kernel class) rather than a class already
        seen with new runtime values, once its function has a few classes (``kvattn.fuzz.corpus``).
        Default: ``FRESH_CUDA`` on a GPU, 1.0 elsewhere (every call fresh: the draws of the seed).
    class_seed : int, optional
        Seed of the fresh classes' own stream (``--jobs --shared-classes``: every worker the same
        classes, each with its own runtime values); default: the classes come from ``seed``.
    progress : callable, optional
        Called with the report after every call (``--jobs``: a worker's counts to the parent).
    claims : str, optional
        A directory the ``--jobs --shared-classes`` workers share (:mod:`kvattn.fuzz.claims`): a
        class another worker is compiling is put off, and a class this worker has warmed runs
        instead.

    Returns
    -------
    Report
        Counts per function and mode, and the failures with their specs and snippets.

    Examples
    --------
    >>> import torch
    >>> from kvattn.fuzz import fuzz
    >>> report = fuzz(torch.device("cpu"), calls=4, seed=2, only=("xqa", "mla"), modes=("plain",), quiet=True)
    >>> report.summary, sorted(report.counts)
    ('fuzz: 4 calls, 0 mismatches, 0 errors', ['mla', 'xqa'])
    """
    if calls is None and seconds is None:
        raise ValueError("calls, seconds: expected a budget, got neither")
    env = environment(device)
    use = [(f, m) for f in only for m in modes if applicable(m, f, device)]
    fresh = default_fresh(device) if fresh is None else fresh
    corpus = Corpus(fresh, env, class_seed)
    report = Report(str(device), seed, tuple(modes), tuple(only), fresh=fresh, class_seed=class_seed)
    if not use:
        return report
    rng = random.Random(seed)
    ticker = Ticker(calls, seconds, stream, quiet)
    shrunk: dict = {}
    t0 = time.perf_counter()
    check_reference = device.type == "cuda" or env.interpreter
    compile_log = os.environ.get("KVATTN_FUZZ_COMPILE_LOG") or None
    claimed = Claims(claims) if claims is not None else None
    turn = put_off = 0  # (turn: the calls made, and the turns put off for another worker's compile)
    with CompileCounter().installed() as compiled:
        while True:
            if calls is not None and report.calls >= calls:
                break
            if seconds is not None and time.perf_counter() - t0 >= seconds:
                break
            function, mode = use[turn % len(use)]
            turn += 1
            spec = corpus.next(function, rng)
            if claimed is not None:
                spec = _unclaimed(spec, mode, corpus, claimed, rng)
                if spec is None:  # another worker compiles it, and no class of the function is warm here
                    report.put_off += 1
                    put_off += 1
                    if put_off >= len(use):  # every turn waits on another worker
                        time.sleep(CLAIM_POLL)
                        put_off = 0
                    continue
                put_off = 0
            mode_seed = rng.randrange(2**31)
            started, kernels, from_disk = time.perf_counter(), compiled.count, compiled.from_disk
            outcome = run_spec(spec, mode, device, mode_seed)
            cell = report.add_call(function, mode, time.perf_counter() - started, compiled.count - kernels,
                                   compiled.from_disk - from_disk)
            if claimed is not None:
                claimed.ran((class_key(spec), family(mode)))
            if compile_log is not None and compiled.count > kernels:
                _log_compiles(compile_log, function, mode, spec, compiled.kernels[kernels:])
            if outcome["result"] != "ok":
                key = "mismatches" if outcome["result"] == "mismatch" else "errors"
                cell[key] += 1
                setattr(report, key, getattr(report, key) + 1)
                record = {"function": function, "mode": mode, "mode_seed": mode_seed, "spec": spec, "outcome": outcome,
                          "snippet": snippet(spec, mode, device.type, mode_seed, outcome["why"])}
                kind = (function, mode, outcome["result"], outcome.get("error_type"))
                if shrunk.get(kind, 0) < SHRINK_PER_KIND:
                    shrunk[kind] = shrunk.get(kind, 0) + 1
                    # With a time budget, shrinking gets at most a tenth of it past the end.
                    deadline = None if seconds is None else t0 + seconds * 1.1
                    small, small_outcome, tries = shrink(spec, outcome, lambda s: run_spec(s, mode, device, mode_seed),
                                                         shrink_budget, deadline)
                    record.update(shrunk_spec=small, shrunk_outcome=small_outcome, shrink_tries=tries,
                                  snippet=snippet(small, mode, device.type, mode_seed, small_outcome["why"]))
                    if check_reference:
                        record["reference"] = reference_outcome(small, mode_seed)
                report.failures.append(record)
            report.seconds = time.perf_counter() - t0
            report.classes = corpus.stats()
            ticker.update(report, f"{function} ({mode})")
            if progress is not None:
                progress(report)
    report.seconds = time.perf_counter() - t0
    ticker.done()
    return report


CLAIM_POLL = 0.05  # seconds between looks at a class another worker is compiling


def _unclaimed(spec: dict, mode: str, corpus: Corpus, claimed: Claims, rng: random.Random) -> dict | None:
    """``spec``, or where another worker is compiling its class, a new call of a class this
    worker has warmed (same function and mode family); None with none warmed: the turn goes to
    the next function and mode (whose next fresh class this worker may compile meanwhile: at the
    start the workers compile the first classes side by side)."""
    fam = family(mode)
    if claimed.ready((class_key(spec), fam)):
        return spec
    seen = corpus.classes.get(spec["function"], {})
    warm = [parent for key, parent in seen.items() if (key, fam) in claimed.warm]
    if warm:
        return mutate(warm[rng.randrange(len(warm))], rng, corpus.env)
    return None


def _log_compiles(path: str, function: str, mode: str, spec: dict, kernels: list) -> None:
    """One JSON line a cold call (``KVATTN_FUZZ_COMPILE_LOG``): its class, spec and the kernel
    specialisations it compiled, to find the runtime fields that still pick kernels: ``compiled``
    each one's Triton ``repr``, ``kernels`` each one's :func:`~kvattn.fuzz.compiles.describe`
    record (its constexprs by name, the arguments' specialisation attributes, whether it came
    from the disk cache)."""
    line = json.dumps({"pid": os.getpid(), "function": function, "mode": mode, "class": class_key(spec),
                       "spec": spec, "compiled": [k["repr"] for k in kernels], "kernels": kernels}, default=str)
    with open(path, "a") as f:
        f.write(line + "\n")


def print_report(report: Report, out=None) -> None:
    out = out or sys.stdout
    timing = report.timing()
    jobs = f", {report.jobs} jobs (seeds {report.seed} to {report.seed + report.jobs - 1})" if report.jobs > 1 else ""
    print(f"device: {report.device}, seed {report.seed}{jobs}, {report.seconds:.1f} s, "
          f"{timing['calls_per_second']:.1f} calls/s, fresh {report.fresh:g}"
          + (f", classes of seed {report.class_seed}" if report.class_seed is not None else ""), file=out)
    for w in report.workers:
        print(f"  worker {w['worker']} (seed {w['seed']}): {w['summary']}, {w['seconds']:.1f} s", file=out)
    for function, per_mode in report.counts.items():
        cells = ", ".join(f"{m} {c['calls']}" + (f" ({c['mismatches']} mismatches, {c['errors']} errors)"
                                                 if c["mismatches"] or c["errors"] else "")
                          for m, c in per_mode.items())
        kinds = report.classes.get(function)
        rate = timing["per_function"][function]
        extra = (f"  [{rate['ms_per_call']} ms a call" + (f", {kinds['classes']} classes" if kinds else "")
                 + (f", {rate['cold_calls']} calls compiled {rate['kernels_compiled']} kernels"
                    + (f" ({rate['kernels_from_disk_cache']} from the disk cache)" if rate["kernels_from_disk_cache"] else "")
                    + f", the others {rate['warm_ms_per_call']} ms a call" if rate["cold_calls"] else "") + "]")
        print(f"  {function:<14s} {cells}{extra}", file=out)
    for i, f in enumerate(report.failures):
        if "worker_error" in f:
            print(f"\nfailure {i + 1}: worker {f['worker']} (seed {f['seed']}) {f['outcome']['why']}", file=out)
            print(f["worker_error"], file=out)
            continue
        if "shrunk_spec" not in f:
            continue
        print(f"\nfailure {i + 1}: {f['function']} ({f['mode']}): {f['outcome']['why']}", file=out)
        print(f"shrunk in {f['shrink_tries']} tries to: {f['shrunk_outcome']['why']}", file=out)
        if "reference" in f:
            ref = f["reference"]
            print(f"the CPU reference on the shrunk call: {ref['result']}" + (f" ({ref['why']})" if ref["why"] else ""),
                  file=out)
        print(f["snippet"], file=out)
    unshrunk = sum("shrunk_spec" not in f and "worker_error" not in f for f in report.failures)
    if unshrunk:
        print(f"({unshrunk} more failures recorded unshrunk, each with its snippet; see --json)", file=out)
    print(report.summary, file=out)
