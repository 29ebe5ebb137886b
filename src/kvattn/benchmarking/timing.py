"""Timing one call: ``triton.testing.do_bench`` medians of eager calls and of CUDA-graph replays.

``do_bench`` flushes L2 between repetitions and times each with device events. Several input sets
(one callable per set) are rotated round-robin so a small working set is not served from L2 even
between the flush and the call. On a CPU a host timer stands in and graphs are skipped: medians of
host-timed calls, at least :data:`HOST_MIN_CALLS`, then as many as fit in ``rep_ms`` (at most
:data:`HOST_MAX_CALLS`); those numbers only show that the plumbing works.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Sequence

import torch

Fn = Callable[[], object]
HOST_MIN_CALLS = 3
HOST_MAX_CALLS = 1000


def rotating(fns: Sequence[Fn]) -> Fn:
    """One callable that runs ``fns[0]``, ``fns[1]``, ... in turn, one per call."""
    if len(fns) == 1:
        return fns[0]
    state = {"i": 0}

    def step():
        i = state["i"]
        state["i"] = i + 1
        return fns[i % len(fns)]()

    return step


@dataclass
class Timer:
    """Times a list of equivalent callables (one per input set); results in microseconds."""

    device: torch.device
    warmup_ms: int = 25
    rep_ms: int = 100

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def eager(self, fns: Sequence[Fn], context: Callable[[], ContextManager] = nullcontext) -> float:
        """Median microseconds of one plain call (launch overhead included)."""
        with context():
            for f in fns:  # first calls compile / autotune / pick kernels: keep them out of the timing
                f()
            if not self.cuda:
                return host_median_us(rotating(fns), self.rep_ms)
            torch.cuda.synchronize()
            from triton.testing import do_bench

            return 1e3 * do_bench(rotating(fns), warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")

    def graph(self, fns: Sequence[Fn], context: Callable[[], ContextManager] = nullcontext) -> float | None:
        """Median of replays of a CUDA graph holding one call (one graph per input set); None on a CPU."""
        if not self.cuda:
            return None
        with context():
            graphs = capture_graphs(fns)
        try:
            from triton.testing import do_bench

            replays = [g.replay for g in graphs]
            return 1e3 * do_bench(rotating(replays), warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")
        finally:
            del graphs


def capture_graphs(fns: Sequence[Fn]) -> list:
    """One graph per callable, captured after warm-up calls on a side stream (as PyTorch requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    graphs = []
    for f in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            f()
        graphs.append(g)
    torch.cuda.synchronize()
    return graphs


def back_to_back_us(fns: Sequence[Fn], context: Callable[[], ContextManager] = nullcontext,
                    replays: int = 20) -> float:
    """Mean time of back-to-back graph replays (rotating input sets) with no L2 flush between.

    do_bench's flush leaves ~L2-size dirty lines that the timed call then writes back; on a call
    of a few tens of microseconds that write-back is a visible share of the time.
    """
    with context():
        graphs = capture_graphs(fns)
    for g in graphs:
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(replays):
        graphs[i % len(graphs)].replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def host_median_us(fn: Fn, budget_ms: float) -> float:
    """Median microseconds of host-timed calls: at least HOST_MIN_CALLS, then until ``budget_ms``
    has passed or HOST_MAX_CALLS were made."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < HOST_MIN_CALLS or (time.perf_counter() - start < budget_ms / 1e3
                                          and len(times) < HOST_MAX_CALLS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
