"""The ``kvattn`` command (also ``python -m kvattn``).

``kvattn check``    runs each public function on a few shapes and compares every result with an
                    independent float64 formulation (:mod:`kvattn.dense`): a table of errors against
                    their tolerances, times and rates. On a GPU it checks the Triton kernels; on a
                    CPU the plain-PyTorch reference, or with ``--interpret`` the kernels in Triton's
                    interpreter. Exit status 1 if any check fails.
``kvattn info``     versions, the device, the environment switches, what serves each function and
                    which version-gated fast paths are on.
``kvattn bench``    times the five functions beside the attention torch provides (SDPA backends,
                    FlexAttention) on this machine's GPU (:mod:`kvattn.bench`).
``kvattn fuzz``     random legal calls of the five functions against the float64 formulation, in
                    plain, CUDA-graph, determinism and batch-invariant modes; failures shrunk to
                    Python snippets (:mod:`kvattn.fuzz`, docs/fuzzing.md). Exit status 1 on any
                    mismatch or error.

A mistake on the command line (a device this machine lacks, a bad number, a bad switch value) ends
in one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

import torch

from .runtime import env as _env
from ._console import (  # noqa: F401  (re-exported: the command's names live in kvattn.cli too)
    FUNCTION_KEYS,
    FUNCTIONS,
    Progress,
    UsageError,
    format_rate,
    format_time,
    function_list,
    positive_int,
    print_grouped,
    print_table,
    writable,
    write_json,
)
from ._version import __version__
# The subcommands' functions, dispatched by _run; the tolerances and describe_device re-exported
# (kvattn.cli.TOL_16BIT is the name the fuzzer's oracle documents).
from .cli_check import TOL_16BIT, TOL_NVFP4, _interpreter, check, check_interpreter_numpy  # noqa: F401
from .cli_info import describe_device, info  # noqa: F401


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage dump) and reach :func:`main` as UsageError."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an argument no parser knows is reported by the subcommand it was
        given to (``kvattn check --bogus`` points to ``kvattn check --help``)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(parsed, "command", None)
            sub = self._subcommands().get(command) if command else None
            (sub or self).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def _subcommands(self) -> dict:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def resolve_device(text: str | None) -> torch.device:
    """``--device``: cuda, cuda:N or cpu; default CUDA when present. Raises UsageError."""
    if text is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {text!r}: not a device name (expected cuda, cuda:N or cpu)") from None
    if device.type not in ("cuda", "cpu"):
        raise UsageError(f"--device {text}: kvattn runs on cuda or cpu, not {device.type}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise UsageError(f"--device {text}: CUDA is not available on this machine ({why}); try --device cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UsageError(f"--device {text}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())


def check_switches() -> None:
    """Parse every ``KVATTN_*`` switch now, so a bad value is one line and not a traceback later."""
    try:
        for read in (_env.backend_override, _env.debug_checks, _env.call_cache, _env.fast_launch, _env.fused_merge,
                     _env.gluon, _env.gluon_ws, _env.batch_invariant_env):
            read()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvattn", description="Attention kernels for LLM inference: check, info, bench, fuzz.",
                     epilog="Functions: " + "; ".join(f"{s} = {p}" for s, p, _ in FUNCTIONS))
    parser.add_argument("--version", action="version", version=f"kvattn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{check,info,bench,fuzz}")

    p = sub.add_parser("check", help="run every function, compare with float64, print a table",
                       description="Run each public function on a few shapes and compare with an independent "
                                   "float64 formulation. Exit status 1 if any result is out of tolerance.")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")
    p.add_argument("--small", action="store_true", help="small shapes even on a GPU")
    p.add_argument("--only", type=function_list, default=FUNCTION_KEYS, metavar="LIST",
                   help=f"comma-separated subset of {','.join(FUNCTION_KEYS)}")
    p.add_argument("--reps", type=positive_int, default=None,
                   help="timed calls per case after the checked one (default 20 on a GPU, 3 on a CPU; with "
                        "--interpret the checked call alone is timed)")
    p.add_argument("--interpret", action="store_true",
                   help="on a CPU: run the Triton kernels in Triton's interpreter (minutes) instead of the reference")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the results as JSON")

    p = sub.add_parser("info", help="versions, device, switches, kernels, fast paths",
                       description="Versions, the device, the environment switches, what serves each function "
                                   "and which version-gated fast paths are on.")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")

    from .bench import add_arguments

    p = sub.add_parser("bench", help="time the five functions beside torch's SDPA and FlexAttention",
                       description="Time the five functions on this machine's GPU beside the attention torch "
                                   "provides (scaled_dot_product_attention backends, FlexAttention).")
    add_arguments(p)

    from .fuzz.command import DESCRIPTION as FUZZ_DESCRIPTION, add_arguments as add_fuzz_arguments

    p = sub.add_parser("fuzz", help="random legal calls against float64, shrunk reproducers",
                       description=FUZZ_DESCRIPTION)
    add_fuzz_arguments(p)
    return parser


def _run(args) -> int:
    check_switches()
    if args.command == "info":
        return info(resolve_device(args.device))
    if args.command == "check":
        device = resolve_device(args.device)
        writable(args.json, "--json")
        if args.interpret and device.type != "cpu":
            raise UsageError("--interpret runs the kernels in Triton's interpreter on the CPU: use it with --device cpu")
        if device.type == "cpu" and not args.interpret and _env.backend_override() == "triton" \
                and not _env.triton_interpret():
            raise UsageError("KVATTN_BACKEND=triton on a CPU needs Triton's interpreter: add --interpret")
        # TRITON_INTERPRET=1 KVATTN_BACKEND=triton on a CPU is --interpret spelled through the
        # environment: the same float16 cases (the interpreter has no bfloat16) and untimed calls.
        interpret = args.interpret or (device.type == "cpu" and _env.backend_override() == "triton"
                                       and _env.triton_interpret())
        big = device.type == "cuda" and not args.small
        reps = args.reps or (20 if device.type == "cuda" else 0 if interpret else 3)
        if interpret:
            check_interpreter_numpy()
            with _interpreter():
                return check(device, big, reps, interpret=True, json_path=args.json, only=args.only)
        return check(device, big, reps, json_path=args.json, only=args.only)
    if args.command == "bench":
        from . import bench

        device = resolve_device(args.device)
        writable(args.json, "--json")
        writable(args.plot, "--plot")
        if device.type == "cpu" and _env.backend_override() == "triton":
            raise UsageError("KVATTN_BACKEND=triton: kvattn bench times compiled kernels on a GPU; on a CPU it times "
                             "the reference (unset KVATTN_BACKEND)")
        return bench.main(args, device)
    if args.command == "fuzz":
        from .fuzz import command

        return command.main(args, resolve_device(args.device))
    raise AssertionError(args.command)


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        return _run(args)
    except UsageError as exc:
        print(f"kvattn: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvattn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

