"""The benchmark shape registry: every shape of the grid (``docs/benchmarking.md``), as data.

One :class:`Shape` per timed configuration. ``GRID`` is the GPU grid, ``SMOKE`` a handful of tiny
shapes for checking the harness on a CPU. ``select`` filters either by suite, ``--quick`` flag and a
substring of the shape id.

>>> from benchmarks.shapes import GRID, select
>>> len(select(GRID, suites=["decode"])) > 20
True
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field

SUITES = ("decode", "spec_decode", "single_decode", "prefill", "mla")

# Ragged decode: 128 requests, lengths uniform in [1, 8192], from a fixed seed (same every run).
RAGGED_BATCH = 128
RAGGED_MAX_LEN = 8192
RAGGED_SEED = 20261122

# A mixed prefill step, (new query rows, KV length including them) per request, as an engine with
# chunked prefill and prefix caching schedules under a token budget of about 8k rows: two fresh
# prompts, chunks of long prompts over their cached part, a prefix-cache hit, a short prompt, and a
# few requests with tens of rows or fewer over long caches. 7981 query rows, 49124 keys, 29.0 M
# causal (query, key) pairs: 4.75e11 FLOPs at Hq 32, D 128 (about 1 ms at 500 TFLOP/s, the other
# prefill rows' size). KV lengths mostly off the 64-token page and the 128-row tile; those with more
# keys than rows are multiples of 8, so the cuDNN peer's explicit masks have 16-byte rows
# (benchmarks/peers_sdpa.py).
MIXED_PREFILL = (
    (4000, 4000),  # fresh prompt
    (2000, 2000),  # fresh prompt
    (1024, 9000),  # a 1024-row chunk of a long prompt, 7976 tokens already cached
    (512, 16384),  # a 512-row chunk over a 15872-token cache
    (300, 6440),  # a prefix-cache hit: 6140 cached tokens, 300 new
    (100, 100),  # a short prompt
    (37, 3000),  # the last rows of a chunked prompt
    (8, 8200),  # a few rows over a long cache (a draft verification, a tiny chunk)
)


@dataclass(frozen=True)
class Shape:
    """One benchmark configuration.

    ``kv_len`` is each request's KV length (``seq_lens``, which includes the new tokens); for a
    ragged shape it is the upper bound and :meth:`seq_lens` draws the actual lengths. ``q_len`` is
    the number of query tokens per request (decode 1, speculative decode 2..8, prefill the new
    tokens). ``reqs`` (prefill only) lists explicit per-request ``(q_len, kv_len)`` pairs for a
    mixed batch; ``batch``, ``q_len`` and ``kv_len`` must then be their count and maxima (build one
    with :func:`mixed_prefill`). ``peers`` says whether the peers (SDPA, FlexAttention) are timed
    on this shape: they do not depend on kvattn's page size or layout choices, so the grid times
    them once per workload to keep the full run short. ``quick`` marks the ``--quick`` subset.
    """

    suite: str
    batch: int
    kv_len: int
    q_len: int = 1
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    layout: str = "NHD"
    kv_dtype: str = "bfloat16"  # "bfloat16", "fp8" or "nvfp4" (decode)
    q_dtype: str = "bfloat16"  # "bfloat16" or "fp8" (prefill / MLA only)
    ragged: bool = False
    pos_encoding_mode: str = "NONE"  # single decode: "NONE" or "ROPE_LLAMA"
    causal: bool = True  # prefill: False is bidirectional (FlashInfer 0.7.2.post1's causal=False)
    ragged_drafts: bool = False  # spec_decode: request b brings q_len - b % q_len drafts (q_cu_seq_lens)
    peers: bool = True
    quick: bool = False
    tags: tuple[str, ...] = field(default_factory=tuple)
    reqs: tuple[tuple[int, int], ...] = ()
    # A ragged shape's length draw: "uniform" in [max(1, q_len), kv_len], or "lognormal" with median
    # len_median and shape len_sigma, clipped to that range; each from its own seeded generator.
    len_dist: str = "uniform"
    len_seed: int = RAGGED_SEED
    len_median: int = 0
    len_sigma: float = 0.0
    label: str = ""  # a prefix of the id (the sweep numbers its rows)

    def __post_init__(self):
        if self.len_dist not in ("uniform", "lognormal"):
            raise ValueError(f"len_dist: expected 'uniform' or 'lognormal', got {self.len_dist!r}")
        if self.len_dist == "lognormal" and not (self.ragged and self.len_median >= 1 and self.len_sigma > 0):
            raise ValueError(f"len_dist='lognormal' needs ragged=True, len_median >= 1 and len_sigma > 0; got "
                             f"ragged={self.ragged}, len_median={self.len_median}, len_sigma={self.len_sigma}")
        if not self.reqs:
            return
        if self.suite != "prefill" or self.ragged:
            raise ValueError(f"reqs: per-request (q_len, kv_len) pairs are for prefill shapes without ragged=True; "
                             f"got suite {self.suite!r}, ragged={self.ragged}")
        bad = [p for p in self.reqs if len(p) != 2 or not (1 <= p[0] <= p[1])]
        if bad:
            raise ValueError(f"reqs: each pair must be (q_len, kv_len) with 1 <= q_len <= kv_len; got {bad}")
        want = (len(self.reqs), max(q for q, _ in self.reqs), max(n for _, n in self.reqs))
        if (self.batch, self.q_len, self.kv_len) != want:
            raise ValueError(f"reqs: batch, q_len, kv_len must be the pairs' count and maxima {want}; "
                             f"got {(self.batch, self.q_len, self.kv_len)}")

    def seq_lens(self) -> list[int]:
        """KV length of each request (seeded draws for a ragged shape, at least ``q_len`` each)."""
        if self.reqs:
            return [n for _, n in self.reqs]
        if not self.ragged:
            return [self.kv_len] * self.batch
        rng = random.Random(self.len_seed)
        lo = min(max(1, self.q_len), self.kv_len)
        if self.len_dist == "lognormal":
            mu = math.log(self.len_median)
            return [min(self.kv_len, max(lo, round(rng.lognormvariate(mu, self.len_sigma))))
                    for _ in range(self.batch)]
        return [rng.randint(lo, self.kv_len) for _ in range(self.batch)]

    def _lens_text(self) -> str:
        """``BxL``, or a ragged batch's count, range and distribution."""
        if not self.ragged:
            return f"{self.batch}x{self.kv_len}"
        lo = min(max(1, self.q_len), self.kv_len)
        if self.len_dist == "lognormal":
            return f"lognormal{self.batch}x[{lo},{self.kv_len}]~{self.len_median}"
        return f"ragged{self.batch}x[{lo},{self.kv_len}]"

    def q_lens(self) -> list[int]:
        """Query rows of each request (``q_len`` each unless ``reqs`` lists them, or ragged drafts:
        ``q_len``, ``q_len - 1``, .., 1, again, the maximum ``q_len``)."""
        if self.reqs:
            return [q for q, _ in self.reqs]
        if self.ragged_drafts:
            return [self.q_len - b % self.q_len for b in range(self.batch)]
        return [self.q_len] * self.batch

    @property
    def group(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def id(self) -> str:
        """A compact unique name, also what ``--filter`` matches."""
        return (self.label + " " if self.label else "") + self._base_id()

    def _base_id(self) -> str:
        kv = {"fp8": "fp8", "nvfp4": "nvfp4"}.get(self.kv_dtype, "bf16")
        heads = "" if (self.num_qo_heads, self.num_kv_heads) == (32, 8) else f" h{self.num_qo_heads}/{self.num_kv_heads}"
        if self.suite != "mla" and self.head_dim != 128:
            heads += f" D{self.head_dim}"
        if self.suite == "decode":
            return f"decode {kv} {self._lens_text()} p{self.page_size} {self.layout}{heads}"
        if self.suite == "spec_decode":
            q = f"q{self.q_len}" + (" ragged-drafts" if self.ragged_drafts else "")
            return f"spec_decode {q} {kv} {self._lens_text()} p{self.page_size} {self.layout}{heads}"
        if self.suite == "single_decode":
            return f"single_decode {kv} h{self.num_qo_heads}/{self.num_kv_heads} L{self.kv_len} {self.pos_encoding_mode}"
        if self.suite == "prefill":
            q = "fp8q " if self.q_dtype == "fp8" else ""
            if self.reqs:  # the pairs are in the JSON record; the id names the batch by its totals
                lens = f"mixed{self.batch} q{sum(self.q_lens())}/kv{sum(self.seq_lens())}"
            else:
                lens = f"{self.batch}x{self.q_len}x{self.kv_len}"
            bidir = "" if self.causal else " bidirectional"
            return f"prefill {q}{kv} {lens} p{self.page_size} {self.layout}{heads}{bidir}"
        if self.suite == "mla":
            q = f" q{self.q_len}" if self.q_len > 1 else ""  # (multi-token prediction)
            return f"mla {kv} Hq{self.num_qo_heads}{q} {self._lens_text()} p{self.page_size}"
        raise ValueError(f"unknown suite {self.suite!r}")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["id"] = self.id
        d["tags"] = list(self.tags)
        d["reqs"] = [list(p) for p in self.reqs]
        if self.reqs:
            d["q_lens_sum"] = sum(self.q_lens())
            d["seq_lens_sum"] = sum(self.seq_lens())
        if self.ragged:
            lens = self.seq_lens()
            d["ragged_seed"] = self.len_seed
            d["seq_lens_sum"] = sum(lens)
            d["seq_lens_max"] = max(lens)
            d["seq_lens"] = lens  # the draw itself, so a later run or a reader needs no generator
        return d


def mixed_prefill(reqs, **kw) -> Shape:
    """A prefill :class:`Shape` of explicit ``(q_len, kv_len)`` pairs (batch and maxima filled in)."""
    reqs = tuple((int(q), int(n)) for q, n in reqs)
    if not reqs:
        raise ValueError("reqs: at least one (q_len, kv_len) pair is needed")
    return Shape("prefill", len(reqs), max(n for _, n in reqs), q_len=max(q for q, _ in reqs), reqs=reqs, **kw)


def _decode_grid() -> list[Shape]:
    shapes: list[Shape] = []
    pairs = [(1, 32768), (16, 4096), (64, 8192), (128, 2048), (256, 1024)]
    quick_pairs = {(1, 32768), (64, 8192), (256, 1024)}
    for page_size, layout in ((16, "NHD"), (16, "HND"), (64, "NHD"), (64, "HND")):
        # Peers once per workload, on 64-token NHD pages: SDPA does not care, and paged flex reads
        # whole pages per KV block (16-token pages would cap its tile at 16 rows).
        peers = (page_size, layout) == (64, "NHD")
        for b, n in pairs:
            quick = peers and (b, n) in quick_pairs
            shapes.append(Shape("decode", b, n, page_size=page_size, layout=layout, peers=peers, quick=quick))
        shapes.append(Shape("decode", RAGGED_BATCH, RAGGED_MAX_LEN, page_size=page_size, layout=layout,
                            ragged=True, peers=peers))
    # An engine's ragged step (issue 40's row): 64 requests with lengths uniform in [1, 12000] on pages
    # of 16, bf16 and fp8.
    for kv in ("bfloat16", "fp8"):
        shapes.append(Shape("decode", 64, 12000, page_size=16, ragged=True, kv_dtype=kv, peers=False))
    for b, n in ((64, 8192), (256, 1024)):
        shapes.append(Shape("decode", b, n, kv_dtype="fp8", quick=(b == 64)))
    # NVFP4 KV (not in the first grid, a target since; docs/benchmarking.md. No peer reads it: SDPA on
    # the uint8 pools crashed the process): bytes include the block scales.
    shapes.append(Shape("decode", 64, 8192, kv_dtype="nvfp4", peers=False))
    # Llama-3-70B heads per GPU (tensor parallel 8): 8 query heads, 1 KV head.
    shapes.append(Shape("decode", 64, 8192, num_qo_heads=8, num_kv_heads=1))
    return shapes


def _spec_grid() -> list[Shape]:
    # q_len 1 is the baseline of the "q_len 4 within 1.2x of q_len 1" target.
    shapes = [Shape("spec_decode", 64, 4096, q_len=q, quick=q in (1, 4)) for q in (1, 2, 4, 8)]
    # Ragged drafts (q_cu_seq_lens, FlashInfer 0.7.2.post1) beside the padded rows of the same maximum:
    # 4, 3, 2, 1 drafts a request (kvattn alone: the peers take padded batches).
    shapes += [Shape("spec_decode", 64, 4096, q_len=q, ragged_drafts=True, peers=False) for q in (4, 8)]
    return shapes


def _single_grid() -> list[Shape]:
    return [
        Shape("single_decode", 1, n, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode=mode,
              quick=(n == 32768 and mode == "NONE"))
        for n in (4096, 32768, 131072)
        for mode in ("NONE", "ROPE_LLAMA")
    ]


def _prefill_grid() -> list[Shape]:
    shapes = [
        Shape("prefill", b, lk, q_len=lq, page_size=64, layout="HND", quick=(b == 1))
        for b, lq, lk in ((1, 8192, 8192), (4, 2048, 2048), (16, 512, 4096), (8, 1024, 8192))
    ]
    shapes.append(Shape("prefill", 1, 8192, q_len=8192, page_size=64, layout="HND", kv_dtype="fp8", q_dtype="fp8"))
    # A bfloat16 query over a quantised cache (chunked prefill on an fp8 / NVFP4 cache; not in the
    # first grid, a target since, docs/benchmarking.md; no peer reads these caches): the tiles
    # convert to float16 operands.
    for kv in ("fp8", "nvfp4"):
        shapes.append(Shape("prefill", 1, 8192, q_len=8192, page_size=64, layout="HND", kv_dtype=kv, peers=False))
    # Pages of 16 tokens (vLLM's default block size; the target: within 5 % of page 64): kvattn
    # alone (the peers were timed on the same workloads at page 64).
    for b, lq, lk in ((1, 8192, 8192), (4, 2048, 2048)):
        shapes.append(Shape("prefill", b, lk, q_len=lq, page_size=16, layout="HND", peers=False))
    # A chunked-prefill step (512 new rows a request over a 16384-token cache, the rows' keys mostly
    # cached) and a mixed step (MIXED_PREFILL), with the peers on gathered K/V: query rows fewer than
    # keys, causal aligned to the last key (peers_sdpa.py says how each SDPA backend is given that).
    shapes.append(Shape("prefill", 4, 16384, q_len=512, page_size=64, layout="HND"))
    shapes.append(mixed_prefill(MIXED_PREFILL, page_size=64, layout="HND"))
    # causal=False (FlashInfer 0.7.2.post1) beside causal rows of the same shapes (kvattn alone):
    # every row sees all its request's keys (twice the work of a square causal shape).
    shapes.append(Shape("prefill", 4, 2048, q_len=2048, page_size=64, layout="HND", causal=False, peers=False))
    shapes.append(Shape("prefill", 4, 16384, q_len=512, page_size=64, layout="HND", causal=False, peers=False))
    return shapes


def _mla_grid() -> list[Shape]:
    shapes = []
    for heads in (128, 64, 16):
        # Hq 64: DeepSeek's 128 heads over two GPUs, or 64 heads a token (one 64-head program, where
        # 128 heads are two); bf16 only, no peers (keeps the full run's length).
        for dtype in ("bfloat16", "fp8") if heads != 64 else ("bfloat16",):
            # (64 x 16384 at 16 heads: issue 41's second copy-limit row)
            for b, n in ((64, 4096), (128, 8192), (32, 16384)) + (((64, 16384),) if heads == 16 else ()):
                quick = dtype == "bfloat16" and (heads, b) in ((128, 64), (16, 128))
                # Peers on bf16 only: they have no fp8 MLA path (they would run on upcast copies).
                shapes.append(Shape("mla", b, n, num_qo_heads=heads, num_kv_heads=1, head_dim=576, page_size=64,
                                    kv_dtype=dtype, q_dtype=dtype, peers=dtype == "bfloat16" and heads != 64,
                                    quick=quick))
    # Hq 32 (DeepSeek's 128 heads over four GPUs): half a 64-head program, bf16, one shape.
    shapes.append(Shape("mla", 64, 4096, num_qo_heads=32, num_kv_heads=1, head_dim=576, page_size=64,
                        kv_dtype="bfloat16", q_dtype="bfloat16", peers=False))
    # Multi-token prediction (issue 41's targets: 16 heads x Q = 2 within 1.10x of Q = 1 on the same
    # lengths, Q = 4 within 1.25x): the Q = 1 baselines are the 16-head rows above.
    for dtype in ("bfloat16", "fp8"):
        for q_len in (2, 4):
            shapes.append(Shape("mla", 128, 8192, q_len=q_len, num_qo_heads=16, num_kv_heads=1, head_dim=576,
                                page_size=64, kv_dtype=dtype, q_dtype=dtype, peers=False,
                                quick=dtype == "bfloat16" and q_len == 4))
    return shapes


GRID: list[Shape] = _decode_grid() + _spec_grid() + _single_grid() + _prefill_grid() + _mla_grid()

# Tiny shapes for a CPU smoke test of the harness (reference backend, simple timer).
SMOKE: list[Shape] = [
    Shape("decode", 2, 64, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, layout="NHD"),
    Shape("decode", 2, 64, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, layout="HND"),
    Shape("decode", 3, 80, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, ragged=True),
    Shape("decode", 2, 64, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, kv_dtype="fp8"),
    Shape("spec_decode", 2, 64, q_len=2, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16),
    Shape("spec_decode", 3, 64, q_len=3, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16,
          ragged_drafts=True, peers=False),
    Shape("single_decode", 1, 128, num_qo_heads=4, num_kv_heads=4, head_dim=64),
    Shape("single_decode", 1, 128, num_qo_heads=4, num_kv_heads=4, head_dim=64, pos_encoding_mode="ROPE_LLAMA"),
    Shape("prefill", 2, 64, q_len=32, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, layout="HND"),
    Shape("prefill", 1, 64, q_len=64, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, layout="HND",
          kv_dtype="fp8", q_dtype="fp8"),
    Shape("prefill", 2, 64, q_len=32, num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, layout="HND",
          causal=False, peers=False),
    mixed_prefill(((40, 40), (24, 88), (1, 50), (9, 33)), num_qo_heads=4, num_kv_heads=2, head_dim=64,
                  page_size=16, layout="HND"),
    Shape("mla", 2, 64, num_qo_heads=16, num_kv_heads=1, head_dim=576, page_size=16),
    Shape("mla", 2, 64, q_len=3, num_qo_heads=16, num_kv_heads=1, head_dim=576, page_size=16, peers=False),
]


def select(shapes: list[Shape], *, suites=None, quick: bool = False, filters=None) -> list[Shape]:
    """Shapes of the given suites, the ``--quick`` subset if asked, matching any filter substring."""
    suites = list(suites or SUITES)
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; expected some of {SUITES}")
    out = [s for s in shapes if s.suite in suites and (s.quick or not quick)]
    if filters:
        out = [s for s in out if any(f.lower() in s.id.lower() for f in filters)]
    return out
