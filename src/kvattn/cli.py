"""The ``kvattn`` command.

``kvattn check``  runs every public function on representative shapes on the machine's default
                  device (CUDA if present, else the CPU), compares each result with the independent
                  float64 dense formulation (:mod:`kvattn.dense`) and prints a table of correctness,
                  time and achieved GB/s or TFLOP/s. Exit status 1 if any check fails.
``kvattn info``   device, backend per op, versions.

Performance claims come from ``benchmarks/run.py`` on a GPU, not from this command.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from . import _backend, _device, _env, dense
from ._formats_table import BY_NAME
from .formats import dequantize_nvfp4_output
from .testing import make_paged_kv, randn, relative_error, seeded


def _cpu(x):
    """The dense formulation runs in float64 on the CPU: move tensors (and tuples of them) there."""
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (tuple, list)):
        return type(x)(_cpu(y) for y in x)
    return x


def _dense(fn, *args, **kwargs):
    return fn(*_cpu(args), **{k: _cpu(v) for k, v in kwargs.items()})


@dataclass
class Case:
    name: str
    op: str  # backend op name
    run: Callable[[], object]  # the kvattn call
    expected: Callable[[], torch.Tensor]  # float64 dense result
    actual: Callable[[object], torch.Tensor]  # float view of run()'s output
    tolerance: float
    work: float  # bytes (metric "GB/s") or flops ("TFLOP/s")
    metric: str


def _time(fn, device: torch.device, reps: int) -> float:
    """Median seconds of ``reps`` calls after one warm-up."""
    fn()
    samples = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def _decode_cases(device, big: bool) -> list[Case]:
    cases = []
    hq, hkv, d = 32, 8, 128
    lens = [4096] * 16 if big else [1, 70, 300, 513]
    ws = torch.zeros(64 << 20 if big else 1 << 20, dtype=torch.uint8, device=device)
    for fmt, layout, page, q_len in (("bfloat16", "NHD", 16, 1), ("bfloat16", "HND", 64, 1),
                                     ("fp8", "NHD", 16, 1), ("nvfp4", "HND", 32, 1), ("bfloat16", "NHD", 16, 4)):
        c = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, kv_format=fmt, layout=layout,
                          device=device, seed=len(cases))
        q = randn(len(lens) * q_len, hq, d, dtype=torch.bfloat16, device=device, generator=seeded(99))
        out = torch.empty_like(q)
        scale = d ** -0.5
        kw = dict(bmm1_scale=scale, bmm2_scale=1.0, kv_layout=layout, q_len_per_req=q_len,
                  kv_cache_sf=c.kv_cache_sf, out=out)

        def run(c=c, q=q, kw=kw):
            from .decode import xqa_batch_decode_with_kv_cache

            return xqa_batch_decode_with_kv_cache(q, c.kv_cache, ws, c.block_tables, c.seq_lens, c.max_seq_len, **kw)

        def expected(c=c, q=q, kw=kw):
            kw = {k: v for k, v in kw.items() if k != "out"}
            return _dense(dense.batch_decode, q, c.kv_cache, c.block_tables, c.seq_lens, **kw)

        work = sum(lens) * hkv * BY_NAME[fmt].row_bytes(d) * 2 + 2 * q.numel() * 2
        name = f"batch_decode {fmt} {layout} page{page} q_len{q_len} B{len(lens)} L<={max(lens)}"
        cases.append(Case(name, "batch_decode", run, expected, lambda o: o.float(), 2e-2, work, "GB/s"))
    return cases


def _single_cases(device, big: bool) -> list[Case]:
    cases = []
    length = 32768 if big else 777
    h, d = 32, 128
    g = seeded(7)
    q = randn(h, d, dtype=torch.float16, device=device, generator=g)
    k = randn(length, h, d, dtype=torch.float16, device=device, generator=g)
    v = randn(length, h, d, dtype=torch.float16, device=device, generator=g)
    for mode, extra in (("NONE", {}), ("ROPE_LLAMA", {}), ("ALIBI", {"logits_soft_cap": 30.0})):
        def run(mode=mode, extra=extra):
            from .decode import single_decode_with_kv_cache

            return single_decode_with_kv_cache(q, k, v, pos_encoding_mode=mode, **extra)

        def expected(mode=mode, extra=extra):
            return _dense(dense.single_decode, q, k, v, pos_encoding_mode=mode, **extra)[0]

        work = 2 * length * h * d * 2
        cases.append(Case(f"single_decode {mode} H{h} L{length}", "single_decode", run, expected,
                          lambda o: o.float(), 2e-2, work, "GB/s"))
    return cases


def _mla_cases(device, big: bool) -> list[Case]:
    lens = [4096] * 8 if big else [1, 100, 257]
    hq = 128 if big else 16
    c_kv = make_paged_kv(lens, num_kv_heads=1, head_dim=576, page_size=64, dtype=torch.bfloat16,
                         device=device, seed=3, form="shared")
    cache = c_kv.kv_cache[:, 0, :, 0]  # [P, page, 576]
    q = randn(len(lens), 1, hq, 576, dtype=torch.bfloat16, device=device, generator=seeded(5))
    ws = torch.zeros(64 << 20 if big else 1 << 20, dtype=torch.uint8, device=device)
    scale = 192 ** -0.5

    def run():
        from .mla import xqa_batch_decode_with_kv_cache_mla

        return xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, c_kv.block_tables, c_kv.seq_lens,
                                                  c_kv.max_seq_len, bmm1_scale=scale)

    def expected():
        return _dense(dense.mla, q, cache, c_kv.block_tables, c_kv.seq_lens, bmm1_scale=scale)

    flops = 2 * hq * sum(lens) * (576 + 512)
    return [Case(f"mla_decode bf16 Hq{hq} B{len(lens)} L<={max(lens)}", "mla_decode", run, expected,
                 lambda o: o.float(), 2e-2, flops, "TFLOP/s")]


def _context_cases(device, big: bool) -> list[Case]:
    cases = []
    hq, hkv, d = 32, 8, 128
    kv_lens, q_lens = ([2048, 2048], [2048, 1024]) if big else ([64, 200], [64, 37])
    c = make_paged_kv(kv_lens, num_kv_heads=hkv, head_dim=d, page_size=64, dtype=torch.bfloat16,
                      layout="HND", device=device, seed=11)
    q = randn(sum(q_lens), hq, d, dtype=torch.bfloat16, device=device, generator=seeded(12))
    cum_q = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
    cum_kv = torch.tensor([0, kv_lens[0], sum(kv_lens)], dtype=torch.int32, device=device)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    pairs = sum(lq * (lk - lq) + lq * (lq + 1) // 2 for lq, lk in zip(q_lens, kv_lens))
    for out_dtype in (None, "nvfp4"):
        def run(out_dtype=out_dtype):
            from .prefill import trtllm_batch_context_with_kv_cache

            return trtllm_batch_context_with_kv_cache(
                q, c.kv_cache, ws, c.block_tables, c.seq_lens, max(q_lens), max(kv_lens), d ** -0.5, 1.0,
                len(kv_lens), cum_q, cum_kv, out_dtype=out_dtype)

        def expected():
            return _dense(dense.context, q, c.kv_cache, c.block_tables, c.seq_lens, cum_q, bmm1_scale=d ** -0.5,
                          bmm2_scale=1.0, kv_layout="HND")

        actual = (lambda o: o.float()) if out_dtype is None else (lambda o: dequantize_nvfp4_output(o))
        tol = 2e-2 if out_dtype is None else 0.15  # NVFP4 keeps ~3 bits of mantissa
        cases.append(Case(f"context bf16 HND page64 out={out_dtype or 'bf16'} q{q_lens} kv{kv_lens}", "context",
                          run, expected, actual, tol, 4 * d * hq * pairs, "TFLOP/s"))
    return cases


def check(device: torch.device, big: bool, reps: int) -> int:
    cases = _decode_cases(device, big) + _single_cases(device, big) + _mla_cases(device, big) + _context_cases(device, big)
    rows, failed = [], 0
    for case in cases:
        backend = "triton" if _backend.use_triton(case.op, device) else "reference"
        try:
            result = case.run()
            err = relative_error(case.actual(result).double().cpu(), case.expected().double())
            ok = err <= case.tolerance
            seconds = _time(case.run, device, reps)
            rate = case.work / seconds / (1e9 if case.metric == "GB/s" else 1e12)
            rows.append((case.name, backend, "ok" if ok else "FAIL", f"{err:.2e}", f"{seconds * 1e3:.3f}",
                         f"{rate:.2f} {case.metric}"))
        except Exception as exc:  # report and go on: one broken case must not hide the others
            ok = False
            rows.append((case.name, backend, "ERROR", type(exc).__name__, "-", str(exc)[:60]))
        failed += not ok
    header = ("case", "backend", "result", "rel err", "ms", "rate")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


def info(device: torch.device) -> int:
    import triton

    print(f"kvattn device: {device}" + (f" ({torch.cuda.get_device_name(device)}, {_device.sm_count(device)} SMs)"
                                        if device.type == "cuda" else ""))
    print(f"torch {torch.__version__}, triton {triton.__version__}, interpreter={_env.triton_interpret()}, "
          f"KVATTN_BACKEND={_env.backend_override()}, KVATTN_DEBUG={_env.debug_checks()}")
    for op in ("batch_decode", "single_decode", "mla_decode", "context"):
        print(f"  {op:14s} {'triton' if _backend.use_triton(op, device) else 'reference'}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kvattn", description=__doc__.split("\n\n")[1] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="run every function, compare with float64, print a table")
    p_check.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p_check.add_argument("--small", action="store_true", help="small shapes even on a GPU")
    p_check.add_argument("--reps", type=int, default=None, help="timed repetitions per case")
    p_info = sub.add_parser("info", help="device, backends and versions")
    p_info.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.command == "info":
        return info(device)
    big = device.type == "cuda" and not args.small
    import warnings

    warnings.simplefilter("ignore")  # the reference-fallback notice is shown in the table's backend column
    return check(device, big, args.reps or (20 if device.type == "cuda" else 3))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
