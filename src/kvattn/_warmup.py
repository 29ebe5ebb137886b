"""``kvattn.warmup``: compile and load, at start-up, the kernels a serving configuration will use."""

from __future__ import annotations

import math
import sys
import time
from typing import Iterable, Optional, Sequence

import torch

from . import decode, mla, prefill, xqa
from ._console import Progress

FUNCTIONS = ("decode", "xqa", "single_decode", "mla", "prefill")
_MLA_DIM, _MLA_V = 576, 512


def _pages_like(num_pages: int) -> int:
    """The fewest pages that launch the kernels ``num_pages`` pages launch: the page count is a
    kernel argument Triton specialises as 1, a multiple of 16, or neither (see
    :mod:`kvattn.runtime.fast_launch`)."""
    if num_pages == 1:
        return 1
    return 16 if num_pages % 16 == 0 else 17


def _lengths(batch: int, length: int, device) -> torch.Tensor:
    # Values do not pick kernels (only host sizes do): short requests keep the warm-up quick.
    return torch.ones(batch, dtype=torch.int32, device=device)


def _calls(name: str, *, device, dtype, kv_dtype, hq, hkv, d, page, layout, batch_sizes, seq_lens, q_lens,
           num_pages, width, ws, modes):
    """``(label, call)`` for every call of ``name`` the warm-up makes."""
    pages = _pages_like(num_pages)
    if name == "decode":
        for b in batch_sizes:
            for s in seq_lens:
                pps = max(width, math.ceil(s / page))
                shape = (pages, 2, page, hkv, d) if layout == "NHD" else (pages, 2, hkv, page, d)

                def call(b=b, s=s, pps=pps, shape=shape):
                    q = torch.randn(b, hq, d, device=device).to(dtype)
                    kv = torch.randn(shape, device=device).to(kv_dtype)
                    tables = torch.zeros(b, pps, dtype=torch.int32, device=device)
                    out = torch.empty_like(q)
                    for _ in range(2):  # (the second call takes the path every later call takes)
                        decode.xqa_batch_decode_with_kv_cache(
                            q, kv, ws, tables, _lengths(b, s, device), s, bmm1_scale=d ** -0.5, out=out,
                            kv_layout=layout)

                yield f"decode B{b} L{s}", call
    elif name == "xqa":
        for b in batch_sizes:
            for s in seq_lens:
                pps = max(width, math.ceil(s / page))

                def call(b=b, pps=pps):
                    q = torch.randn(b, 1, hq, d, device=device).to(dtype)
                    k, v = (torch.randn(pages * page * hkv, d, device=device).to(kv_dtype) for _ in range(2))
                    tables = torch.zeros(b, pps, dtype=torch.int32, device=device)
                    lens = _lengths(b, 0, device).view(b, 1)
                    out, sem = torch.empty_like(q), torch.zeros(8, dtype=torch.uint32, device=device)
                    for _ in range(2):
                        xqa.xqa(q, k, v, tables, lens, out, ws, sem, hkv, page, kv_layout=layout)

                yield f"xqa B{b} L{pps * page}", call
    elif name == "single_decode":
        for s in seq_lens:
            for mode in modes:

                def call(s=s, mode=mode):
                    q = torch.randn(hq, d, device=device).to(dtype)
                    shape = (s, hkv, d) if layout == "NHD" else (hkv, s, d)
                    k, v = (torch.randn(shape, device=device).to(kv_dtype) for _ in range(2))
                    out = torch.empty_like(q)
                    for _ in range(2):
                        decode.single_decode_with_kv_cache(q, k, v, kv_layout=layout, pos_encoding_mode=mode,
                                                                  out=out)

                yield f"single_decode L{s} {mode}", call
    elif name == "mla":
        mla_dtype = torch.bfloat16 if dtype in (torch.bfloat16, torch.float16) else dtype
        for b in batch_sizes:
            for s in seq_lens:
                pps = max(width, math.ceil(s / page))

                def call(b=b, s=s, pps=pps):
                    q = torch.randn(b, 1, hq, _MLA_DIM, device=device).to(mla_dtype)
                    cache = torch.randn(pages, page, _MLA_DIM, device=device).to(mla_dtype)
                    tables = torch.zeros(b, pps, dtype=torch.int32, device=device)
                    out = torch.empty(b, hq, _MLA_V, dtype=torch.bfloat16, device=device)
                    for _ in range(2):
                        mla.xqa_batch_decode_with_kv_cache_mla(
                            q, cache, ws, 128, 512, 64, tables, _lengths(b, s, device), s, out=out,
                            bmm1_scale=192 ** -0.5)

                yield f"mla B{b} L{s}", call
    elif name == "prefill":
        for b in batch_sizes:
            for s in seq_lens:
                for ql in q_lens:
                    if ql > s:
                        continue
                    pps = max(width, math.ceil(s / page))

                    def call(b=b, s=s, ql=ql, pps=pps):
                        shape = (pages, 2, hkv, page, d) if layout == "HND" else (pages, 2, page, hkv, d)
                        kv = torch.randn(shape, device=device).to(kv_dtype)
                        q = torch.randn(b * ql, hq, d, device=device).to(dtype)
                        tables = torch.zeros(b, pps, dtype=torch.int32, device=device)
                        lens = torch.full((b,), s, dtype=torch.int32, device=device)
                        cum_q = torch.arange(0, b * ql + 1, ql, dtype=torch.int32, device=device)
                        cum_kv = torch.arange(0, b * s + 1, s, dtype=torch.int32, device=device)
                        out = torch.empty_like(q)
                        for _ in range(2):
                            prefill.trtllm_batch_context_with_kv_cache(
                                q, kv, ws, tables, lens, ql, s, d ** -0.5, 1.0, b, cum_q, cum_kv, out=out,
                                kv_layout=layout)

                    yield f"prefill B{b} Lq{ql} L{s}", call
    else:
        raise ValueError(f"functions: expected names in {FUNCTIONS}, got {name!r}")


def warmup(
    functions: Optional[Iterable[str]] = None,
    *,
    device: Optional[torch.device] = None,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: Optional[torch.dtype] = None,
    num_qo_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    page_size: int = 16,
    kv_layout: str = "NHD",
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
    seq_lens: Sequence[int] = (1024, 4096, 16384),
    q_lens: Sequence[int] = (1, 128, 1024),
    pos_encoding_modes: Sequence[str] = ("NONE",),
    num_pages: int = 16,
    pages_per_seq: Optional[int] = None,
    workspace_bytes: int = 128 << 20,
    progress: bool = True,
) -> dict:
    """Compile and load every kernel that calls of one serving configuration launch, ahead of serving.

    A kernel compiles the first time a call needs it (seconds each), and a CUDA-graph capture that
    meets an unloaded kernel must load a module inside the capture (drivers before CUDA 12.3
    refuse that). ``warmup`` makes, on small made-up inputs, each call the configuration will make
    at each size given, twice (eagerly, with ``out`` and a workspace given, as a serving loop
    calls), so that later calls at these sizes, eager or captured, compile and load nothing.

    What picks a kernel: the dtypes, head counts, head dim, page size and layout, the workspace's
    size (it bounds the KV split), each call's host sizes (batch, ``max_seq_len``, prefill's
    ``max_q_len`` and query rows), the page tables' width, and of the cache only whether its page
    count is 1, a multiple of 16 or neither (Triton specialises integer arguments so; the warm-up allocates the fewest
    pages of the same kind). Sizes between the ones given may still pick a split count, and so a
    kernel, of their own: list the sizes the server uses (its CUDA-graph batch sizes, its
    ``max_seq_len`` bound).

    Parameters
    ----------
    functions : iterable of str, optional
        Any of ``"decode"`` (:func:`kvattn.xqa_batch_decode_with_kv_cache`), ``"xqa"``,
        ``"single_decode"``, ``"mla"`` (:func:`kvattn.xqa_batch_decode_with_kv_cache_mla`, bfloat16
        with ``dtype`` 16-bit), ``"prefill"``; all five when None.
    device : torch.device, optional
        The current CUDA device when None.
    dtype, kv_dtype : torch.dtype
        Query/output dtype and cache dtype (``kv_dtype`` None: ``dtype``; float8_e4m3fn for an fp8
        cache).
    num_qo_heads, num_kv_heads, head_dim, page_size : int
    kv_layout : {"NHD", "HND"}
    batch_sizes, seq_lens, q_lens : sequences of int
        Batch sizes, host bounds ``max_seq_len`` (prefill's ``max_kv_len``; single decode's
        lengths) and prefill's ``max_q_len`` values the server will pass.
    pos_encoding_modes : sequence of str
        Single decode's modes.
    num_pages : int
        The serving cache's page count (only its kind matters, see above).
    pages_per_seq : int, optional
        The width of the server's page tables (their row stride is a kernel argument); None:
        each call's ``ceil(max_seq_len / page_size)``.
    workspace_bytes : int
        The serving workspace's size.
    progress : bool
        A progress bar on stderr, and the time each function took.

    Returns
    -------
    dict
        ``{function: {"calls": int, "seconds": float}}`` and ``"total_seconds"``.

    Examples
    --------
    >>> import torch, kvattn
    >>> if torch.cuda.is_available():  # doctest: +SKIP
    ...     report = kvattn.warmup(["decode"], batch_sizes=[1, 8], seq_lens=[4096], progress=False)
    ...     print(sorted(report))
    ['decode', 'total_seconds']
    """
    names = tuple(FUNCTIONS if functions is None else functions)
    for name in names:
        if name not in FUNCTIONS:
            raise ValueError(f"functions: expected names in {FUNCTIONS}, got {name!r}")
    if device is None:
        if not torch.cuda.is_available():
            raise RuntimeError("warmup: no CUDA device (pass device= to warm up elsewhere)")
        device = torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    for label, values in (("batch_sizes", batch_sizes), ("seq_lens", seq_lens), ("q_lens", q_lens)):
        if not values or any(type(v) is not int or v < 1 for v in values):
            raise ValueError(f"{label}: expected a non-empty sequence of ints >= 1, got {values!r}")
    ws = torch.zeros(workspace_bytes, dtype=torch.uint8, device=device)
    plan = []
    for name in names:
        plan += [(name, label, call) for label, call in _calls(
            name, device=device, dtype=dtype, kv_dtype=kv_dtype if name != "mla" else None, hq=num_qo_heads,
            hkv=num_kv_heads, d=head_dim, page=page_size, layout=kv_layout, batch_sizes=tuple(batch_sizes),
            seq_lens=tuple(seq_lens), q_lens=tuple(q_lens), num_pages=num_pages, width=pages_per_seq or 0, ws=ws,
            modes=tuple(pos_encoding_modes))]
    bar = Progress(len(plan), "kvattn warmup", quiet=not progress)
    report: dict = {name: {"calls": 0, "seconds": 0.0} for name in names}
    start = time.perf_counter()
    for name, label, call in plan:
        bar.step(label)
        t0 = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        report[name]["calls"] += 1
        report[name]["seconds"] += time.perf_counter() - t0
    bar.done()
    report["total_seconds"] = time.perf_counter() - start
    if progress:
        parts = ", ".join(f"{n} {report[n]['seconds']:.1f} s" for n in names)
        sys.stderr.write(f"kvattn warmup: {report['total_seconds']:.1f} s ({parts})\n")
    return report
