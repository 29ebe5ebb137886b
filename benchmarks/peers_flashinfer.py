"""FlashInfer peers: FlashInfer's own kernels on kvattn's inputs, in the same run.

kvattn keeps FlashInfer's signatures, so the peers read the very tensors kvattn's call reads (the
same pools, pages, page tables, lengths and query); where a FlashInfer entry point wants another
form of the page table (a CSR list of pages, ``[B + 1]`` offsets and the last page's fill) or a
draft mask, it is built here once, outside the timed call, as an engine builds it once per step.
Planning (``plan()``, which also JIT-compiles the kernel on first use) happens before timing; the
timed call is ``run()`` alone, eager and as a CUDA-graph replay like every peer.

Kernels (``kernels`` says which run on a shape; ``fi-`` names in the results):

- ``fi-fa2-tc``: ``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True, backend="fa2")``,
  bf16 caches, 1-8 query tokens a request (speculative rows causal among the drafts);
- ``fi-fa2``: the same wrapper on CUDA cores (``use_tensor_cores=False``), one query token,
  bf16 and fp8 caches (grid suites only);
- ``fi-xqa``: ``decode.xqa_batch_decode_with_kv_cache`` (the XQA kernel of ``xqa.xqa``), bf16 and
  fp8 caches, pages of 16-128, speculative rows with a causal draft mask; in the sweep only on fp8
  caches (its best case), as XQA compiles one module per page size, head dim, group and q_len;
- ``fi-single``: ``single_decode_with_kv_cache`` (CUDA cores), RoPE in the kernel where kvattn's
  row has it;
- ``fi-fa3``: ``BatchPrefillWithPagedKVCacheWrapper(backend="fa3")``, causal aligned to the last
  key, bf16 query and cache;
- ``fi-fa3-mla``: ``BatchMLAPagedAttentionWrapper(backend="fa3")`` on the packed 576-wide latent
  pool (bf16 and fp8 caches; the kernel takes a bf16 query, so an fp8 row's query is given in bf16).

The plans are made for the call's exact lengths (not CUDA-graph mode's padded plan): FlashInfer at
its best on the row. No NVFP4 peer: on SM90 FlashInfer has no NVFP4 KV decode kernel (XQA's is for
SM12x). Each FlashInfer kernel variant is compiled on first use (10-90 s); :func:`prebuild`
compiles every variant a run needs at its start, in parallel, each in the build directory its
first use runs ninja in, and :func:`variant_keys` lists them: the modules :func:`modules` derives
from :func:`fi_call`, the arguments the peers pass FlashInfer.

``import flashinfer`` failing (the usual case off the GPU machine: the package is carried there,
``.peers/flashinfer/activate.sh``) makes every peer ``not available`` with the reason; nothing in
the package or the tests imports flashinfer. A peer whose output is far from kvattn's
(:data:`CHECK_MAX`) is marked and never counted as FlashInfer's best.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import torch

from kvattn.benchmarking.availability import NotAvailable
from kvattn.benchmarking.measure import Variant

from .problems import MLA_SCALE, AttnSpec, Problem
from .shapes import Shape

FAMILY = "flashinfer"
# A peer further than this from kvattn's output (relative Frobenius error) computes something else:
# a mis-set peer. bf16 rows land near 2e-3, XQA's fp8 arithmetic near 4e-2.
CHECK_MAX = 0.1
WORKSPACE_MIB = 256
XQA_SEMAPHORE_BYTES = 8 << 20  # XQA keeps its semaphores in the workspace's first 8 MiB
XQA_PAGES = (16, 32, 64, 128)
XQA_MAX_HEAD_DIM = 256
POS_ENCODING = {"NONE": 0, "ROPE_LLAMA": 1}
MLA_CKV_DIM, MLA_KPE_DIM = 512, 64  # the packed latent pool's compressed-KV and RoPE parts
# A peer's set-up plus first call above this many seconds compiled a module (a prebuilt one loads
# in well under a second; nvcc takes 10-90 s).
COMPILE_HINT_S = 2.0

_import_error: str | None = None
_workspaces: dict[tuple[str, str], torch.Tensor] = {}


def load():
    """The ``flashinfer`` module, or :class:`NotAvailable` with the import's error."""
    global _import_error
    if _import_error is not None:
        raise NotAvailable(_import_error)
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - any failure to import means: no FlashInfer peer here
        _import_error = f"flashinfer not importable: {type(exc).__name__}: {str(exc).strip()[:300]}"
        raise NotAvailable(_import_error) from exc
    return flashinfer


def reset_import_state() -> None:
    """Forget a failed import (tests; a run imports once)."""
    global _import_error
    _import_error = None


# ----------------------------------------------------------------------------------------------
# Conversions of kvattn's inputs to FlashInfer's forms (pure torch: checked on CPU tensors)
# ----------------------------------------------------------------------------------------------


def csr_pages(tables: torch.Tensor, lens: list[int], page_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kvattn's page table as FlashInfer's CSR page list.

    ``tables`` int32 ``[B, W]`` (request ``b``'s logical page ``j`` is physical page
    ``tables[b, j]``), ``lens[b]`` its tokens. Returns int32 ``indptr [B + 1]`` (request ``b``'s
    pages are ``indices[indptr[b]:indptr[b + 1]]``), ``indices [sum of pages]`` and
    ``last_page_len [B]`` (tokens on the last page: 1..page_size, 0 for an empty request).
    """
    if tables.dim() != 2 or tables.shape[0] != len(lens):
        raise ValueError(f"tables: expected [B, W] with B = len(lens) = {len(lens)}; got {tuple(tables.shape)}")
    dev = tables.device
    n = torch.tensor(lens, dtype=torch.int64)
    need = (n + page_size - 1) // page_size
    if need.numel() and int(need.max()) > tables.shape[1]:
        raise ValueError(f"tables: {tables.shape[1]} columns cannot hold {int(need.max())} pages")
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(need, 0)
    used = torch.arange(tables.shape[1])[None, :] < need[:, None]
    indices = tables[used.to(dev)].to(torch.int32)  # row-major: request by request, pages in order
    last = torch.where(need > 0, n - (need - 1) * page_size, torch.zeros_like(n))
    return indptr.to(torch.int32).to(dev), indices, last.to(torch.int32).to(dev)


def xqa_causal_mask(batch: int, q_len: int) -> torch.Tensor:
    """XQA's draft mask for ``q_len`` query tokens a request, causal among the drafts.

    int16 ``[batch, q_len, W]``, ``W = ceil(q_len / 32) * 2`` 16-bit words a row (view it as
    ``torch.uint16`` for the kernel): bit ``j`` of row ``r`` (word ``j // 16``, bit ``j % 16``) is
    set when draft ``r`` sees draft ``j``, i.e. ``j <= r``; the cached keys before the drafts are
    always seen. This is kvattn's rule: row ``r`` sits at position ``L - q_len + r``.
    """
    if q_len < 1:
        raise ValueError(f"q_len: expected >= 1, got {q_len}")
    words = (q_len + 31) // 32 * 2
    r = torch.arange(q_len)[:, None, None]
    bit = torch.arange(words)[None, :, None] * 16 + torch.arange(16)[None, None, :]  # [1, W, 16]
    on = (bit <= r).to(torch.int32)  # [q_len, W, 16]
    value = (on << torch.arange(16, dtype=torch.int32)).sum(-1)  # 0..65535 per word
    value = torch.where(value >= 32768, value - 65536, value).to(torch.int16)
    return value.unsqueeze(0).expand(batch, q_len, words).contiguous()


def mask_bits(mask: torch.Tensor, q_len: int) -> torch.Tensor:
    """bool ``[..., q_len, q_len]``: which drafts each row of an :func:`xqa_causal_mask` sees."""
    words = mask.to(torch.int32) & 0xFFFF
    bits = (words[..., :, None] >> torch.arange(16, dtype=torch.int32)) & 1  # [..., q, W, 16]
    return bits.flatten(-2)[..., :q_len].bool()


def decode_query(spec: AttnSpec) -> torch.Tensor:
    """kvattn's decode / prefill query ``[B * q_len, Hq, D]`` (the tensor its call takes)."""
    return spec.native["q"]


# ----------------------------------------------------------------------------------------------
# Which kernels run on a shape, and the compiled variants they need
# ----------------------------------------------------------------------------------------------


def kernels(shape: Shape) -> tuple[list[tuple[str, tuple]], str]:
    """``([(peer name, its variant in short), ...], note)``: FlashInfer's kernels for this shape;
    the note says why a shape has none (or fewer than usual). The modules each one loads (what the
    prebuild compiles) are :func:`modules` of :func:`fi_call`."""
    kv, d, page = shape.kv_dtype, shape.head_dim, shape.page_size
    sweep = "sweep" in shape.tags
    if shape.suite in ("decode", "spec_decode"):
        if kv == "nvfp4":
            return [], "no FlashInfer peer: no NVFP4 KV decode kernel on SM90 (XQA's NVFP4 path is SM12x only)"
        if shape.ragged_drafts:
            return [], ("no FlashInfer peer: the harness times ragged drafts (q_cu_seq_lens) on kvattn only; "
                        "the padded row of the same shape carries the peers")
        group = shape.num_qo_heads // shape.num_kv_heads
        out = []
        if kv == "bfloat16":
            out.append(("fi-fa2-tc", ("fa2-tc", kv, d)))
        if shape.q_len == 1 and not sweep:
            out.append(("fi-fa2", ("fa2-decode", kv, d)))
        xqa_ok = page in XQA_PAGES and d % 16 == 0 and d <= XQA_MAX_HEAD_DIM
        if xqa_ok and (kv == "fp8" or not sweep):
            out.append(("fi-xqa", ("xqa", kv, page, d, group, shape.q_len)))
        return out, ""
    if shape.suite == "single_decode":
        if kv != "bfloat16":
            return [], "no FlashInfer peer for this cache dtype"
        return [("fi-single", ("single", kv, d, shape.pos_encoding_mode))], ""
    if shape.suite == "prefill":
        if kv != "bfloat16" or shape.q_dtype != "bfloat16":
            return [], "no FlashInfer peer: FA3 prefill is timed on bf16 query and cache only"
        return [("fi-fa3", ("fa3-prefill", d))], ""
    if shape.suite == "mla":
        if kv not in ("bfloat16", "fp8"):
            return [], "no FlashInfer peer for this cache dtype"
        return [("fi-fa3-mla", ("fa3-mla", kv))], ""
    return [], f"no FlashInfer peer for suite {shape.suite!r}"


def fi_call(name: str, shape: Shape) -> dict:
    """The arguments of peer ``name``'s FlashInfer call on ``shape`` that choose the compiled module.

    The peers pass these values to FlashInfer (the dtypes as ``plan`` arguments, or as the dtypes
    of the tensors handed over, which :func:`check_call` compares before the call), and
    :func:`modules` turns them into the module FlashInfer loads; the prebuild compiles the same,
    so what it builds and what the timed call loads come from one place.
    """
    call = dict(q="bfloat16", kv=shape.kv_dtype, out="bfloat16", idx="int32", head_dim=shape.head_dim,
                page_size=shape.page_size, group=shape.num_qo_heads // shape.num_kv_heads, q_len=shape.q_len,
                pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=0.0)
    if name == "fi-single":
        call["pos_encoding_mode"] = shape.pos_encoding_mode
    if name == "fi-fa3-mla":  # the latent pool's two parts; the query is handed over in bf16
        call.update(head_dim=MLA_CKV_DIM, head_dim_kpe=MLA_KPE_DIM)
    return call


# What each FlashInfer JIT generator takes (its positional arguments), for describe() and the tests.
GENERATOR_FIELDS = {
    "_gen_batch_prefill_primary_module": ("backend", "q", "kv", "out", "idx", "head_dim_qk", "head_dim_vo",
                                          "pos_encoding", "sliding_window", "logits_soft_cap", "fp16_qk_reduction"),
    "gen_batch_prefill_module": ("backend", "q", "kv", "out", "idx", "head_dim_qk", "head_dim_vo", "pos_encoding",
                                 "sliding_window", "logits_soft_cap", "fp16_qk_reduction"),
    "gen_batch_decode_module": ("q", "kv", "out", "idx", "head_dim_qk", "head_dim_vo", "pos_encoding",
                                "sliding_window", "logits_soft_cap"),
    "gen_single_decode_module": ("q", "kv", "out", "head_dim_qk", "head_dim_vo", "pos_encoding", "sliding_window",
                                 "logits_soft_cap"),
    "gen_xqa_module": ("q", "kv", "page_size", "head_dim", "group", "sliding_window", "out", "q_len", "ragged_q"),
    "gen_batch_mla_module": ("backend", "q", "kv", "out", "idx", "head_dim_ckv", "head_dim_kpe", "profiler"),
}


def modules(name: str, call: dict) -> list[tuple]:
    """The FlashInfer JIT modules peer ``name`` loads when called with ``call`` (:func:`fi_call`):
    ``(kind, generator, arguments)`` each, ``generator`` a function of ``flashinfer.jit`` and
    ``arguments`` what FlashInfer 0.7.2's entry point passes it (dtypes by name), which is what
    the module's URI, and so its build directory, is made of."""
    q, kv, out, idx, d = call["q"], call["kv"], call["out"], call["idx"], call["head_dim"]
    pos = POS_ENCODING[call["pos_encoding_mode"]]
    window, cap = call["window_left"] != -1, call["logits_soft_cap"] > 0
    if name == "fi-fa2-tc":
        # plan() loads get_batch_prefill_module("fa2", ...): its primary module, for K and V pools
        # of equal strides. run() would load a second one for unequal strides; check_call refuses
        # those, so the peer never needs it.
        return [("fa2-tc", "_gen_batch_prefill_primary_module",
                 ("fa2", q, kv, out, idx, d, d, pos, window, cap, False))]
    if name == "fi-fa2":
        return [("fa2-decode", "gen_batch_decode_module", (q, kv, out, idx, d, d, pos, window, cap))]
    if name == "fi-xqa":  # one module per page size, head dim, group and q_len; no ragged drafts
        return [("xqa", "gen_xqa_module",
                 (q, kv, call["page_size"], d, call["group"], window, out, call["q_len"], False))]
    if name == "fi-single":  # the output takes the query's dtype
        return [("single", "gen_single_decode_module", (q, kv, q, d, d, pos, window, cap))]
    if name == "fi-fa3":
        return [("fa3-prefill", "gen_batch_prefill_module", ("fa3", q, kv, out, idx, d, d, pos, window, cap, False))]
    if name == "fi-fa3-mla":  # the output takes the query's dtype
        return [("fa3-mla", "gen_batch_mla_module", ("fa3", q, kv, q, idx, d, call["head_dim_kpe"], False))]
    raise ValueError(f"name: expected one of {sorted(_NOTES)}, got {name!r}")


def variant_keys(shapes: list[Shape]) -> list[tuple]:
    """Every FlashInfer JIT module the shapes' peers load, each once, in a stable order."""
    seen: dict[tuple, None] = {}
    for s in shapes:
        for name, _ in kernels(s)[0]:
            for key in modules(name, fi_call(name, s)):
                seen.setdefault(key, None)
    return sorted(seen, key=lambda k: (k[0], k[1], tuple(str(x) for x in k[2])))


_SHORT = {"bfloat16": "bf16"}


def describe(key: tuple) -> str:
    """A module key (:func:`variant_keys`) in words (``--list`` and the results' env); arguments
    off the peers' usual values (bf16 query and output, int32 indices, no position encoding,
    window or soft-cap) are named after the usual part."""
    kind, generator, args = key
    f = dict(zip(GENERATOR_FIELDS[generator], args))
    kvs = _SHORT.get(f["kv"], f["kv"])
    if kind == "xqa":
        text = f"xqa {kvs} p{f['page_size']} D{f['head_dim']} g{f['group']}"
        text += f" q{f['q_len']}" if f["q_len"] > 1 else ""
    elif kind == "single":
        mode = {v: k for k, v in POS_ENCODING.items()}[f["pos_encoding"]]
        text = f"single-decode {kvs} D{f['head_dim_qk']} {mode}"
    elif kind == "fa3-prefill":
        text = f"fa3-prefill {kvs} D{f['head_dim_qk']}"
    elif kind == "fa3-mla":
        text = f"fa3-mla {kvs}"
    else:
        text = f"{kind} {kvs} D{f['head_dim_qk']}"
    usual = {"q": "bfloat16", "out": "bfloat16", "idx": "int32"}
    unusual = [f"{k}={f[k]}" for k in usual if k in f and f[k] != usual[k]]
    unusual += [k for k in ("sliding_window", "logits_soft_cap", "fp16_qk_reduction", "ragged_q", "profiler")
                if f.get(k)]
    if kind != "single" and f.get("pos_encoding"):
        unusual.append(f"pos_encoding={f['pos_encoding']}")
    return text + (f" ({', '.join(unusual)})" if unusual else "")


_DTYPES = {"bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "int32": torch.int32}


def _dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def check_call(name: str, call: dict, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None,
               idx: torch.Tensor | None = None) -> None:
    """Raise ValueError if the tensors peer ``name`` hands FlashInfer are not those :func:`fi_call`
    describes: then the call would load (and compile, in the timed phase) a module the prebuild
    did not build."""
    wrong = []
    if q.dtype != _dtype(call["q"]):
        wrong.append(f"query dtype {q.dtype}, expected {call['q']}")
    if k.dtype != _dtype(call["kv"]):
        wrong.append(f"cache dtype {k.dtype}, expected {call['kv']}")
    if v is not None and (v.dtype != k.dtype or v.stride() != k.stride()):
        wrong.append(f"V pool dtype / strides {v.dtype} {v.stride()} differ from K's {k.dtype} {k.stride()}")
    if idx is not None and idx.dtype != _dtype(call["idx"]):
        wrong.append(f"page index dtype {idx.dtype}, expected {call['idx']}")
    if name != "fi-fa3-mla" and q.shape[-1] != call["head_dim"]:
        wrong.append(f"head dim {q.shape[-1]}, expected {call['head_dim']}")
    if wrong:
        raise ValueError(f"{name}: the inputs do not match the prebuilt module's arguments: {'; '.join(wrong)}")


def jit_specs(keys: list[tuple]) -> list:
    """FlashInfer's JitSpecs of module keys (:func:`variant_keys`): each generator called with the
    arguments the timed call's entry point passes it."""
    from flashinfer.jit import xqa as jit_xqa
    from flashinfer.jit.attention import modules as jit_attention

    specs = []
    for kind, generator, args in keys:
        home = jit_xqa if generator == "gen_xqa_module" else jit_attention
        if generator not in GENERATOR_FIELDS or not hasattr(home, generator):
            raise ValueError(f"unknown FlashInfer generator {generator!r} (variant {kind})")
        specs.append(getattr(home, generator)(*(_DTYPES.get(a, a) if isinstance(a, str) else a for a in args)))
    return specs


def _build_one(spec, jobs: int) -> float:
    """Build one module the way FlashInfer's first use does (``JitSpec.build``): its own ninja
    file, run in its own build directory, whose ``.ninja_log`` / ``.ninja_deps`` the timed call's
    ninja reads. ``jobs`` nvcc processes. Returns the seconds."""
    from filelock import FileLock
    from flashinfer.jit.cpp_ext import run_ninja

    t0 = time.perf_counter()
    with FileLock(spec.lock_path, thread_local=False):
        spec.write_ninja()
        run_ninja(spec.build_dir, spec.ninja_path, False, max_jobs=jobs)
    return time.perf_counter() - t0


def up_to_date(spec) -> bool:
    """Whether the first use of ``spec`` would compile nothing: ninja's dry run in the module's
    build directory (the one its first use runs ninja in) has no work to do."""
    r = subprocess.run(["ninja", "-n", "-C", str(spec.build_dir), "-f", str(spec.ninja_path)],
                       capture_output=True, text=True, timeout=60)
    return r.returncode == 0 and "no work to do" in r.stdout


def build_in_parallel(specs: list, total_jobs: int, build_one=_build_one) -> list[float]:
    """``build_one(spec, jobs)`` for every spec, ``total_jobs`` nvcc processes at most in all.

    Each module's ninja gets as many jobs as it has translation units (at most ``total_jobs``).
    Largest first: whenever jobs free up, the largest waiting module that fits starts. Returns
    each spec's seconds, in the order given; a failed build raises once the others are done.
    """
    def need(i: int) -> int:
        return max(1, min(len(getattr(specs[i], "sources", ()) or ()) or 1, total_jobs))

    waiting = sorted(range(len(specs)), key=lambda i: -need(i))
    free = [total_jobs]
    cond = threading.Condition()
    seconds: list[float] = [0.0] * len(specs)

    def run(i: int, jobs: int) -> None:
        try:
            seconds[i] = build_one(specs[i], jobs)
        finally:
            with cond:
                free[0] += jobs
                cond.notify_all()

    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        futures = []
        while waiting:
            with cond:
                cond.wait_for(lambda: any(need(i) <= free[0] for i in waiting))
                i = next(i for i in waiting if need(i) <= free[0])
                waiting.remove(i)
                free[0] -= need(i)
            futures.append(pool.submit(run, i, need(i)))
        for fut in futures:
            fut.result()
    return seconds


def prebuild(shapes: list[Shape], log=print) -> dict:
    """Compile every module the shapes' peers load, in parallel, before any timing.

    Each module is built by its own ninja in its own build directory, as FlashInfer's first use
    builds it, so that first use finds ninja's records of the build and compiles nothing.
    (``flashinfer.jit.build_jit_specs`` runs one ninja over all modules from the JIT directory,
    which keeps those records there: the timed call's ninja, run in the module's directory, then
    found none and compiled the module again; lab/notes/method.md.) At most
    ``FLASHINFER_JIT_PREBUILD_MAX_JOBS`` (default: the CPU count) nvcc processes run at once.
    What it returns goes into the results' ``env``: the variants, the seconds (in all and each),
    the variants whose first use would still compile (``stale``, from a ninja dry run), the error.
    """
    keys = variant_keys(shapes)
    names = [describe(k) for k in keys]
    info = {"variants": names, "seconds": None, "variant_seconds": None, "stale": None, "error": None}
    if not keys:
        info["seconds"] = 0.0
        return info
    t0 = time.perf_counter()
    try:
        load()
        env_jobs = os.environ.get("FLASHINFER_JIT_PREBUILD_MAX_JOBS", "")
        jobs = int(env_jobs) if env_jobs.isdigit() else (os.cpu_count() or 8)
        specs = jit_specs(keys)
        # A module shipped ahead of time (an installed jit-cache package) loads without ninja.
        todo = [i for i, spec in enumerate(specs) if not getattr(spec, "is_aot", False)]
        log(f"FlashInfer: compiling {len(todo)} variants, {jobs} jobs ({', '.join(names[i] for i in todo)}) ...")
        secs = build_in_parallel([specs[i] for i in todo], jobs)
        info["variant_seconds"] = {names[i]: round(s, 1) for i, s in zip(todo, secs)}
        info["stale"] = [names[i] for i in todo if not up_to_date(specs[i])]
        log(f"FlashInfer: built in {time.perf_counter() - t0:.1f} s; "
            + (f"still to compile on first use: {', '.join(info['stale'])}" if info["stale"]
               else "ninja has nothing left to do in any variant's build directory"))
    except NotAvailable as exc:
        info["error"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - a failed prebuild leaves the variants to compile on first use
        info["error"] = f"{type(exc).__name__}: {str(exc).strip()[-600:]}"
    info["seconds"] = round(time.perf_counter() - t0, 1)
    return info


# ----------------------------------------------------------------------------------------------
# The peers (device only)
# ----------------------------------------------------------------------------------------------


def workspace(device: torch.device, kind: str) -> torch.Tensor:
    """Zeroed uint8 workspaces kept apart from kvattn's: one for the wrappers' split-KV partials,
    one for XQA (whose first 8 MiB are semaphores that must start at zero)."""
    key = (str(device), kind)
    if key not in _workspaces:
        extra = XQA_SEMAPHORE_BYTES if kind == "xqa" else 0
        _workspaces[key] = torch.zeros((WORKSPACE_MIB << 20) + extra, dtype=torch.uint8, device=device)
    return _workspaces[key]


def _refusal(exc: Exception) -> NotAvailable:
    return NotAvailable(f"FlashInfer refused: {type(exc).__name__}: {str(exc).strip()[:400]}")


def _plan(fn):
    """Run a wrapper's plan; an argument it rejects is a refusal (not available), reported as such."""
    try:
        return fn()
    except (ValueError, NotImplementedError, TypeError, AssertionError) as exc:
        raise _refusal(exc) from exc


def _as_uint32(t: torch.Tensor) -> torch.Tensor:
    """XQA documents uint32 lengths: the same bits, viewed (int32 if this torch cannot view)."""
    try:
        return t.view(torch.uint32)
    except (AttributeError, RuntimeError, TypeError):
        return t


# FlashInfer's defaults of the call arguments that pick a module variant beyond the dtypes.
_VARIANT_DEFAULTS = {"pos_encoding_mode": "NONE", "window_left": -1, "logits_soft_cap": 0.0}


def _variant_kwargs(call: dict, names=tuple(_VARIANT_DEFAULTS)) -> dict:
    """The keyword arguments of ``call`` (:func:`fi_call`) that differ from FlashInfer's defaults:
    given explicitly, the rest left to the defaults :func:`modules` assumes."""
    return {k: call[k] for k in names if call[k] != _VARIANT_DEFAULTS[k]}


def _decode_fns(fi, spec: AttnSpec, shape: Shape, name: str) -> callable:
    p, q = spec.pools, decode_query(spec)
    c = fi_call(name, shape)
    indptr, indices, last = csr_pages(p.tables, p.lens, p.page_size)
    check_call(name, c, q, p.k, p.v, indptr)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(q.device, "wrapper"), p.layout,
                                              use_tensor_cores=name == "fi-fa2-tc", backend="fa2")
    _plan(lambda: w.plan(indptr, indices, last, shape.num_qo_heads, shape.num_kv_heads, c["head_dim"],
                         c["page_size"], q_data_type=_dtype(c["q"]), kv_data_type=_dtype(c["kv"]),
                         o_data_type=_dtype(c["out"]), sm_scale=spec.native["scale"], q_len_per_req=c["q_len"],
                         **_variant_kwargs(c)))
    out = torch.empty_like(q, dtype=_dtype(c["out"]))
    kv = (p.k, p.v)
    return lambda: w.run(q, kv, out=out)


def _xqa_fns(fi, spec: AttnSpec, shape: Shape, name: str) -> callable:
    p, q = spec.pools, decode_query(spec)
    c = fi_call(name, shape)
    check_call(name, c, q, p.k, p.v)  # XQA reads its module's dtypes, page size, head dim, group off the tensors
    mask = None
    if c["q_len"] > 1:
        mask = xqa_causal_mask(shape.batch, c["q_len"]).to(q.device).view(torch.uint16)
    seq = _as_uint32(p.seq_lens)
    out = torch.empty_like(q, dtype=_dtype(c["out"]))
    ws = workspace(q.device, "xqa")
    kv = (p.k, p.v)
    max_len, scale = spec.native["max_len"], spec.native["scale"]

    def call():
        return fi.decode.xqa_batch_decode_with_kv_cache(
            q, kv, ws, p.tables, seq, max_len, bmm1_scale=scale, bmm2_scale=1.0, out=out, kv_layout=p.layout,
            q_len_per_req=c["q_len"], mask=mask, **_variant_kwargs(c, ("window_left",)))

    return call


def _single_fns(fi, spec: AttnSpec, shape: Shape, name: str) -> callable:
    nat = spec.native
    q, k, v = nat["q"], nat["k"], nat["v"]
    c = fi_call(name, shape)
    check_call(name, c, q, k, v)
    scale = spec.scale
    kw = _variant_kwargs(c, ("window_left", "logits_soft_cap"))
    return lambda: fi.single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode=c["pos_encoding_mode"],
                                                  sm_scale=scale, **kw)


def _prefill_fns(fi, spec: AttnSpec, shape: Shape, name: str) -> callable:
    p, q = spec.pools, spec.native["q"]
    c = fi_call(name, shape)
    indptr, indices, last = csr_pages(p.tables, p.lens, p.page_size)
    check_call(name, c, q, p.k, p.v, indptr)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(q.device, "wrapper"), p.layout, backend="fa3")
    _plan(lambda: w.plan(spec.native["cum_q"], indptr, indices, last, shape.num_qo_heads, shape.num_kv_heads,
                         c["head_dim"], c["page_size"], causal=shape.causal, sm_scale=spec.native["scale"],
                         q_data_type=_dtype(c["q"]), kv_data_type=_dtype(c["kv"]), o_data_type=_dtype(c["out"]),
                         **_variant_kwargs(c)))
    out = torch.empty(q.shape, dtype=_dtype(c["out"]), device=q.device)
    kv = (p.k, p.v)
    return lambda: w.run(q, kv, out=out)


def _mla_fns(fi, spec: AttnSpec, shape: Shape, name: str) -> callable:
    from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

    p = spec.pools
    c = fi_call(name, shape)
    q = spec.native["q"]  # [B, 1, H, 576]
    b, hq = shape.batch, shape.num_qo_heads
    qb = q.reshape(b, hq, q.shape[-1]).to(_dtype(c["q"])).contiguous()  # the kernel takes a bf16 query
    indptr, indices, _ = csr_pages(p.tables, p.lens, p.page_size)
    qo_indptr = torch.arange(b + 1, dtype=_dtype(c["idx"]), device=q.device)
    check_call(name, c, qb, p.k, None, qo_indptr)  # the module is keyed on qo_indptr's dtype
    w = BatchMLAPagedAttentionWrapper(workspace(q.device, "wrapper"), backend="fa3")
    meta = MLAPlanMetadata.csr(qo_indptr, indptr, indices, p.seq_lens)
    _plan(lambda: w.plan(metadata=meta, num_heads=hq, head_dim_ckv=c["head_dim"], head_dim_kpe=c["head_dim_kpe"],
                         page_size=c["page_size"], causal=False, sm_scale=MLA_SCALE, q_data_type=_dtype(c["q"]),
                         kv_data_type=_dtype(c["kv"])))
    out = torch.empty((b, hq, c["head_dim"]), dtype=_dtype(c["q"]), device=q.device)
    scales = {"ckv_scale": 1.0, "kpe_scale": 1.0} if p.k.dtype == torch.float8_e4m3fn else {}
    return lambda: w.run(query=qb, kv_cache=p.k, out=out, **scales)


_BUILDERS = {
    "fi-fa2-tc": _decode_fns,
    "fi-fa2": _decode_fns,
    "fi-xqa": _xqa_fns,
    "fi-single": _single_fns,
    "fi-fa3": _prefill_fns,
    "fi-fa3-mla": _mla_fns,
}
_NOTES = {
    "fi-fa2-tc": "BatchDecodeWithPagedKVCacheWrapper, tensor cores (fa2), planned for these lengths",
    "fi-fa2": "BatchDecodeWithPagedKVCacheWrapper, CUDA cores, planned for these lengths",
    "fi-xqa": "xqa_batch_decode_with_kv_cache (XQA)",
    "fi-single": "single_decode_with_kv_cache",
    "fi-fa3": "BatchPrefillWithPagedKVCacheWrapper(backend='fa3'), planned for these lengths",
    "fi-fa3-mla": "BatchMLAPagedAttentionWrapper(backend='fa3'), packed latent pool",
}


def _make(name: str, problem: Problem) -> Variant:
    fi = load()
    shape = problem.shape
    fns = [_BUILDERS[name](fi, s.spec, shape, name) for s in problem.sets]
    note = _NOTES[name]
    if name == "fi-fa3-mla" and shape.q_dtype != "bfloat16":
        note += "; query given in bf16 (the kernel takes no fp8 query)"
    if name == "fi-xqa" and shape.kv_dtype == "fp8":
        note += "; fp8 arithmetic"
    return Variant(name, FAMILY, fns, note=note, extra={"native_out": True})


def variants(problem: Problem) -> Iterator[tuple[str, object]]:
    """``(name, build)`` per FlashInfer kernel of the shape; ``build()`` returns a Variant or raises
    :class:`NotAvailable` (no flashinfer, or a kernel that refuses the inputs)."""
    for name, _ in kernels(problem.shape)[0]:
        yield name, (lambda name=name: _make(name, problem))


def compiled_in_timed_phase(rec: dict) -> str:
    """A note when a FlashInfer record's set-up (``build_s``: wrapper and plan) or first call
    (``first_call_s``: XQA loads its module there) took long enough to have compiled a module
    the prebuild should have built; empty otherwise."""
    build, first = rec.get("build_s") or 0.0, rec.get("first_call_s") or 0.0
    if build + first < COMPILE_HINT_S:
        return ""
    return f"compiled in the timed phase? set-up {build:.1f} s, first call {first:.1f} s"


def check_failed(rec: dict) -> bool:
    """Whether a FlashInfer record's output disagreed with kvattn's (then it is not a best)."""
    err = rec.get("rel_err")
    return err is not None and not (err <= CHECK_MAX)  # NaN / inf never pass
