"""The ``kvattn`` command (also ``python -m kvattn``).

``kvattn check``    runs each public function on a few shapes and compares every result with an
                    independent float64 formulation (:mod:`kvattn.dense`): a table of errors against
                    their tolerances, times and rates. On a GPU it checks the Triton kernels; on a
                    CPU the plain-PyTorch reference, or with ``--interpret`` the kernels in Triton's
                    interpreter. Exit status 1 if any check fails.
``kvattn info``     versions, the device, the environment switches, what serves each function and
                    which version-gated fast paths are on.
``kvattn bench``    times the five functions beside the attention torch provides (SDPA backends,
                    FlexAttention) on this machine's GPU (:mod:`kvattn.bench`).
``kvattn fuzz``     random legal calls of the five functions against the float64 formulation, in
                    plain, CUDA-graph, determinism and batch-invariant modes; failures shrunk to
                    Python snippets (:mod:`kvattn.fuzz`, docs/fuzzing.md). Exit status 1 on any
                    mismatch or error.

A mistake on the command line (a device this machine lacks, a bad number, a bad switch value) ends
in one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from .runtime import backend as _backend, device as _device, env as _env, versions as _versions
from . import dense
from ._console import (  # noqa: F401  (re-exported: the command's names live in kvattn.cli too)
    FUNCTION_KEYS,
    FUNCTIONS,
    Progress,
    UsageError,
    format_rate,
    format_time,
    function_list,
    positive_int,
    print_grouped,
    print_table,
    writable,
    write_json,
)
from ._version import __version__
from .formats import NVFP4_BLOCK, dequantize_nvfp4_output
from .testing import make_paged_kv, randn, relative_error, seeded

TOL_16BIT = 2e-2  # bf16/fp16 outputs: rounding of the output plus fp32 accumulation order
TOL_NVFP4 = 0.15  # NVFP4 output: e2m1 values keep one mantissa bit


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (no usage dump) and reach :func:`main` as UsageError."""

    def error(self, message):
        raise UsageError(f"{message} (see {self.prog} --help)")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an argument no parser knows is reported by the subcommand it was
        given to (``kvattn check --bogus`` points to ``kvattn check --help``)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(parsed, "command", None)
            sub = self._subcommands().get(command) if command else None
            (sub or self).error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def _subcommands(self) -> dict:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def resolve_device(text: str | None) -> torch.device:
    """``--device``: cuda, cuda:N or cpu; default CUDA when present. Raises UsageError."""
    if text is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {text!r}: not a device name (expected cuda, cuda:N or cpu)") from None
    if device.type not in ("cuda", "cpu"):
        raise UsageError(f"--device {text}: kvattn runs on cuda or cpu, not {device.type}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise UsageError(f"--device {text}: CUDA is not available on this machine ({why}); try --device cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise UsageError(f"--device {text}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())


def check_switches() -> None:
    """Parse every ``KVATTN_*`` switch now, so a bad value is one line and not a traceback later."""
    try:
        for read in (_env.backend_override, _env.debug_checks, _env.call_cache, _env.fast_launch, _env.fused_merge,
                     _env.gluon, _env.gluon_ws, _env.batch_invariant_env):
            read()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return triton.__version__


def describe_device(device: torch.device) -> str:
    if device.type != "cuda":
        visible = "no CUDA device" if not torch.cuda.is_available() else "a CUDA device is present but not chosen"
        return f"cpu ({visible})"
    p = torch.cuda.get_device_properties(device)
    return (f"{device} ({p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
            f"{p.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda})")


# ---------------------------------------------------------------------------------------------
# kvattn check
# ---------------------------------------------------------------------------------------------
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
            return _dense(dense.batch_decode, q, c.kv_cache, c.block_tables, c.seq_lens, **kw)

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
        return _dense(dense.xqa, q, k_pool, v_pool, c.block_tables, lens_u32.to(torch.int32), num_kv_heads=hkv,
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
            return _dense(dense.single_decode, q, k, v, pos_encoding_mode=mode, **extra)[0]

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
        return _dense(dense.mla, q, cache, c_kv.block_tables, c_kv.seq_lens, bmm1_scale=scale)

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
            return _dense(dense.context, q, c.kv_cache, c.block_tables, c.seq_lens, cum_q, bmm1_scale=d ** -0.5,
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


# ---------------------------------------------------------------------------------------------
# kvattn info
# ---------------------------------------------------------------------------------------------
def _debug_meaning() -> str:
    forced = _env.debug_checks()
    if forced is None:
        return "on for CPU tensors, off for CUDA tensors (there the checks would wait for the GPU)"
    return "on (device-value checks; on CUDA tensors they synchronise)" if forced else "off (no device-value checks)"


# (name, what it does now, whether it only acts on compiled GPU launches)
_SWITCHES = (
    ("KVATTN_BACKEND", lambda: _env.backend_override() or "unset: Triton for CUDA tensors, reference for CPU tensors",
     False),
    ("KVATTN_BATCH_INVARIANT", lambda: "on (outputs independent of the batch)" if _env.batch_invariant() else "off",
     False),
    ("KVATTN_DEBUG", _debug_meaning, False),
    ("KVATTN_CALL_CACHE", lambda: "on" if _env.call_cache() else "off (every eager call validated and planned afresh)",
     True),
    ("KVATTN_FAST_LAUNCH", lambda: "on" if _env.fast_launch() else "off", True),
    ("KVATTN_FUSED_MERGE", lambda: "on" if _env.fused_merge() else "off (a second launch merges the splits)", True),
    ("KVATTN_GLUON", lambda: "on" if _versions.gluon_on() else "off (Triton kernels where a Gluon one exists)", True),
    ("KVATTN_GLUON_WS", lambda: "on" if _env.gluon_ws() else "off (MLA's Gluon kernel without warp specialisation)",
     True),
    ("TRITON_INTERPRET", lambda: "on (Triton's interpreter runs the kernels)" if _env.triton_interpret() else "off",
     False),
)

_KERNELS = {
    "batch_decode": "Triton: split-KV paged decode",
    "single_decode": "Triton: split-KV decode over contiguous K/V",
    "mla_decode": "Triton: split-KV latent decode",
    "context": "Triton: causal prefill (pages of 64+ tokens by TMA on Hopper)",
}


def _served_by(op: str, device: torch.device, fast_paths: dict[str, str]) -> str:
    try:
        triton_runs = _backend.use_triton(op, device)
    except RuntimeError as exc:
        return f"error: {exc}"
    if not triton_runs:
        return "reference (plain PyTorch)"
    text = _KERNELS[op]
    if device.type != "cuda":
        return text + ", in Triton's interpreter"
    gluon = _device.is_hopper(device) and _versions.gluon_on() and fast_paths.get("gluon", "").startswith("on")
    if op == "mla_decode" and gluon:
        text += "; Gluon kernel for 16-bit caches with 64+ heads and pages of 64+ tokens"
        if _env.gluon_ws():
            text += (" (warp-specialised; also fewer heads over 16-bit caches, padded to 64 rows, and an fp8 query "
                     "over fp8 caches with 17+ heads)")
    elif op == "context" and gluon:
        text += ("; a warp-specialised Gluon kernel for 16-bit and fp8 caches with pages of 8+ tokens, "
                 "NVFP4 / fp8 caches and pages under 64 tokens staged once a call into the workspace where "
                 "they fit (fp8 / NVFP4 outputs and skip-softmax keep the Triton kernel)")
    return text


def _fast_paths() -> dict[str, str]:
    try:
        from .runtime import versions as _versions
    except ImportError:
        return {}
    fn = getattr(_versions, "fast_paths", None)
    if fn is None:
        return {}
    try:
        return dict(fn())
    except Exception as exc:  # noqa: BLE001 - info reports, it does not fail
        return {"(error)": f"{type(exc).__name__}: {exc}"}


def info(device: torch.device) -> int:
    try:
        import triton

        from .runtime.versions import support

        triton_version = triton.__version__
        if device.type == "cuda":
            triton_line = f"{triton_version} ({support(triton_version)})"
        else:  # (what kvattn verified elsewhere is no fact about this machine)
            triton_line = f"{triton_version} (no GPU here: used only by the interpreter, --interpret / TRITON_INTERPRET=1)"
    except ImportError:
        triton_version = triton_line = "not installed (every function runs the reference)"
    try:
        import numpy

        numpy_version = numpy.__version__
    except ImportError:
        numpy_version = "not installed"
    import platform

    import kvattn

    print(f"kvattn {__version__} ({os.path.dirname(kvattn.__file__)})")
    print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), "
          f"triton {triton_line}, numpy {numpy_version}")
    print(f"device: {describe_device(device)}")
    print("switches:")
    width = max(len(name) for name, _, _ in _SWITCHES)
    for name, meaning, gpu_only in _SWITCHES:
        raw = os.environ.get(name)
        text = meaning()  # (check_switches has refused bad values)
        if gpu_only and device.type != "cuda":
            text = f"{text} (no effect here: it acts on compiled GPU launches)"
        print(f"  {name:<{width}s} {'unset' if raw is None else repr(raw):<10s} {text}")
    paths = _fast_paths() if device.type == "cuda" else {}
    print(f"functions on {device}:")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for short, public, op in FUNCTIONS:
            print(f"  {public:<51s} {_served_by(op, device, paths)}")
    if device.type != "cuda":
        print(f"fast paths: none apply on {device} (fast launch, PTX hints and the Gluon kernels serve compiled "
              "launches on a GPU)")
        return 0
    print(f"fast paths (Triton {triton_version}):" + ("" if paths else " not reported by this kvattn"))
    for name, state in paths.items():
        print(f"  {name:<12s} {state}")
    return 0


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvattn", description="Attention kernels for LLM inference: check, info, bench, fuzz.",
                     epilog="Functions: " + "; ".join(f"{s} = {p}" for s, p, _ in FUNCTIONS))
    parser.add_argument("--version", action="version", version=f"kvattn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="{check,info,bench,fuzz}")

    p = sub.add_parser("check", help="run every function, compare with float64, print a table",
                       description="Run each public function on a few shapes and compare with an independent "
                                   "float64 formulation. Exit status 1 if any result is out of tolerance.")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")
    p.add_argument("--small", action="store_true", help="small shapes even on a GPU")
    p.add_argument("--only", type=function_list, default=FUNCTION_KEYS, metavar="LIST",
                   help=f"comma-separated subset of {','.join(FUNCTION_KEYS)}")
    p.add_argument("--reps", type=positive_int, default=None,
                   help="timed calls per case after the checked one (default 20 on a GPU, 3 on a CPU; with "
                        "--interpret the checked call alone is timed)")
    p.add_argument("--interpret", action="store_true",
                   help="on a CPU: run the Triton kernels in Triton's interpreter (minutes) instead of the reference")
    p.add_argument("--json", metavar="FILE", default=None, help="also write the results as JSON")

    p = sub.add_parser("info", help="versions, device, switches, kernels, fast paths",
                       description="Versions, the device, the environment switches, what serves each function "
                                   "and which version-gated fast paths are on.")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")

    from .bench import add_arguments

    p = sub.add_parser("bench", help="time the five functions beside torch's SDPA and FlexAttention",
                       description="Time the five functions on this machine's GPU beside the attention torch "
                                   "provides (scaled_dot_product_attention backends, FlexAttention).")
    add_arguments(p)

    from .fuzz.command import DESCRIPTION as FUZZ_DESCRIPTION, add_arguments as add_fuzz_arguments

    p = sub.add_parser("fuzz", help="random legal calls against float64, shrunk reproducers",
                       description=FUZZ_DESCRIPTION)
    add_fuzz_arguments(p)
    return parser


def _run(args) -> int:
    check_switches()
    if args.command == "info":
        return info(resolve_device(args.device))
    if args.command == "check":
        device = resolve_device(args.device)
        writable(args.json, "--json")
        if args.interpret and device.type != "cpu":
            raise UsageError("--interpret runs the kernels in Triton's interpreter on the CPU: use it with --device cpu")
        if device.type == "cpu" and not args.interpret and _env.backend_override() == "triton" \
                and not _env.triton_interpret():
            raise UsageError("KVATTN_BACKEND=triton on a CPU needs Triton's interpreter: add --interpret")
        # TRITON_INTERPRET=1 KVATTN_BACKEND=triton on a CPU is --interpret spelled through the
        # environment: the same float16 cases (the interpreter has no bfloat16) and untimed calls.
        interpret = args.interpret or (device.type == "cpu" and _env.backend_override() == "triton"
                                       and _env.triton_interpret())
        big = device.type == "cuda" and not args.small
        reps = args.reps or (20 if device.type == "cuda" else 0 if interpret else 3)
        if interpret:
            check_interpreter_numpy()
            with _interpreter():
                return check(device, big, reps, interpret=True, json_path=args.json, only=args.only)
        return check(device, big, reps, json_path=args.json, only=args.only)
    if args.command == "bench":
        from . import bench

        device = resolve_device(args.device)
        writable(args.json, "--json")
        writable(args.plot, "--plot")
        if device.type == "cpu" and _env.backend_override() == "triton":
            raise UsageError("KVATTN_BACKEND=triton: kvattn bench times compiled kernels on a GPU; on a CPU it times "
                             "the reference (unset KVATTN_BACKEND)")
        return bench.main(args, device)
    if args.command == "fuzz":
        from .fuzz import command

        return command.main(args, resolve_device(args.device))
    raise AssertionError(args.command)


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 0
        return _run(args)
    except UsageError as exc:
        print(f"kvattn: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvattn: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
