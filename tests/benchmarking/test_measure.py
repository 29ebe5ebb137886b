"""One implementation measured into a record (``kvattn.benchmarking.measure``): the first call kept
out of the timing, what a CPU records, a capture failure recorded beside the eager time on a GPU, a
fatal error raised; the output check never lets a NaN pass."""

from __future__ import annotations

import pytest
import torch

from kvattn.benchmarking.measure import Variant, is_fatal, rel_err, short_error, time_variant
from kvattn.benchmarking.timing import Timer

CPU = torch.device("cpu")


def test_cpu_record_has_the_first_call_and_an_eager_time_only():
    calls = []
    x = torch.randn(4, 8)

    def fn():
        calls.append(1)
        return x * 2

    rec = {"graph_us": None}
    out = time_variant(rec, Variant("v", "peer", [fn]), Timer(CPU, rep_ms=1))
    assert torch.equal(out, x * 2)
    assert rec["first_call_s"] >= 0 and rec["eager_us"] > 0 and rec["graph_us"] is None
    assert "graph_error" not in rec and len(calls) >= 5  # first call, warm-up, >= 3 timed


def test_graph_only_still_times_eager_calls_on_a_cpu():
    rec: dict = {}
    time_variant(rec, Variant("v", "peer", [lambda: None], eager=False), Timer(CPU, rep_ms=1), graph_only=True)
    assert rec["eager_us"] >= 0


def test_an_error_in_the_first_call_leaves_no_time():
    def fn():
        raise RuntimeError("refused\nsecond line")

    rec: dict = {}
    with pytest.raises(RuntimeError) as info:
        time_variant(rec, Variant("v", "peer", [fn]), Timer(CPU, rep_ms=1))
    assert "eager_us" not in rec and short_error(info.value) == "RuntimeError: refused"
    assert short_error(ValueError("x" * 900), 160) == "ValueError: " + "x" * 148


@pytest.mark.parametrize("text,fatal", [
    ("CUDA error: an illegal memory access was encountered", True),
    ("CUDA error: device-side assert triggered", True),
    ("Misaligned address", True),
    ("out of memory", False),
    ("No available kernel. Aborting execution.", False),
])
def test_fatal_errors_are_those_that_leave_the_context_unusable(text, fatal):
    assert is_fatal(RuntimeError(text)) is fatal


def test_rel_err_is_the_relative_distance_and_never_passes_a_nan():
    ref = torch.randn(64, 16)
    assert rel_err(ref.clone(), ref) == 0.0
    assert abs(rel_err(ref * 1.01, ref) - 0.01) < 1e-6
    bad = ref.clone()
    bad[3, 4] = float("nan")
    assert rel_err(bad, ref) == float("inf")
    bad[3, 4] = float("inf")
    assert rel_err(bad, ref) == float("inf")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a GPU")
def test_gpu_capture_failure_is_recorded_beside_the_eager_time():
    dev = torch.device("cuda")
    x = torch.randn(1024, device=dev)

    def refuses_capture():
        # (a refusal of the caller's own, so the context stays usable for the tests after this one)
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("cannot be captured")
        return x * 2

    timer = Timer(dev, warmup_ms=2, rep_ms=5)
    rec: dict = {}
    time_variant(rec, Variant("v", "peer", [refuses_capture]), timer)
    assert rec["eager_us"] > 0 and rec.get("graph_us") is None, rec
    assert rec["graph_error"] == "RuntimeError: cannot be captured", rec
    ok: dict = {}
    y = torch.empty_like(x)
    time_variant(ok, Variant("w", "peer", [lambda: torch.mul(x, 2, out=y)], eager=False), timer, graph_only=True)
    assert ok["graph_us"] > 0 and "eager_us" not in ok, ok
