"""What the ``kvattn`` command's parts share: the function names, user errors, argument types,
units, tables and the progress bar (:mod:`kvattn.cli`, :mod:`kvattn.bench`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

# The five public functions, by the short names the tables use.
FUNCTIONS = (
    ("batch decode", "kvattn.decode.xqa_batch_decode_with_kv_cache", "batch_decode"),
    ("xqa", "kvattn.xqa.xqa", "batch_decode"),
    ("single decode", "kvattn.decode.single_decode_with_kv_cache", "single_decode"),
    ("MLA decode", "kvattn.mla.xqa_batch_decode_with_kv_cache_mla", "mla_decode"),
    ("prefill", "kvattn.prefill.trtllm_batch_context_with_kv_cache", "context"),
)
FUNCTION_KEYS = ("batch_decode", "xqa", "single_decode", "mla", "prefill")  # --only's names


class UsageError(Exception):
    """A mistake of the caller's: printed as one line, exit status 2."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def choice_list(text: str, allowed) -> tuple:
    """A comma-separated, non-empty subset of ``allowed``, in the order given (an argparse type)."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in keys if k not in allowed]
    if bad or not keys:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(allowed)}, got {text!r}")
    return keys


def function_list(text: str) -> tuple:
    """``--only``: a comma-separated subset of FUNCTION_KEYS, in the order given."""
    return choice_list(text, FUNCTION_KEYS)


def format_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_rate(per_second: float, unit: str) -> str:
    """``unit`` "B" (bytes: GB/s down to B/s) or "FLOP" (TFLOP/s down to FLOP/s), three digits: the
    prefix follows the value, so a slow CPU rate never reads 0.00."""
    steps = (("T", 1e12),) if unit == "FLOP" else ()
    steps += (("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0))
    for prefix, scale in steps:
        if per_second >= scale or prefix == "":
            value = per_second / scale
            return f"{value:.0f} {prefix}{unit}/s" if value >= 100 else f"{value:.3g} {prefix}{unit}/s"
    raise AssertionError("unreachable")


def aligned_lines(rows: list[tuple], header: tuple) -> list[str]:
    """The header, a rule of dashes, then the rows, in columns two spaces apart."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def print_table(rows: list[tuple], header: tuple, out=None) -> None:
    print("\n".join(aligned_lines(rows, header)), file=out or sys.stdout)


def print_grouped(rows: list[tuple], header: tuple, out=None) -> None:
    """``rows`` of ``(group title, cell, ...)``: a title line whenever the title changes, then the
    cells, indented, in aligned columns."""
    out = out or sys.stdout
    cells = [r[1:] for r in rows]
    widths = [max(len(str(r[i])) for r in cells + [header]) for i in range(len(header))]

    def line(values):
        return ("  " + "  ".join(str(v).ljust(w) for v, w in zip(values, widths))).rstrip()

    print(line(header), file=out)
    title = None
    for r in rows:
        if r[0] != title:
            title = r[0]
            print(title, file=out)
        print(line(r[1:]), file=out)


def write_json(path: str, doc: dict) -> None:
    """``doc`` as indented JSON; written beside ``path`` then moved over it, so a reader (or a run cut
    short while rewriting its results) never sees half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)


def writable(path: str | None, flag: str) -> None:
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path}: is a folder; give a file name")


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, title: str, stream=None, *, quiet: bool = False):
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.total, self.title, self.i = total, title, 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()
        self.width = 0

    def step(self, label: str) -> None:
        self.i += 1
        if self.quiet:
            return
        filled = (20 * (self.i - 1)) // max(self.total, 1)
        text = (f"{self.title} [{'#' * filled}{'.' * (20 - filled)}] {self.i}/{self.total} "
                f"{time.perf_counter() - self.t0:4.0f} s  {label}")
        if self.tty:
            text = text[: shutil.get_terminal_size((100, 20)).columns - 1]
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r" + " " * self.width + "\r")
        else:
            self.stream.write(f"{self.title}: {self.total} steps in {time.perf_counter() - self.t0:.0f} s\n")
        self.stream.flush()
