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
compiles every variant a run needs at its start, in parallel (``flashinfer.jit.build_jit_specs``:
one ninja build over all of them), and :func:`variant_keys` lists them.

``import flashinfer`` failing (the usual case off the GPU machine: the package is carried there,
``.peers/flashinfer/activate.sh``) makes every peer ``not available`` with the reason; nothing in
the package or the tests imports flashinfer. A peer whose output is far from kvattn's
(:data:`CHECK_MAX`) is marked and never counted as FlashInfer's best.
"""

from __future__ import annotations

import os
import time
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
    """``([(peer name, JIT variant key), ...], note)``: FlashInfer's kernels for this shape; the
    note says why a shape has none (or fewer than usual)."""
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


def variant_keys(shapes: list[Shape]) -> list[tuple]:
    """Every FlashInfer JIT variant the shapes' peers need, each once, in a stable order."""
    seen: dict[tuple, None] = {}
    for s in shapes:
        for _, key in kernels(s)[0]:
            seen.setdefault(key, None)
    return sorted(seen, key=lambda k: tuple(str(x) for x in k))


def describe(key: tuple) -> str:
    """A variant key in words (``--list`` and the results' env)."""
    kind, kv = key[0], key[1]
    kvs = {"bfloat16": "bf16"}.get(kv, kv)
    if kind == "xqa":
        _, _, page, d, group, q = key
        return f"xqa {kvs} p{page} D{d} g{group}" + (f" q{q}" if q > 1 else "")
    if kind == "single":
        return f"single-decode {kvs} D{key[2]} {key[3]}"
    if kind in ("fa2-tc", "fa2-decode"):
        return f"{kind} {kvs} D{key[2]}"
    if kind == "fa3-prefill":
        return f"fa3-prefill bf16 D{key[1]}"
    return f"{kind} {kvs}"


def _dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[name]


def jit_specs(keys: list[tuple]) -> list:
    """FlashInfer's JitSpecs of ``keys``: the modules its entry points build on first use, with
    the arguments those entry points pass (bf16 query and output, int32 page indices)."""
    from flashinfer.jit import build_jit_specs  # noqa: F401 - fail early if this FlashInfer lacks it
    from flashinfer.jit.attention import modules as m
    from flashinfer.jit.xqa import gen_xqa_module

    bf16, i32 = torch.bfloat16, torch.int32
    specs = []
    for key in keys:
        kind = key[0]
        if kind == "fa2-tc":  # BatchDecode... use_tensor_cores=True plans get_batch_prefill_module("fa2", ...)
            kv, d = _dtype(key[1]), key[2]
            specs.append(m._gen_batch_prefill_primary_module("fa2", bf16, kv, bf16, i32, d, d, 0, False, False, False))
        elif kind == "fa2-decode":
            kv, d = _dtype(key[1]), key[2]
            specs.append(m.gen_batch_decode_module(bf16, kv, bf16, i32, d, d, 0, False, False))
        elif kind == "xqa":
            _, kv, page, d, group, q = key
            specs.append(gen_xqa_module(bf16, _dtype(kv), page, d, group, False, bf16, q, False))
        elif kind == "single":
            _, kv, d, mode = key
            specs.append(m.gen_single_decode_module(bf16, _dtype(kv), bf16, d, d, POS_ENCODING[mode], False, False))
        elif kind == "fa3-prefill":
            d = key[1]
            specs.append(m.gen_batch_prefill_module("fa3", bf16, bf16, bf16, i32, d, d, 0, False, False, False))
        elif kind == "fa3-mla":
            specs.append(m.gen_batch_mla_module("fa3", bf16, _dtype(key[1]), bf16, i32, 512, 64, False))
        else:
            raise ValueError(f"unknown FlashInfer variant {key!r}")
    return specs


def prebuild(shapes: list[Shape], log=print) -> dict:
    """Compile every variant the shapes need, in parallel, before any timing.

    ``flashinfer.jit.build_jit_specs`` writes one ninja file naming every variant's build and runs
    ninja once (``-j`` = ``FLASHINFER_JIT_PREBUILD_MAX_JOBS``, set here to the CPU count unless
    given), so the variants' translation units compile concurrently instead of one module at a time
    on first use. What it returns goes into the results' ``env`` (seconds, variants, error).
    """
    keys = variant_keys(shapes)
    info = {"variants": [describe(k) for k in keys], "seconds": None, "error": None}
    if not keys:
        info["seconds"] = 0.0
        return info
    t0 = time.perf_counter()
    try:
        load()
        from flashinfer.jit import build_jit_specs

        os.environ.setdefault("FLASHINFER_JIT_PREBUILD_MAX_JOBS", str(os.cpu_count() or 8))
        specs = jit_specs(keys)
        log(f"FlashInfer: compiling {len(specs)} variants in parallel ({', '.join(info['variants'])}) ...")
        build_jit_specs(specs, verbose=False, skip_prebuilt=True)
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


def _decode_fns(fi, spec: AttnSpec, shape: Shape, tensor_cores: bool) -> callable:
    p, q = spec.pools, decode_query(spec)
    indptr, indices, last = csr_pages(p.tables, p.lens, p.page_size)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(q.device, "wrapper"), p.layout,
                                              use_tensor_cores=tensor_cores, backend="fa2")
    _plan(lambda: w.plan(indptr, indices, last, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim,
                         p.page_size, q_data_type=q.dtype, kv_data_type=p.k.dtype, o_data_type=q.dtype,
                         sm_scale=spec.native["scale"], q_len_per_req=shape.q_len))
    out = torch.empty_like(q)
    kv = (p.k, p.v)
    return lambda: w.run(q, kv, out=out)


def _xqa_fns(fi, spec: AttnSpec, shape: Shape) -> callable:
    p, q = spec.pools, decode_query(spec)
    mask = None
    if shape.q_len > 1:
        mask = xqa_causal_mask(shape.batch, shape.q_len).to(q.device).view(torch.uint16)
    seq = _as_uint32(p.seq_lens)
    out = torch.empty_like(q)
    ws = workspace(q.device, "xqa")
    kv = (p.k, p.v)
    max_len, scale = spec.native["max_len"], spec.native["scale"]

    def call():
        return fi.decode.xqa_batch_decode_with_kv_cache(
            q, kv, ws, p.tables, seq, max_len, bmm1_scale=scale, bmm2_scale=1.0, out=out, kv_layout=p.layout,
            q_len_per_req=shape.q_len, mask=mask)

    return call


def _single_fns(fi, spec: AttnSpec, shape: Shape) -> callable:
    nat = spec.native
    q, k, v, mode = nat["q"], nat["k"], nat["v"], nat["pos_encoding_mode"]
    scale = spec.scale
    return lambda: fi.single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode=mode, sm_scale=scale)


def _prefill_fns(fi, spec: AttnSpec, shape: Shape) -> callable:
    p, q = spec.pools, spec.native["q"]
    indptr, indices, last = csr_pages(p.tables, p.lens, p.page_size)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(q.device, "wrapper"), p.layout, backend="fa3")
    _plan(lambda: w.plan(spec.native["cum_q"], indptr, indices, last, shape.num_qo_heads, shape.num_kv_heads,
                         shape.head_dim, p.page_size, causal=shape.causal, sm_scale=spec.native["scale"],
                         q_data_type=q.dtype, kv_data_type=p.k.dtype, o_data_type=torch.bfloat16))
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    kv = (p.k, p.v)
    return lambda: w.run(q, kv, out=out)


def _mla_fns(fi, spec: AttnSpec, shape: Shape) -> callable:
    from flashinfer.mla import BatchMLAPagedAttentionWrapper, MLAPlanMetadata

    p = spec.pools
    q = spec.native["q"]  # [B, 1, H, 576]
    b, hq = shape.batch, shape.num_qo_heads
    qb = q.reshape(b, hq, q.shape[-1]).to(torch.bfloat16).contiguous()  # the kernel takes a bf16 query
    indptr, indices, _ = csr_pages(p.tables, p.lens, p.page_size)
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=q.device)
    w = BatchMLAPagedAttentionWrapper(workspace(q.device, "wrapper"), backend="fa3")
    meta = MLAPlanMetadata.csr(qo_indptr, indptr, indices, p.seq_lens)
    _plan(lambda: w.plan(metadata=meta, num_heads=hq, head_dim_ckv=512, head_dim_kpe=64, page_size=p.page_size,
                         causal=False, sm_scale=MLA_SCALE, q_data_type=torch.bfloat16, kv_data_type=p.k.dtype))
    out = torch.empty((b, hq, 512), dtype=torch.bfloat16, device=q.device)
    scales = {"ckv_scale": 1.0, "kpe_scale": 1.0} if p.k.dtype == torch.float8_e4m3fn else {}
    return lambda: w.run(query=qb, kv_cache=p.k, out=out, **scales)


_BUILDERS = {
    "fi-fa2-tc": lambda fi, spec, shape: _decode_fns(fi, spec, shape, True),
    "fi-fa2": lambda fi, spec, shape: _decode_fns(fi, spec, shape, False),
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
    fns = [_BUILDERS[name](fi, s.spec, shape) for s in problem.sets]
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


def check_failed(rec: dict) -> bool:
    """Whether a FlashInfer record's output disagreed with kvattn's (then it is not a best)."""
    err = rec.get("rel_err")
    return err is not None and not (err <= CHECK_MAX)  # NaN / inf never pass
