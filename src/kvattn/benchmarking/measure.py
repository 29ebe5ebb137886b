"""One timed implementation of a problem (:class:`Variant`: kvattn or a peer, one callable per input
set) and its measurement into a record: the first call (compilation, autotuning) kept out of the
timing, eager and CUDA-graph times, a capture failure recorded beside the eager time; the output
check (:func:`rel_err`); errors as one short line."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from .timing import Timer, sync

Fn = Callable[[], object]

# Errors after which the CUDA context is unusable: the harness stops timing on this process.
FATAL_MARKERS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                 "misaligned address", "an illegal instruction", "CUDA error: unknown error",
                 "uncorrectable ECC")


@dataclass
class Variant:
    """``fns[i]`` runs the whole timed call on input set ``i``.

    ``includes`` names what the timed call does besides attention (``"gather"``: copying the pages
    into contiguous K/V; ``"rope"``; ``"cast"``: fp8 to bf16), empty for attention alone.
    ``unfold(out)`` maps the callable's raw output to ``[B, Hq, Lq, Dv]`` (used by the check, never
    inside the timed call). ``context`` wraps every call (e.g. an SDPA backend selection).
    """

    name: str
    family: str
    fns: list[Fn]
    includes: str = ""
    note: str = ""
    unfold: Callable[[torch.Tensor], torch.Tensor] = lambda o: o
    context: Callable[[], ContextManager] = nullcontext
    graph: bool = True
    eager: bool = True  # time eager calls too (the +prep peer variants only replay graphs, to save time)
    extra: dict = field(default_factory=dict)


def is_fatal(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(m.lower() in text for m in FATAL_MARKERS)


def short_error(exc: BaseException, limit: int = 600) -> str:
    """``Type: first line of the message``, at most ``limit`` characters."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:limit]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float32; infinite when ``out`` holds a NaN or an infinity."""
    o, r = out.float(), ref.float()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def time_variant(rec: dict, var: Variant, timer: Timer, graph_only: bool = False):
    """Time ``var`` into ``rec`` (``first_call_s``, ``eager_us``, ``graph_us`` or ``graph_error``)
    and return its first call's raw output. On a CPU: eager times only. ``graph_only`` skips the
    eager calls where a graph replay is timed. A fatal error (:func:`is_fatal`) is raised."""
    t0 = time.perf_counter()
    with var.context():
        first = var.fns[0]()  # compiles / autotunes / picks kernels
    sync(timer.device)
    rec["first_call_s"] = round(time.perf_counter() - t0, 3)
    if (var.eager and not graph_only) or not timer.cuda:
        rec["eager_us"] = timer.eager(var.fns, var.context)
    if var.graph and timer.cuda:
        try:
            rec["graph_us"] = timer.graph(var.fns, var.context)
        except Exception as exc:  # noqa: BLE001 - graph capture failures are reported, eager still stands
            if is_fatal(exc):
                raise
            rec["graph_error"] = short_error(exc)
            torch.cuda.synchronize()
    if timer.cuda and rec.get("graph_us") is None and rec.get("eager_us") is None:
        rec["eager_us"] = timer.eager(var.fns, var.context)  # graph-only, but no graph: an eager time
    return first
