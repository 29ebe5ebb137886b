"""``kvattn bench``: the five functions beside the attention torch provides, on this machine.

One shape per function (GPU-sized on CUDA, tiny on a CPU), random values, each request's pages in a
random order. For each shape: kvattn's call, then torch's ``scaled_dot_product_attention`` under each
backend (flash, cuDNN, memory-efficient) and FlexAttention (``torch.compile``) on the same values
laid out contiguously, ``[B, H, L, D]``. The peers have no paged form: their K/V are gathered from
the pages *before* timing, so their times leave out the copy a paged cache would pay on every call.
Decode shapes fold each KV head's query heads into query rows for SDPA (K/V read once per KV head).

GPU times: ``triton.testing.do_bench`` medians, L2 flushed before every repetition, of the replay
of a CUDA graph holding one call (what the kernels take) and of eager calls (launch overhead
included). CPU times: medians of host-timed eager calls; they only show that the command works.
Each peer's output is compared with kvattn's (relative error). The benchmark behind the numbers
the project reports is ``benchmarks/run.py`` in the repository (ceilings, many shapes, peers on
paged inputs too); this command is the small version a user runs on their own GPU. Both share one
harness, :mod:`kvattn.benchmarking` (timing, measurement, records, peers' availability, tables);
this module is that harness on the built-in problems (:mod:`kvattn.benchmarking.builtin`).

As a library::

    from kvattn import bench
    doc = bench.run(torch.device("cuda"))     # {"env": ..., "method": ..., "records": [...]}
"""

from __future__ import annotations

import argparse
import importlib.util
import warnings
from typing import Optional

import torch

from ._console import FUNCTION_KEYS, Progress, UsageError, function_list, positive_int
from .benchmarking.availability import NotAvailable
from .benchmarking.builtin import Problem, build
from .benchmarking.measure import Variant, rel_err, short_error, time_variant
from .benchmarking.records import environment, headline_us, write_json
from .benchmarking.table import WIDTH, print_report
from .benchmarking.timing import Timer
from .benchmarking.torch_peers import SDPA_BACKENDS, flex as flex_peer, sdpa as sdpa_peer

__all__ = ["Progress", "add_arguments", "build", "main", "method", "plot", "print_report", "run"]

# The op each function's kvattn call dispatches (runtime.backend's names): Triton or the reference.
_OPS = {"batch_decode": "batch_decode", "xqa": "batch_decode", "single_decode": "single_decode",
        "mla": "mla_decode", "prefill": "context"}


def method(device: torch.device) -> str:
    if device.type == "cuda":
        return ("us: triton.testing.do_bench medians, L2 flushed before every repetition; graph = replay of a CUDA "
                "graph holding one call, eager = plain calls (launch overhead included). Peers run on K/V "
                "gathered from the pages into contiguous [B, H, L, D] before timing (a paged cache would pay "
                "that gather on every call).")
    return ("us: medians of host-timed eager calls on the CPU (no CUDA graphs, no L2 flush): kvattn runs its "
            "plain-PyTorch reference here and torch its CPU attention, so these numbers only show that the "
            "command works; run it on a GPU to compare kernels.")


def _measure(rec: dict, var: Variant, timer: Timer, ref: Optional[torch.Tensor]) -> torch.Tensor:
    """Time ``var`` into ``rec`` and compare its output with ``ref``; returns the output (``[B, Hq, Lq, Dv]``)."""
    out = var.unfold(time_variant(rec, var, timer)).clone()
    if ref is not None:
        rec["rel_err"] = rel_err(out, ref)
    return out


def _time_one(rec: dict, key: str, impl_name: str, prob: Problem, timer: Timer, flex: bool,
              device: torch.device, refs: dict) -> None:
    """kvattn's call or one peer of ``prob`` into ``rec`` (kvattn's output kept in ``refs``)."""
    if impl_name == "kvattn":
        from .runtime import backend as _backend

        rec["backend"] = "triton" if _backend.use_triton(_OPS[key], device) else "reference"
        if rec["backend"] == "reference":
            rec["note"] = "kvattn's reference backend"
        if prob.peer_note:
            rec["note"] = "; ".join(x for x in (rec["note"], prob.peer_note) if x)
        refs[key] = _measure(rec, Variant("kvattn", "kvattn", [prob.run], unfold=prob.common), timer, None)
        return
    if prob.peers is None:
        rec.update(status="n/a", note=prob.peer_note)
        return
    if impl_name == "flex":
        if not flex:
            rec.update(status="skipped", note="FlexAttention not timed on a CPU (torch.compile there "
                                              "takes minutes)" if device.type != "cuda" else "--no-flex")
            return
        if prob.peers.flex:
            rec.update(status="n/a", note=prob.peers.flex)
            return
        var = flex_peer(prob.peers)
    else:
        var = sdpa_peer(prob.peers, impl_name.split("-", 1)[1])
    rec["note"] = var.note
    _measure(rec, var, timer, refs.get(key))


def run(device: torch.device, functions=FUNCTION_KEYS, *, peers: bool = True, flex: Optional[bool] = None,
        warmup_ms: int = 25, rep_ms: int = 100, progress: bool = True) -> dict:
    """Measure and return the results document (``env``, ``method``, ``records``)."""
    if flex is None:
        flex = device.type == "cuda"
    timer = Timer(device, warmup_ms, rep_ms)
    plan = []
    for key in functions:
        plan.append((key, "kvattn"))
        if peers and key != "xqa":
            plan += [(key, f"sdpa-{b}") for b in SDPA_BACKENDS] + [(key, "flex")]
    bar = Progress(len(plan), "kvattn bench", quiet=not progress)
    records: list[dict] = []
    problems: dict = {}
    refs: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reference fallbacks and torch's backend notices: the table says
        for key, impl_name in plan:
            bar.step(f"{key}: {impl_name}")
            if key not in problems:
                problems.clear()  # one problem's inputs alive at a time
                refs.clear()
                problems[key] = build(key, device)
            prob = problems[key]
            rec = {"function": prob.function, "shape": prob.shape, "impl": impl_name, "status": "ok", "note": "",
                   "eager_us": None, "graph_us": None, "unit": prob.unit, "work": prob.work}
            records.append(rec)
            try:
                _time_one(rec, key, impl_name, prob, timer, flex, device, refs)
            except NotAvailable as exc:
                rec.update(status="n/a", note=str(exc))
            except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the run
                rec.update(status="error", note=short_error(exc, 160))
                if device.type == "cuda":
                    torch.cuda.synchronize()
            finally:
                rec["us"] = headline_us(rec)
                if rec["us"] and rec["status"] == "ok":
                    rec["rate"] = rec["work"] / (rec["us"] * 1e-6)
    bar.done()
    problems.clear()
    return {"env": environment(device), "method": method(device), "records": records}


def plot(doc: dict, path: str) -> None:
    """Bars of each implementation's time per function (graph replay where there is one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    functions = []
    for r in doc["records"]:
        if r["function"] not in functions:
            functions.append(r["function"])
    fig, axes = plt.subplots(len(functions), 1, figsize=(9, 1.2 + 1.6 * len(functions)), squeeze=False)
    for ax, fn in zip(axes[:, 0], functions):
        recs = [r for r in doc["records"] if r["function"] == fn and r["status"] == "ok" and r.get("us")]
        names = [r["impl"] for r in recs]
        values = [r["us"] for r in recs]
        colours = ["#d62728" if n == "kvattn" else "#1f77b4" if n.startswith("sdpa") else "#2ca02c" for n in names]
        ax.barh(names, values, color=colours)
        ax.invert_yaxis()
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.0f}" if v >= 100 else f" {v:.1f}", va="center", fontsize=7)
        shape = recs[0]["shape"] if recs else ""
        ax.set_title(f"{fn}: {shape}", fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
        ax.set_xlabel("us per call (lower is better)", fontsize=7)
    env = doc["env"]
    fig.suptitle(f"kvattn {env['kvattn']} bench, {env['device']}, {env['date'][:10]}, torch {env['torch']}, "
                 f"triton {env['triton']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")
    p.add_argument("--only", type=function_list, default=FUNCTION_KEYS, metavar="LIST",
                   help=f"comma-separated subset of {','.join(FUNCTION_KEYS)}")
    p.add_argument("--no-peers", dest="peers", action="store_false", help="time kvattn alone")
    p.add_argument("--no-flex", dest="flex", action="store_false", default=None, help="skip FlexAttention")
    p.add_argument("--rep-ms", type=positive_int, default=100, help="time spent measuring each call, ms")
    p.add_argument("--json", metavar="FILE", default=None, help="write the results document (JSON)")
    p.add_argument("--plot", metavar="FILE", default=None, help="write a bar chart (PNG; needs matplotlib)")
    p.add_argument("--wide", action="store_true",
                   help=f"one table line a record, shapes and notes in their own columns (default: {WIDTH} columns)")


def main(args, device: torch.device) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
    doc = run(device, args.only, peers=args.peers, flex=args.flex, rep_ms=args.rep_ms)
    print_report(doc, wide=args.wide)
    if args.json:
        write_json(args.json, doc)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(doc, args.plot)
        print(f"wrote {args.plot}")
    failed = [r for r in doc["records"] if r["impl"] == "kvattn" and r["status"] != "ok"]
    return 1 if failed else 0

