"""The two ceilings, measured in every run (``docs/benchmarking.md``, "Ceilings").

- Copy bandwidth: a ~4 GiB device-to-device copy, bytes read + bytes written over the median time.
- Matrix rate: an 8192^3 bf16 matmul on random data after a 500 ms warm-up (clocks settle: a cold
  short measurement reads ~9 % high), and the same in fp8 through ``torch._scaled_mm`` if it runs.

On a CPU the sizes shrink (64 MiB copy, 1024^3 matmul) so the smoke test stays quick; those numbers
are only there to exercise the plumbing.
"""

from __future__ import annotations

import statistics
import time

import torch

from kvattn.benchmarking.timing import Timer


def copy_gbps(timer: Timer, nbytes: int = 4 << 30) -> float:
    """Device-to-device copy of ``nbytes``: bytes read + written over the median time."""
    n = nbytes // 4
    src = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, device=timer.device)
    dst = torch.empty_like(src)
    us = timer.eager([lambda: dst.copy_(src)])
    return 2 * nbytes / (us * 1e-6) / 1e9


def _warm_then_time(fn, device: torch.device, warm_s: float, reps: int) -> float:
    """Median seconds of ``fn`` after running it for ``warm_s`` seconds."""
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        fn()
        if cuda:
            torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _matmul_tflops(device: torch.device, n: int, warm_s: float, fp8: bool) -> float:
    g = torch.Generator(device=device)
    g.manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=g)
    if fp8:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants its second operand
        one = torch.ones((), device=device, dtype=torch.float32)

        def fn():
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:

        def fn():
            return a @ b

    fn()  # fails fast here if the op is unsupported
    seconds = _warm_then_time(fn, device, warm_s, reps=20 if device.type == "cuda" else 3)
    return 2.0 * n**3 / seconds / 1e12


def measure(device: torch.device, timer: Timer) -> dict:
    """Ceilings of this device in this run; a failed measurement is recorded, not raised."""
    cuda = device.type == "cuda"
    copy_bytes = (4 << 30) if cuda else (64 << 20)
    n = 8192 if cuda else 1024
    warm = 0.5 if cuda else 0.1
    out: dict = {"copy_bytes": copy_bytes, "matmul_n": n, "matmul_warmup_s": warm, "errors": {}}
    for key, f in (
        ("copy_gbps", lambda: copy_gbps(timer, copy_bytes)),
        ("matmul_bf16_tflops", lambda: _matmul_tflops(device, n, warm, fp8=False)),
        ("matmul_fp8_tflops", lambda: _matmul_tflops(device, n, warm, fp8=True)),
    ):
        try:
            out[key] = f()
        except Exception as exc:  # noqa: BLE001 - any failure is a recorded missing ceiling
            out[key] = None
            out["errors"][key] = f"{type(exc).__name__}: {exc}"[:500]
        if cuda:
            torch.cuda.empty_cache()
    return out
