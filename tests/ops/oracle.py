"""What the kernel-family tests share: the comparison of a Triton output with the float64 oracle,
running a call on both backends, and a misaligned copy of a tensor."""

from __future__ import annotations

import pytest
import torch

from kvattn import dense as _dense
from kvattn.formats import FP8_DTYPE, FP8_MAX
from kvattn.testing import relative_error

ON_GPU = torch.cuda.is_available()
GPU_ONLY = pytest.mark.skipif(not ON_GPU, reason="GPU grid; the interpreter tier runs the interp subset")
# Error the kernel may add beyond 2x the reference's own rounding error: its P operand of the
# P.V product is rounded to the query dtype (flash-attention practice).
EXTRA = {torch.float16: 5e-4, torch.bfloat16: 4e-3, FP8_DTYPE: 2e-3}


class _Float64Oracle:
    """:mod:`kvattn.dense`, run on the GPU where the tests have one (still float64: cuBLAS's double
    products are IEEE double arithmetic), results handed back on the CPU. With 16 test workers on a
    16-core host the float64 einsums of the larger cases queued on the CPU for up to a minute a test;
    on the GPU they take milliseconds. Tensors made inside a formulation follow the default device
    set here. A formulation too large for the GPU's free memory runs on the CPU as before."""

    def __getattr__(self, name):
        fn = getattr(_dense, name)
        if not callable(fn) or not ON_GPU:
            return fn

        def run(*args, **kwargs):
            try:
                with torch.device("cuda"):
                    return cpu(fn(*_to(args, "cuda"), **_to(kwargs, "cuda")))
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                return fn(*cpu(args), **cpu(kwargs))

        return run


def _to(x, device):
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_to(t, device) for t in x)
    return x.to(device) if isinstance(x, torch.Tensor) else x


dense = _Float64Oracle()


def cpu(x):
    if isinstance(x, dict):
        return {k: cpu(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(cpu(t) for t in x)
    return x.cpu() if isinstance(x, torch.Tensor) else x


def assert_matches(out: torch.Tensor, ref_out: torch.Tensor, exact: torch.Tensor, stored_scale: float = 1.0):
    """``out`` (Triton) is as close to the float64 ``exact`` as the reference's ``ref_out`` is, up
    to a factor 2 plus the kernel's operand rounding (``EXTRA``), in norm and element-wise."""
    target = exact.cpu().double() / stored_scale
    if out.dtype == FP8_DTYPE:
        target = target.clamp(-FP8_MAX, FP8_MAX)
    got, ref = out.cpu().double(), ref_out.cpu().double()
    assert torch.isfinite(got).all(), f"{int((~torch.isfinite(got)).sum())} non-finite outputs"
    err, ref_err = relative_error(got, target), relative_error(ref, target)
    assert err <= 2 * ref_err + EXTRA[out.dtype], f"relative error {err:.3g} (reference {ref_err:.3g})"
    amax = float(target.abs().max()) if target.numel() else 0.0
    worst, ref_worst = float((got - target).abs().max()), float((ref - target).abs().max())
    assert worst <= 2 * ref_worst + 4 * EXTRA[out.dtype] * amax + 1e-6, (
        f"max abs error {worst:.3g} (reference {ref_worst:.3g}, max |ref| {amax:.3g})"
    )


def run_both(backend_call, monkeypatch):
    """Run ``backend_call(backend)`` on the Triton and then the reference backend."""
    outs = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("KVATTN_BACKEND", backend)
        outs.append(backend_call())
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    return outs


def off_by_one(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its strides, starting one byte past a 4-byte boundary."""
    size = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    buf = torch.empty(size + 1, dtype=t.dtype, device=t.device)
    out = torch.as_strided(buf, t.shape, t.stride(), storage_offset=1)
    out.copy_(t)
    assert out.data_ptr() % 4 != 0
    return out
