"""The harness's timer (``kvattn.benchmarking.timing``): input sets rotated one per call, the host
timer's call counts on a CPU, no graph there; on a GPU, do_bench and graph replay times."""

from __future__ import annotations

import time

import pytest
import torch

from kvattn.benchmarking import timing
from kvattn.benchmarking.timing import Timer

CPU = torch.device("cpu")


def test_rotation_calls_each_input_set_in_turn():
    seen = []
    step = timing.rotating([lambda i=i: seen.append(i) for i in range(3)])
    for _ in range(7):
        step()
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    one = lambda: None  # noqa: E731
    assert timing.rotating([one]) is one


def test_host_timer_makes_the_minimum_calls_then_fills_its_budget():
    calls = []
    us = timing.host_median_us(lambda: calls.append(1), budget_ms=0)
    assert len(calls) == timing.HOST_MIN_CALLS and us >= 0
    calls.clear()
    us = timing.host_median_us(lambda: (calls.append(1), time.sleep(1e-3)), budget_ms=30)
    assert timing.HOST_MIN_CALLS < len(calls) < 60 and 1e3 <= us < 2e4, (len(calls), us)
    calls.clear()
    timing.host_median_us(lambda: calls.append(1), budget_ms=60_000)
    assert len(calls) == timing.HOST_MAX_CALLS


def test_eager_on_a_cpu_warms_every_input_set_first_and_has_no_graph():
    order = []
    fns = [lambda: order.append("a"), lambda: order.append("b")]
    timer = Timer(CPU, warmup_ms=1, rep_ms=1)
    us = timer.eager(fns)
    assert order[:2] == ["a", "b"] and order[2:5] == ["a", "b", "a"] and us >= 0
    assert timer.graph(fns) is None and not timer.cuda


def test_eager_runs_inside_the_context():
    inside = []

    class Ctx:
        def __enter__(self):
            inside.append(True)

        def __exit__(self, *exc):
            inside.append(False)

    def fn():
        assert inside[-1] is True

    Timer(CPU, rep_ms=1).eager([fn], Ctx)
    assert inside == [True, False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="do_bench and CUDA graphs need a GPU")
def test_gpu_eager_graph_and_back_to_back_times():
    dev = torch.device("cuda")
    x = [torch.randn(1 << 20, device=dev) for _ in range(2)]
    ys = [torch.empty_like(t) for t in x]
    fns = [lambda i=i: torch.mul(x[i], 2.0, out=ys[i]) for i in range(2)]
    timer = Timer(dev, warmup_ms=5, rep_ms=10)
    eager, graph = timer.eager(fns), timer.graph(fns)
    assert 0 < graph < 1e4 and 0 < eager < 1e4, (eager, graph)
    assert 0 < timing.back_to_back_us(fns) < 1e4
    ys[0].zero_()
    for g in timing.capture_graphs(fns):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(ys[0], x[0] * 2)
