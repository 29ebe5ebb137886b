"""The sweep suite: shapes drawn with a fixed seed from what serving engines send (``--suite sweep``).

The grid (``shapes.py``) times a few hand-picked workloads; the sweep draws many from the mix an
engine's decode step sees, so a kernel tuned on the grid cannot win it by accident:

- paged decode (:data:`LAYOUTS`: the query / KV heads and head dim of popular models per GPU),
  pages of 16, 32 or 64 tokens, NHD or HND, bf16 / fp8 (e4m3) / NVFP4 caches, batches of 1-256
  (log-uniform), every request the same length, lengths uniform in ``[q_len, max]`` or heavy-tailed
  (log-normal, clipped to ``[q_len, max]``), the longest up to 128k tokens; a quarter of the bf16
  rows are speculative (2-4 query tokens a request);
- DeepSeek MLA decode: 16 / 32 / 64 / 128 heads (DeepSeek-V3 over 8 / 4 / 2 / 1 GPUs), lengths up
  to 1k-64k, ragged, batches of 4-128, pages of 16-64, bf16 and fp8 latent caches.

Each ragged row has its own length seed (``len_seed``), so a row's lengths do not change when rows
are added; the draw is recorded in the results (``Shape.as_dict``). A row whose bytes would exceed
:data:`MAX_BYTES` keeps its length distribution and loses requests (then length), so the whole sweep
(kvattn and the FlashInfer peers, CUDA-graph replays only) stays within a few minutes on an H200.

Two limits keep FlashInfer's just-in-time compilation small (``peers_flashinfer.py`` lists the
variants): fp8 rows are drawn from the head-dim-128 layouts with 4 or 8 query heads per KV head
(FlashInfer's XQA compiles one module per page size, head dim and group), and speculative rows use
bf16 caches.

>>> from benchmarks.sweep import SWEEP
>>> len(SWEEP) >= 60
True
"""

from __future__ import annotations

import math
import random

from .metrics import work
from .shapes import Shape

SWEEP_SEED = 20261129
N_DECODE = 64
N_MLA = 16
MAX_BYTES = 5 << 29  # 2.5 GiB: a 64 x 8192 bf16 batch at 32/8 heads is 2.1 GB
# (query heads, KV heads, head dim): Llama-3-8B, Llama-3-70B over 8 GPUs, Qwen2-72B-like over 4,
# Llama-3-405B over 2 (64/8), an MHA model (32/32), Gemma-2 at D 256, a small-head model at D 64.
LAYOUTS = ((32, 8, 128), (8, 1, 128), (16, 2, 128), (64, 8, 128), (32, 32, 128), (16, 8, 256), (16, 8, 64))
FP8_LAYOUTS = tuple(x for x in LAYOUTS if x[2] == 128 and x[0] // x[1] in (4, 8))
PAGES = (16, 32, 64)
KV_DTYPES = (("bfloat16", 0.5), ("fp8", 0.35), ("nvfp4", 0.15))
MLA_HEADS = (16, 32, 64, 128)
MAX_BATCH = 256
MAX_LEN = 131072
MLA_BATCHES = (4, 128)  # a DeepSeek decode step per GPU: a few to a hundred-odd requests
MLA_LENS = (1024, 65536)


def _log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))


def _weighted(rng: random.Random, items):
    return rng.choices([x for x, _ in items], weights=[w for _, w in items])[0]


def _lengths(rng: random.Random, max_len: int) -> dict:
    """One row's length distribution: equal lengths, uniform or log-normal (a heavy tail)."""
    kind = rng.choices(("equal", "uniform", "lognormal"), weights=(0.3, 0.3, 0.4))[0]
    if kind == "equal":
        return dict(ragged=False)
    if kind == "uniform":
        return dict(ragged=True, len_dist="uniform")
    # Median 4-32x below the longest request; sigma 0.8-1.6 (a few requests near the maximum).
    median = max(1, round(max_len / 2 ** rng.uniform(2, 5)))
    return dict(ragged=True, len_dist="lognormal", len_median=median, len_sigma=round(rng.uniform(0.8, 1.6), 2))


def _fit(shape: Shape, max_bytes: float) -> Shape:
    """Fewer requests (then shorter ones) until the shape's bytes fit ``max_bytes``."""
    from dataclasses import replace

    while work(shape).bytes > max_bytes and shape.batch > 1:
        shape = replace(shape, batch=max(1, math.floor(shape.batch * 0.8)))
    while work(shape).bytes > max_bytes and shape.kv_len > 1024:
        n = max(1024, math.floor(shape.kv_len * 0.8))
        med = min(shape.len_median, n) if shape.len_median else 0
        shape = replace(shape, kv_len=n, len_median=med)
    return shape


def draw(n_decode: int = N_DECODE, n_mla: int = N_MLA, *, seed: int = SWEEP_SEED, max_bytes: float = MAX_BYTES,
         max_batch: int = MAX_BATCH, max_len: int = MAX_LEN, mla_batches: tuple[int, int] = MLA_BATCHES,
         mla_lens: tuple[int, int] = MLA_LENS) -> list[Shape]:
    """The sweep's shapes: ``n_decode`` paged decode rows then ``n_mla`` MLA rows, the same every call
    with the same arguments (the CPU smoke run draws a small version with tiny limits)."""
    rng = random.Random(seed)
    out: list[Shape] = []
    for i in range(n_decode):
        kv = _weighted(rng, KV_DTYPES)
        hq, hkv, d = rng.choice(FP8_LAYOUTS if kv == "fp8" else LAYOUTS)
        page = rng.choice(PAGES)
        layout = rng.choice(("NHD", "HND"))
        batch = _log_uniform_int(rng, 1, max_batch)
        n = _log_uniform_int(rng, min(1024, max_len), max_len)
        q_len = rng.randint(2, 4) if kv == "bfloat16" and rng.random() < 0.25 else 1
        lens = _lengths(rng, n)
        shape = Shape("spec_decode" if q_len > 1 else "decode", batch, n, q_len=q_len, num_qo_heads=hq,
                      num_kv_heads=hkv, head_dim=d, page_size=page, layout=layout, kv_dtype=kv, peers=False,
                      len_seed=seed + 1 + i, label=f"sw{i:02d}", tags=("sweep",), **lens)
        out.append(_fit(shape, max_bytes))
    for j in range(n_mla):
        i = n_decode + j
        kv = rng.choice(("bfloat16", "fp8"))
        heads = rng.choice(MLA_HEADS)
        page = rng.choice(PAGES)
        batch = _log_uniform_int(rng, *mla_batches)
        n = _log_uniform_int(rng, mla_lens[0], mla_lens[1])
        lens = _lengths(rng, n)
        lens.setdefault("ragged", True)
        if not lens["ragged"]:  # MLA rows are all ragged (an engine's batch); equal draws become uniform
            lens = dict(ragged=True, len_dist="uniform")
        shape = Shape("mla", batch, n, num_qo_heads=heads, num_kv_heads=1, head_dim=576, page_size=page,
                      kv_dtype=kv, q_dtype=kv, peers=False, len_seed=seed + 1 + i, label=f"sw{i:02d}",
                      tags=("sweep",), **lens)
        out.append(_fit(shape, max_bytes))
    return out


SWEEP: list[Shape] = draw()
# A tiny draw for the CPU smoke run of ``--suite sweep`` (the harness, not a measurement).
SMOKE_SWEEP: list[Shape] = draw(6, 2, seed=SWEEP_SEED, max_bytes=1 << 20, max_batch=3, max_len=96,
                                mla_batches=(1, 2), mla_lens=(32, 96))


def filter_parts(args) -> list[str]:
    """``--filter`` arguments as the substrings a row's id is matched by: each argument whole
    (ragged ids hold commas: ``[1,88289]``) and each of its comma-separated parts."""
    return [f for arg in args for f in {arg, *arg.split(",")} if f]


def decode_rows() -> list[Shape]:
    """The sweep's paged decode rows (decode and speculative decode)."""
    return [s for s in SWEEP if s.suite in ("decode", "spec_decode")]


def select(shapes: list[Shape], filters=None) -> list[Shape]:
    """The sweep rows whose id contains any filter substring (all without filters)."""
    if not filters:
        return list(shapes)
    return [s for s in shapes if any(f.lower() in s.id.lower() for f in filters)]
