"""``kvattn check``: each public function run on a few shapes and compared with the independent
float64 formulation (:mod:`kvattn.dense`); its cases, their timing, and ``--interpret`` (Triton's
interpreter on the CPU). Registered and dispatched by :mod:`kvattn.cli`."""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from .runtime import backend as _backend, env as _env
from . import dense
from ._console import FUNCTION_KEYS, Progress, UsageError, format_rate, format_time, print_grouped, write_json
from ._version import __version__
from .cli_info import describe_device
from .formats import NVFP4_BLOCK, dequantize_nvfp4_output
from .testing import make_paged_kv, randn, relative_error, seeded


TOL_16BIT = 2e-2  # bf16/fp16 outputs: rounding of the output plus fp32 accumulation order
TOL_NVFP4 = 0.15  # NVFP4 output: e2m1 values keep one mantissa bit


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return triton.__version__


@dataclass
class Case:
    function: str  # short name, FUNCTIONS[i][0]
    variant: str  # what this case varies: formats, layout, features
    shape: str  # the problem's size in words
    op: str  # backend op name (_backend)
    run: Callable[[], object]  # the kvattn call
    expected: Callable[[], torch.Tensor]  # float64 dense result
    actual: Callable[[object], torch.Tensor]  # float view of run()'s output
    tolerance: float
    work: float  # bytes moved (unit "B") or FLOPs (unit "FLOP") of one call
    unit: str
    skip: str = ""  # why this case cannot run in this mode (shown, counted as skipped)


def _row_bytes(kv_format: str, head_dim: int) -> float:
    """Cache bytes of one token's vector for one head (NVFP4: codes and their e4m3 block scales)."""
    return head_dim * {"float16": 2, "bfloat16": 2, "fp8": 1, "nvfp4": 0.5 + 1 / NVFP4_BLOCK}[kv_format]


def _lens_text(lens: list[int]) -> str:
    if len(set(lens)) == 1:
        return f"{len(lens)} x {lens[0]} tokens"
    return f"{len(lens)} requests of {min(lens)}-{max(lens)} tokens"


def _half_name(dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def _decode_cases(device, big: bool, half) -> list[Case]:
    from .decode import xqa_batch_decode_with_kv_cache

    cases = []
    hq, hkv, d = 32, 8, 128
    lens = [4096] * 16 if big else [1, 70, 300, 513]
    ws = torch.zeros(64 << 20 if big else 1 << 20, dtype=torch.uint8, device=device)
    half_fmt = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[half]
    for i, (fmt, layout, page, q_len) in enumerate((
        (half_fmt, "NHD", 16, 1), (half_fmt, "HND", 64, 1), ("fp8", "NHD", 16, 1), ("nvfp4", "HND", 32, 1),
        (half_fmt, "NHD", 16, 4),
    )):
        # (a request holds at least its q_len new tokens: the checks refuse shorter ones)
        c = make_paged_kv([max(n, q_len) for n in lens], num_kv_heads=hkv, head_dim=d, page_size=page, kv_format=fmt,
                          layout=layout, device=device, seed=i)
        q = randn(len(lens) * q_len, hq, d, dtype=half, device=device, generator=seeded(99))
        out = torch.empty_like(q)
        kw = dict(bmm1_scale=d ** -0.5, bmm2_scale=1.0, kv_layout=layout, q_len_per_req=q_len,
                  kv_cache_sf=c.kv_cache_sf)

        def run(c=c, q=q, kw=kw, out=out):
            return xqa_batch_decode_with_kv_cache(q, c.kv_cache, ws, c.block_tables, c.seq_lens, c.max_seq_len,
                                                  out=out, **kw)

        def expected(c=c, q=q, kw=kw):
            return dense.on_cpu(dense.batch_decode, q, c.kv_cache, c.block_tables, c.seq_lens, **kw)

        kv_name = {"fp8": "fp8-e4m3", "nvfp4": "NVFP4"}.get(fmt, _half_name(half))
        variant = f"{kv_name} KV, {layout} pages of {page}"
        if q_len > 1:
            variant += f", {q_len} query tokens a request (speculative)"
        work = sum(lens) * hkv * _row_bytes(fmt, d) * 2 + 2 * q.numel() * q.element_size()
        shape = f"{_lens_text(lens)}, {hq}/{hkv} heads, D {d}"
        cases.append(Case("batch decode", variant, shape, "batch_decode", run, expected, lambda o: o.float(),
                          TOL_16BIT, work, "B"))

    return cases


def _xqa_cases(device, big: bool, half) -> list[Case]:
    """xqa over the seed's flat pools of head vectors (row ``(page * page_size + slot) * Hkv + head``)."""
    from .xqa import xqa

    hq, hkv, d, page = 32, 8, 128, 16
    lens = [4096] * 16 if big else [1, 70, 300, 513]
    ws = torch.zeros(64 << 20 if big else 1 << 20, dtype=torch.uint8, device=device)
    c = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=half, form="tuple", device=device,
                      seed=7)
    k_pool, v_pool = (x.contiguous().view(-1, d) for x in c.kv_cache)
    q = randn(len(lens), 1, hq, d, dtype=half, device=device, generator=seeded(98))
    out = torch.empty_like(q)
    lens_u32 = c.seq_lens.view(-1, 1).to(torch.uint32)
    sem = torch.zeros(64, dtype=torch.uint32, device=device)

    def run_xqa():
        xqa(q, k_pool, v_pool, c.block_tables, lens_u32, out, ws, sem, num_kv_heads=hkv, page_size=page)
        return out

    def expected_xqa():
        return dense.on_cpu(dense.xqa, q, k_pool, v_pool, c.block_tables, lens_u32.to(torch.int32), num_kv_heads=hkv,
                      page_size=page)

    work = sum(lens) * hkv * d * q.element_size() * 2 + 2 * q.numel() * q.element_size()
    return [Case("xqa", f"{_half_name(half)} KV, flat pools of head vectors, pages of {page}",
                 f"{_lens_text(lens)}, {hq}/{hkv} heads, D {d}", "batch_decode", run_xqa, expected_xqa,
                 lambda o: o.float(), TOL_16BIT, work, "B")]


def _single_cases(device, big: bool, half) -> list[Case]:
    from .decode import single_decode_with_kv_cache

    cases = []
    length = 32768 if big else 777
    h, d = 32, 128
    g = seeded(7)
    q = randn(h, d, dtype=half, device=device, generator=g)
    k = randn(length, h, d, dtype=half, device=device, generator=g)
    v = randn(length, h, d, dtype=half, device=device, generator=g)
    for mode, extra, label in (("NONE", {}, "no position encoding"), ("ROPE_LLAMA", {}, "fused RoPE (Llama)"),
                               ("ALIBI", {"logits_soft_cap": 30.0}, "ALiBi + soft cap 30")):
        def run(mode=mode, extra=extra):
            return single_decode_with_kv_cache(q, k, v, pos_encoding_mode=mode, **extra)

        def expected(mode=mode, extra=extra):
            return dense.on_cpu(dense.single_decode, q, k, v, pos_encoding_mode=mode, **extra)[0]

        cases.append(Case("single decode", f"{_half_name(half)} K/V, {label}", f"{length} tokens, {h} heads, D {d}",
                          "single_decode", run, expected, lambda o: o.float(), TOL_16BIT,
                          2 * length * h * d * q.element_size(), "B"))
    return cases


def _mla_cases(device, big: bool, half, interpret: bool) -> list[Case]:
    from .mla import xqa_batch_decode_with_kv_cache_mla

    lens = [4096] * 8 if big else [1, 100, 257]
    hq = 128 if big else 16
    variant, shape = "bf16 latent cache [ckv 512 | kpe 64], pages of 64", f"{_lens_text(lens)}, {hq} heads"
    if interpret:  # the public function takes bf16 / fp8, and the interpreter has no bf16 arithmetic
        return [Case("MLA decode", variant, shape, "mla_decode", None, None, None, TOL_16BIT, 0.0, "FLOP",
                     skip="bf16 only; Triton's interpreter has no bf16 (the tests run this kernel in fp16)")]
    c_kv = make_paged_kv(lens, num_kv_heads=1, head_dim=576, page_size=64, dtype=torch.bfloat16,
                         device=device, seed=3, form="shared")
    cache = c_kv.kv_cache[:, 0, :, 0]  # [P, page, 576]
    q = randn(len(lens), 1, hq, 576, dtype=torch.bfloat16, device=device, generator=seeded(5))
    ws = torch.zeros(64 << 20 if big else 1 << 20, dtype=torch.uint8, device=device)
    scale = 192 ** -0.5

    def run():
        return xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, c_kv.block_tables, c_kv.seq_lens,
                                                  c_kv.max_seq_len, bmm1_scale=scale)

    def expected():
        return dense.on_cpu(dense.mla, q, cache, c_kv.block_tables, c_kv.seq_lens, bmm1_scale=scale)

    flops = 2 * hq * sum(lens) * (576 + 512)
    return [Case("MLA decode", variant, shape, "mla_decode", run, expected, lambda o: o.float(), TOL_16BIT,
                 flops, "FLOP")]


def _context_cases(device, big: bool, half) -> list[Case]:
    from .prefill import trtllm_batch_context_with_kv_cache

    cases = []
    hq, hkv, d = 32, 8, 128
    kv_lens, q_lens = ([2048, 2048], [2048, 1024]) if big else ([64, 200], [64, 37])
    c = make_paged_kv(kv_lens, num_kv_heads=hkv, head_dim=d, page_size=64, dtype=half,
                      layout="HND", device=device, seed=11)
    q = randn(sum(q_lens), hq, d, dtype=half, device=device, generator=seeded(12))
    cum_q = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
    cum_kv = torch.tensor([0, kv_lens[0], sum(kv_lens)], dtype=torch.int32, device=device)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    pairs = sum(lq * (lk - lq) + lq * (lq + 1) // 2 for lq, lk in zip(q_lens, kv_lens))
    shape = (f"2 requests: {q_lens[0]} + {q_lens[1]} new tokens over {kv_lens[0]} + {kv_lens[1]}, "
             f"{hq}/{hkv} heads, D {d}")
    for out_dtype in (None, "nvfp4"):
        def run(out_dtype=out_dtype):
            return trtllm_batch_context_with_kv_cache(
                q, c.kv_cache, ws, c.block_tables, c.seq_lens, max(q_lens), max(kv_lens), d ** -0.5, 1.0,
                len(kv_lens), cum_q, cum_kv, out_dtype=out_dtype)

        def expected():
            return dense.on_cpu(dense.context, q, c.kv_cache, c.block_tables, c.seq_lens, cum_q, bmm1_scale=d ** -0.5,
                          bmm2_scale=1.0, kv_layout="HND")

        actual = (lambda o: o.float()) if out_dtype is None else dequantize_nvfp4_output
        out_name = "NVFP4 output" if out_dtype else f"{_half_name(half)} output"
        cases.append(Case("prefill", f"{_half_name(half)} KV, HND pages of 64, causal, {out_name}", shape,
                          "context", run, expected, actual, TOL_NVFP4 if out_dtype else TOL_16BIT,
                          4 * d * hq * pairs, "FLOP"))
    return cases


def _time(fn, device: torch.device, reps: int) -> float:
    """Median seconds of ``reps`` calls (the caller has warmed ``fn`` up)."""
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


def check_interpreter_numpy() -> None:
    """Triton 3.6's interpreter fails on numpy >= 2.4 (it converts 1-element arrays to scalars, which
    numpy 2.4 refuses); 3.7 works with it. Say so up front instead of failing every case."""
    from .runtime.versions import parse

    # Versions from the installed metadata: importing triton now would define its own jit functions
    # compiled-mode, before the interpreter is switched on.
    triton_version, numpy_version = _installed("triton"), _installed("numpy")
    if triton_version and numpy_version and parse(triton_version) < (3, 7, 0) and parse(numpy_version) >= (2, 4, 0):
        raise UsageError(f"--interpret: Triton {triton_version}'s interpreter needs numpy < 2.4, this is numpy "
                         f"{numpy_version} (pip install \"numpy<2.4\")")


def _installed(name: str) -> str | None:
    module = sys.modules.get(name)
    if module is not None:
        return module.__version__
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@contextmanager
def _interpreter():
    """Triton's interpreter for this command: kvattn's kernels on CPU tensors. It must be on before
    any jit function is defined (Triton's own included, when triton is imported), so it cannot be
    switched on in a process that has already imported Triton without it."""
    if not _env.triton_interpret() and ("triton" in sys.modules or "kvattn.ops" in sys.modules):
        raise UsageError("--interpret: this process has already imported Triton without its interpreter; "
                         "run the command in a fresh process")
    with _env.switches(TRITON_INTERPRET="1", KVATTN_BACKEND="triton"):
        yield


def _mode_lines(device: torch.device, interpret: bool, reps: int) -> list[str]:
    if device.type == "cuda":
        return [
            "mode:   kvattn's Triton kernels (what CUDA tensors run) against an independent float64 formulation "
            "(on the CPU)",
            f"times:  median of {reps} eager calls after one warm-up, CUDA events, L2 not flushed: a sanity check "
            "(`kvattn bench` compares with torch's attention)",
        ]
    if interpret:
        return [
            "mode:   kvattn's Triton kernels run by Triton's interpreter on the CPU, in fp16 (the interpreter has "
            "no bf16), against an independent float64 formulation",
            ("times:  the checked call itself, interpreted" if not reps else f"times:  median of {reps} interpreted "
             "call(s)") + ": nothing to do with GPU speed, so no rates",
        ]
    return [
        "mode:   the plain-PyTorch reference (what CPU tensors run) against an independent float64 formulation;",
        "        the Triton kernels are not checked on a CPU unless asked: --interpret runs them in Triton's "
        "interpreter (minutes)",
        f"times:  median of {reps} host-timed calls of the reference on this CPU (not a measure of the GPU kernels)",
    ]


def check(device: torch.device, big: bool, reps: int, interpret: bool = False, json_path: str | None = None,
          only=FUNCTION_KEYS) -> int:
    """Print the correctness table; 0 when every case that ran is within its tolerance.

    ``reps`` timed calls a case after the checked one; 0 (the interpreter's default): the time of
    the checked call itself."""
    half = torch.float16 if interpret else torch.bfloat16
    mode = "Triton interpreter" if interpret else ("Triton kernels" if device.type == "cuda" else "reference")
    print(f"kvattn {__version__} check, torch {torch.__version__}, triton {_triton_version()}")
    print(f"device: {describe_device(device)}")
    for line in _mode_lines(device, interpret, reps):
        print(line)
    print()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a reference fallback shows in the backend column
        builders = {"batch_decode": _decode_cases, "xqa": _xqa_cases, "single_decode": _single_cases,
                    "mla": lambda *a: _mla_cases(*a, interpret), "prefill": _context_cases}
        cases = [c for key in only for c in builders[key](device, big, half)]
        rows, records, notes = [], [], []
        failed = skipped = 0
        progress = Progress(len(cases), "check")
        for case in cases:
            progress.step(f"{case.function}: {case.variant}")
            title = f"{case.function}: {case.shape}"
            rec = {"function": case.function, "variant": case.variant, "shape": case.shape,
                   "tolerance": case.tolerance}
            if case.skip:
                skipped += 1
                rec.update(result="skipped", note=case.skip)
                rows.append((title, case.variant, "-", "skipped", "-", f"{case.tolerance:.2g}", "-", "-"))
                notes.append(f"{case.function} ({case.variant}): skipped: {case.skip}")
                records.append(rec)
                continue
            backend = "triton" if _backend.use_triton(case.op, device) else "reference"
            try:
                t0 = time.perf_counter()
                result = case.run()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds = time.perf_counter() - t0
                err = relative_error(case.actual(result).double().cpu(), case.expected().double())
                ok = err <= case.tolerance
                if reps:  # the checked call was the warm-up (compilation included)
                    seconds = _time(case.run, device, reps)
                rate = "-" if interpret else format_rate(case.work / seconds, case.unit)
                rows.append((title, case.variant, backend, "ok" if ok else "FAIL", f"{err:.1e}",
                             f"{case.tolerance:.2g}", format_time(seconds), rate))
                rec.update(backend=backend, result="ok" if ok else "FAIL", rel_err=err, seconds=seconds)
            except Exception as exc:  # report and go on: one broken case must not hide the others
                ok = False
                message = (str(exc).strip().splitlines() or [""])[0]
                rows.append((title, case.variant, backend, "ERROR", "-", f"{case.tolerance:.2g}", "-", "-"))
                notes.append(f"{case.function} ({case.variant}): {type(exc).__name__}: {message}")
                rec.update(backend=backend, result="ERROR", error=f"{type(exc).__name__}: {message}")
            records.append(rec)
            failed += not ok
        progress.done()
    print_grouped(rows, ("case", "backend", "result", "rel err", "tol", "time", "rate"))
    print()
    for note in notes:
        print(note)
    print(f"rel err = ||out - exact|| / ||exact||; tol = the most a case may have: {TOL_16BIT:.2g} for 16-bit "
          f"outputs, {TOL_NVFP4:.2g} for NVFP4 outputs (4-bit values, one mantissa bit)")
    if json_path:
        write_json(json_path, {"command": "check", "kvattn": __version__, "device": describe_device(device),
                                "mode": mode, "cases": records})
    passed = len(records) - failed - skipped
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 1 if failed else 0
