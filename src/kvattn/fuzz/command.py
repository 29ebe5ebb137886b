"""``kvattn fuzz``: its arguments and what it runs (registered by :mod:`kvattn.cli`)."""

from __future__ import annotations

import argparse

from .._console import FUNCTION_KEYS, UsageError, choice_list, positive_int, write_json, writable
from .draws import MODES
from .corpus import FRESH_CPU, FRESH_CUDA

DESCRIPTION = (
    "Draw random legal calls of the five public functions from a seed, run each on the device in "
    "the chosen modes and compare it with the independent float64 formulation (kvattn.dense). A "
    "failing call is shrunk and printed as a Python snippet. Ends with the line 'fuzz: N calls, M "
    "mismatches, K errors'; exit status 1 on any mismatch or error. On a CPU the reference backend "
    "runs, or the Triton kernels in Triton's interpreter with KVATTN_BACKEND=triton TRITON_INTERPRET=1."
)


def _modes(text: str) -> tuple:
    return choice_list(text, MODES)


def _function(text: str) -> str:
    if text not in FUNCTION_KEYS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(FUNCTION_KEYS)}, got {text!r}")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _fresh(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a probability between 0 and 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability between 0 and 1, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--calls", type=positive_int, default=None, metavar="N",
                        help="stop after N calls (default 200 when --seconds is not given)")
    budget.add_argument("--seconds", type=_seconds, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the draws (default 0)")
    p.add_argument("--only", type=_function, action="append", default=None, metavar="FUNCTION",
                   help=f"fuzz only this function (repeatable): one of {', '.join(FUNCTION_KEYS)}")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")
    p.add_argument("--modes", type=_modes, default=MODES, metavar="LIST",
                   help=f"comma-separated subset of {','.join(MODES)} (default all; graph runs on cuda only)")
    p.add_argument("--fresh", type=_fresh, default=None, metavar="P",
                   help="chance that a call is a fresh draw (a possibly new kernel class, compiled on a GPU) "
                        "rather than a class already seen with new lengths, batch and values, once a function "
                        f"has a few classes (default {FRESH_CUDA:g} on cuda, {FRESH_CPU:g} on cpu: every call fresh)")
    p.add_argument("--jobs", type=positive_int, default=1, metavar="N",
                   help="N worker processes on the device, seeds SEED to SEED+N-1, each with the whole budget; "
                        "their reports merged (default 1). On a GPU the time goes to compiling kernels, which is "
                        "CPU-bound: --jobs of about half the CPU cores multiplies the rate")
    p.add_argument("--shared-classes", action="store_true",
                   help="with --jobs: every worker draws the same fresh kernel classes (each call with its own "
                        "lengths, batch and values), so a kernel one worker compiles the others load from "
                        "Triton's disk cache: more calls, fewer classes")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="write the report as JSON (counts per function and mode, every failure with its "
                        "spec, shrunk spec and snippet)")


def main(args, device) -> int:
    from ..runtime import env as _env
    from .._version import __version__
    from .runner import fuzz, print_report

    writable(args.json, "--json")
    if device.type == "cpu" and _env.backend_override() == "triton" and not _env.triton_interpret():
        raise UsageError("KVATTN_BACKEND=triton on a CPU needs Triton's interpreter: set TRITON_INTERPRET=1")
    if "graph" in args.modes and len(args.modes) == 1 and device.type != "cuda":
        raise UsageError("--modes graph: CUDA graphs need --device cuda")
    only = tuple(dict.fromkeys(args.only)) if args.only else FUNCTION_KEYS
    from .modes import applicable

    if not any(applicable(m, f, device) for f in only for m in args.modes):
        raise UsageError(f"--modes {','.join(args.modes)}: none of them applies to {', '.join(only)} on {device.type} "
                         "(graph needs cuda; invariant needs a batch: not single_decode)")
    calls = args.calls if args.calls is not None or args.seconds is not None else 200
    if args.jobs > 1:
        from .jobs import fuzz_jobs

        report = fuzz_jobs(device, args.jobs, calls=calls, seconds=args.seconds, seed=args.seed, only=only,
                           modes=args.modes, fresh=args.fresh, shared_classes=args.shared_classes)
    else:
        report = fuzz(device, calls=calls, seconds=args.seconds, seed=args.seed, only=only, modes=args.modes,
                      fresh=args.fresh, class_seed=args.seed if args.shared_classes else None)
    print_report(report)
    if args.json:
        doc = report.as_json()
        doc["kvattn"] = __version__
        write_json(args.json, doc)
    return 1 if report.failed else 0
