"""Launch configurations of the MLA decode kernel, one table per GPU family.

No runtime autotuning (a tuning pass would stall a serving engine's first calls and cannot run
inside CUDA-graph capture). The sm90 entries come from local sm_90a compiles (registers, spills,
shared memory, wgmma vs mma.sync: the comments at the table) and, where marked, from H100 runs of
``benchmarks/tune_mla.py`` (CUDA-graph replay, L2 flushed); ``override`` is the hook for a tuning
pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from ..._formats_table import BY_NAME
from ...runtime.common import next_power_of_2
from ...runtime.plans import config_override

MAX_BLOCK_H = 64  # [64, 512] float32 accumulator: 128 registers a thread at 8 warps
MIN_BLOCK_H = 16  # tl.dot's smallest M


@dataclass(frozen=True)
class MLAConfig:
    block_h: int  # query heads per program (the M dim of both products)
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the row loads
    programs_per_sm: int  # resident programs an SM holds (shared memory / registers of the compile)
    waves: int = 1  # the split count fills this many whole waves of resident programs
    min_chunk: int = 256  # fewest keys worth a split of their own
    min_split_span: int = 0  # a launch whose longest request holds at most this many keys keeps one split
    max_splits: int = 64
    qk_fp8: bool = False  # scores on fp8 tensor cores (fp8 query and cache, on wgmma)
    heads_as_n: bool = False  # keys in the M dim of both products (S^T = K Q^T, O^T = V^T P^T), heads in N
    split_scores: bool = False  # score products unchained (layout fences): each warpgroup computes half of N
    invariant_span: int = 1024  # keys a split in batch-invariant mode (ops/common/splits.py)


# (format, BLOCK_H) -> (BLOCK_N, num_warps, num_stages, programs per SM). "half" = 16-bit cache,
# "fp8" = fp8 cache (float16 operands), "fp8qk" = fp8 query and fp8 cache (fp8 scores on wgmma).
# Local sm_90a compiles (Triton 3.6, registers / shared memory / spills):
#   half 64: (32, 8, 3) 249 regs, 180 KB, wgmma, no spill. H100 (graph us, 64x4096 / 128x8192 /
#            32x16384): (32, 8, 2) 433 / 1660 / 867 = 0.26 of the matmul rate; (32, 8, 3) 365 /
#            1403 / 716 = 0.31 (best measured); (16, 8, 3|4) 586 / 2305 / 1147. BLOCK_N 64 spills
#            (255 + 24 B stack). Two warpgroups each compute the whole [64, N] score tile
#            (Triton gives a chained dot's M = 64 to all 8 warps) and every wgmma is waited for
#            before the next, which is what keeps it far from 0.75: see mla/kernels.py.
#   half 32: (64, 8, 3) 182 regs, 184 KB, mma.sync (M < 64: no wgmma), no spill.
#   half 16: (64, 8, 3) 144 regs, 164 KB, mma.sync, no spill; 4 warps hold the query operand in
#            every warp (255 regs + spills), so 8 warps split the 512 output columns finer.
#            H100: 124 / 416 / 223 us = 0.81 / 0.96 / 0.89 of copy bandwidth (best of the variants).
#   fp8qk 64: (32, 8, 3) 242 regs, 128 KB (the epilogue's [64, 512] float32 layout change; the
#            loop's buffers are smaller), no spill: 36 m64n16k32 e4m3 score wgmmas + 2 m64n256k16
#            float16 P.V wgmmas a tile, the byte tile cp.async double-buffered, converted once
#            (40 F2FP a thread a tile, no LDS.U8); 680 SASS instructions a 32-key tile vs 920 for
#            half 64. (32, 8, 4) 242 regs, 3 buffers; (64, 8, 3) 255 regs, 176 KB, no spill;
#            (64, 8, 2) spills 8 B; (16, 8, 4) 243 regs but 525 instructions a 16-key tile.
#            H100 (graph us, 64x4096 / 128x8192 / 32x16384): (32, 8, 3) 281 / 1089 / 596;
#            (32, 8, 4) 279 / 1068 / 596; (64, 8, 3) 220 / 842 / 409 = 332-357 TFLOP/s (taken);
#            the float16-operand path at BLOCK_H 32 724 / 2883 / 1446.
#   fp8 32 / 16 (bf16 query, or Hq <= 32): (64, 8, 3) 182 / 166 regs, no spill, mma.sync. The
#            words are cp.async-pipelined, but Triton converts each tile twice (once straight
#            into the transposed score operand through 80 LDS.64 + ~290 register moves, once into
#            a float16 shared tile for P.V): 136 F2FP and 1047 SASS instructions a 64-key tile
#            against 888 for half 16 with half the bytes, so with one program an SM the fp8 tile
#            is latency-bound (H100 Hq 16: 157 / 559 / 291 us, slower than bf16). Forcing one
#            conversion (an opaque identity after it) halves the F2FP but adds as many moves and
#            218+ KB of shared memory; the byte path (KV_FP8) is not pipelined (3 LDGSTS, 128
#            LDS.U8 a tile); fp8 mma.sync operands are upcast to float16 by Triton on sm_90.
#   fp8 64:  (32, 8, 2) spills ~330 B (the conversion on top of the accumulator): reachable by an
#            override only; the cap keeps fp8 (float16 operands) at BLOCK_H 32.
#   fp8qk 16, heads in N (S^T = K Q^T: the keys fill wgmma's M, no padded heads): (64, 8, 3) 176
#            regs, 87 KB, no spill: 36 m64n8k32 e4m3 score + 16 m64n16k16 float16 P.V wgmmas a tile,
#            but the transposed P.V operand is gathered byte by byte (128 LDS.U8 a thread a tile).
#            H100 Hq 16 (graph us, 64x4096 / 128x8192 / 32x16384): 107 / 370 / 199 against 115 / 431
#            / 214 at BLOCK_H 64; (64, 8, 4) 107 / 372 / 195; (64, 8, 2) 132 / 439 / 246. The same
#            with the P.V tile loaded a second time as words (no LDS.U8, 182 regs, 179 KB at 2
#            stages): 147 / 528 / 274, slower. 16-bit caches with heads in N ((64, 4|8, 2)): 162-173
#            / 446-559 / 304-325, slower than mma.sync at BLOCK_H 16: not taken.
# Split score products ("split": SPLIT_SCORES, layout fences; lab/notes/mla.md "MLA: the score tile split between the
# warpgroups (Triton)"; H100 graph us,
# 64x4096 / 128x8192 / 32x16384, Hq 128 unless stated; local compiles in benchmarks/tune_mla.py):
#   half 64: (32, 8, 3) 362-369 / 1429 / 717 -> split (32, 8, 3) 350 / 1328, (32, 8, 4) 344 / 1329,
#            (32, 8, 2) 416 / 1584, **(64, 8, 2) 277-279 / 1047 / 559** (255 regs + 8 B stack, 224 KB;
#            the unsplit 64-key tile spilled); heads in N split (64, 8, 2) 285 / 1085; 16 warps
#            (64, 16, 2) 406 / - / 698, (32, 16, 3) 414 / - / 825. Taken: (64, 8, 2) split.
#   fp8qk 64: (64, 8, 3) 220-221 / 851 / 415 -> split (64, 8, 3) **201-203 / 764 / 397**, (64, 8, 4)
#            203 / 768, (64, 8, 2) 233-237 / 869, (32, 8, 3) 269 / 1032; 16 warps 264-349. Taken.
#   fp8qk 16 heads in N (Hq 16): 107 / 370 / 200 -> split **87.5 / 294 / 156**. Taken.
# On sm90 the ("half", 64) entry's launches over pages of 16, 32 or 64+ tokens run mla/kernels_gluon.py's
# kernel instead
# (mla/plan.py _gluon_fits: it keeps BLOCK_N 64, 8 warps and the split count this entry gives; H100 graph us
# 224 / 845 / 423 against 278 / 1052 / 560, lab/notes/mla.md "MLA: Gluon kernel with TMA row tiles").
# Overrides of BLOCK_N or the warps (tuning variants, tests) keep the Triton kernel. Where
# WARP_SPECIALIZED (below) names the entry, those launches run mla/kernels_gluon_ws.py's kernel.
_SM90 = {
    ("half", 64): (64, 8, 2, 1, "split"),
    ("half", 32): (64, 8, 3, 1),
    ("half", 16): (64, 8, 3, 1),
    ("fp8qk", 64): (64, 8, 3, 1, "split"),
    ("fp8qk", 16): (64, 8, 3, 1, "heads_as_n", "split"),
    ("fp8", 64): (32, 8, 2, 1),
    ("fp8", 32): (64, 8, 3, 1),
    ("fp8", 16): (64, 8, 3, 1),
}
_BLOCK_H_CAP = {"sm90": {"half": 64, "fp8": 32, "fp8qk": 64}}
# Entries whose launches of mla/kernels_gluon.py's kernel run the warp-specialised kernel of
# mla/kernels_gluon_ws.py instead (a copy warp and two warpgroups splitting the score products of two
# tiles, lab/notes/mla.md "MLA: seesaw (warp-specialised Gluon kernel)"; same split counts);
# the environment switch KVATTN_GLUON_WS=0 keeps mla/kernels_gluon.py's kernel. H200 (matmul 669 TFLOP/s
# in the run), bf16 Hq 128, graph us 64x4096 / 128x8192 / 32x16384: kernels_gluon.py 229.8 / 918.7 /
# 412.2 -> kernels_gluon_ws.py 140.4 / 546.8 / 269.5 (0.78-0.81 of the matmul rate).
# ("fp8qk", 64): the fp8-score launches over pages of 16, 32 or 64+ tokens (mla/plan.py _ws_fp8_fits) run
# the same kernel's e4m3 form (lab/notes/mla.md "MLA: fp8 on the seesaw"); KVATTN_GLUON_WS=0
# keeps this table's Triton entry (mla/kernels_gluon.py has no fp8 form), as do BLOCK_H 16 (heads in N).
WARP_SPECIALIZED = {"sm90": frozenset({("half", 64), ("fp8qk", 64)})}
# fp8 scores exist at BLOCK_H 16 (heads in N) and 64 (heads in M, wgmma): Hq 17-32 takes 64 (rows
# past Hq padded and masked), so an fp8 query with an fp8 cache takes fp8 scores at any Hq. H100,
# Hq 16 fp8 (graph us, 64x4096 / 128x8192 / 32x16384): float16-operand path at BLOCK_H 16 154 / 567
# / 293; fp8 scores at BLOCK_H 64 (64, 8, 3) 116 / 431 / 211; (32, 8, 3) 162 / 553 / 311.
# Other GPUs: no fp8 scores (fp8qk falls back to fp8), two stages.
_DEFAULT = {key: (entry[0], entry[1], 2, 1) for key, entry in _SM90.items() if key[0] != "fp8qk"}
# Small tiles in the interpreter, so CI runs multi-tile loops over several pages.
_INTERPRETER = {(fmt, bh): (16, 4, 1, 1) for fmt in ("half", "fp8") for bh in (16, 32, 64)}
TABLES = {"sm90": _SM90, "default": _DEFAULT, "interpreter": _INTERPRETER}

_override: dict = {}


# ``with override(**fields):`` replaces config fields (``block_h`` too) for the block (tuning, tests).
override = config_override(_override, lambda: config.cache_clear())


def _fmt(kv_format: str, q_fp8: bool = False) -> str:
    """The tables' key: the cache format's ``config_key`` (:mod:`kvattn._formats_table`), or
    ``"fp8qk"`` for an fp8 query over an fp8 cache (fp8 scores)."""
    key = BY_NAME[kv_format].config_key
    return "fp8qk" if key == "fp8" and q_fp8 else key


# Fields that shape the split plan only (how many programs, how many keys each), not the kernel a
# launch compiles: an override of these alone keeps the launch's kernel (:func:`padded_heads`).
PLAN_FIELDS = frozenset({"waves", "min_chunk", "max_splits", "invariant_span", "min_split_span"})

# The split plan of launches the warp-specialised kernel runs (the plan applies it with
# :func:`seesaw_plan` once it knows the kernel). Its two warpgroups take a 64-key tile each, so a
# pair of tiles, 128 keys, is the piece it works in: a split of 128 keys keeps both busy, and on a
# small batch whose splits the span caps (``ceil(longest / min_chunk)`` splits, most SMs idle) a
# floor of 256 left the longest request's programs two pairs long where one would do. One-split
# launches stay one split up to 256 keys: halving a lone program's two pairs would cost a combine
# launch and the partials' round trip, about the pair it saves (lab/notes/mla-ragged.md "MLA: splits
# of one tile pair on the seesaw"). The Triton kernels keep 256 (their balanced form measured
# slower on such small rows; not re-planned here).
SEESAW_PLAN = {"sm90": dict(min_chunk=128, min_split_span=256)}


def seesaw_plan(arch: str, cfg: MLAConfig) -> MLAConfig:
    """``cfg`` with the warp-specialised kernel's split plan (:data:`SEESAW_PLAN`), for a launch that
    runs it. An :func:`override` of any split-plan field (:data:`PLAN_FIELDS`) stands in for this
    plan whole (the fields it leaves out keep the config's values): tests that force short splits
    get them, and ``--ab NAME:mla:min_chunk=256`` times the 256-key rule exactly."""
    if set(_override) & PLAN_FIELDS:
        return cfg
    fields = SEESAW_PLAN.get(arch, {})
    return replace(cfg, **fields) if fields else cfg


@functools.lru_cache(maxsize=None)
def config(arch: str, kv_format: str, num_heads: int, q_fp8: bool = False) -> MLAConfig:
    """The config of a launch: ``BLOCK_H`` = the head count rounded up to a power of 2 in
    ``[16, cap]`` (cap 64, or the table's own), or the table's next larger ``BLOCK_H`` for the
    format where it has no entry for that one; then the table's entry for it.

    An fp8 query with an fp8 cache takes the fp8-score entry (``qk_fp8``) where the table has one
    (sm90: BLOCK_H 16 with heads in N, 64 with heads in M); otherwise the float16-operand fp8 entry.
    """
    fmt = _fmt(kv_format, q_fp8)
    table = TABLES.get(arch, _DEFAULT)
    caps = _BLOCK_H_CAP.get(arch, {})

    def pick(fmt):
        want = min(max(MIN_BLOCK_H, next_power_of_2(num_heads)), caps.get(fmt, MAX_BLOCK_H))
        block_h = min((bh for f, bh in table if f == fmt and bh >= want), default=want)
        return _override.get("block_h", block_h)

    block_h = pick(fmt)
    if fmt == "fp8qk" and (fmt, block_h) not in table:
        fmt = "fp8"
        block_h = pick(fmt)
    block_n, warps, stages, per_sm, *flags = table[(fmt, block_h)]
    cfg = MLAConfig(block_h, block_n, warps, stages, per_sm, qk_fp8=fmt == "fp8qk", heads_as_n="heads_as_n" in flags,
                    split_scores="split" in flags)
    if _override:
        cfg = replace(cfg, **_override)
    return cfg


def padded_heads(arch: str, kv_format: str, num_heads: int, q_fp8: bool = False, *, sm_count: int = 0,
                 bandwidth: float = 0.0) -> MLAConfig | None:
    """The 64-head entry that a launch of fewer than 64 heads (rows) takes on sm90 where the
    warp-specialised kernel serves it (the launcher checks that), the rows past the heads padded.
    16-bit caches: H100, bf16 Hq 32, graph us 64x4096 / 128x8192 / 32x16384: BLOCK_H 32 (Triton)
    146.5 / 511.2 / 271.8 against 130.1 / 426.6 / 229.2, Hq 24 alike (lab/notes/mla.md "MLA: 17-32
    heads on the seesaw"). 16 heads and fewer kept the Triton kernel's 16-row programs while the
    H100's memory hid their products (0.81-0.96 of copy bandwidth); on the H200 that kernel reads
    0.745 of copy bandwidth at Hq 16, where the 64-head programs, products padded, overlap their
    copies as at Hq 32 (lab/notes/mla.md "MLA: 16 heads on the seesaw"). An fp8 query over an fp8
    cache at 16 heads or fewer (the heads-in-N entry) takes the kernel's e4m3 form only for programs
    of :data:`PADDED_MIN_KEYS` keys or more (the launcher's choice by span), and only on a GPU past
    :data:`PADDED_MIN_SM_GBPS` (``bandwidth`` bytes/s peak over ``sm_count`` SMs). None for other
    launches, and while an :func:`override` of a kernel field is in force (tuning and tests pick
    their own programs); an override of the split plan's fields only (:data:`PLAN_FIELDS`) keeps the padded
    programs, so ``benchmarks/run.py --ab`` can time a split rule on the kernel the table runs."""
    if arch != "sm90" or set(_override) - PLAN_FIELDS:
        return None
    cfg = config(arch, kv_format, num_heads, q_fp8)
    wide = config(arch, kv_format, 64, q_fp8)
    if not cfg.block_h < wide.block_h or not warp_specialized(arch, kv_format, wide.block_h, q_fp8):
        return None
    floor = PADDED_MIN_SM_GBPS.get(_fmt(kv_format, q_fp8))
    if floor is not None and not bandwidth > floor * 1e9 * sm_count:
        return None
    return wide


# Keys a program of a padded launch (:func:`padded_heads`) must hold for the padded programs to run
# it, by format; 0: every launch. fp8 scores at 16 heads, H200 graph us (table's heads-in-N kernel
# -> the warp-specialised e4m3 form with rows padded to 64): programs of 2048-8192 keys 87.5 -> 85.8
# (64x4096), 290 -> 260 (128x8192), 157 -> 145 (32x16384), 298 -> 275 (64x16384); programs of
# 684-824 keys 29.6 -> 33.6 (sw68), 26.7 -> 29.5 (sw67); 4-tile programs 21.6 -> 25.6 (sw79)
# (lab/notes/mla.md "MLA: fp8 at 16 heads on the seesaw, by span").
PADDED_MIN_KEYS = {"fp8qk": 1024}
# Formats whose padded programs were measured on the H200 only (:func:`padded_heads`): a GPU of at
# most this peak copy bandwidth an SM (GB/s; an H100, 25 GB/s an SM, or one whose bandwidth is
# unknown) keeps the unpadded programs it was measured on (fp8 scores at 16 heads: 87.5 / 294 / 156
# us on the H100).
PADDED_MIN_SM_GBPS = {"fp8qk": 32.0}


def padded_min_keys(kv_format: str, q_fp8: bool = False) -> int:
    """:data:`PADDED_MIN_KEYS` of a launch's format (0 where every launch takes the padded programs)."""
    return PADDED_MIN_KEYS.get(_fmt(kv_format, q_fp8), 0)


def warp_specialized(arch: str, kv_format: str, block_h: int, q_fp8: bool = False) -> bool:
    """Whether a launch the Gluon kernel serves takes the warp-specialised one (``WARP_SPECIALIZED``)."""
    return (_fmt(kv_format, q_fp8), block_h) in WARP_SPECIALIZED.get(arch, ())


# The balanced split of a ragged batch (mla/plan.py, common.balance.launch_unit): a request's units
# at most (the combine merges them in rounds of 16), and the batches a plan holds (the lengths are
# one [BLOCK_B] register vector in every split and combine program).
MAX_UNITS = 64
MAX_BALANCED_BATCH = 256


def balanced(*, splits: int, batch: int, invariant: bool, span: int, min_chunk: int) -> bool:
    """Whether a launch of ``splits`` splits a request for ``max_seq_len = span`` takes the balanced
    split (a production path: ragged batches balance on the device, equal ones keep the uniform
    split inside it). Not a launch of one split (no partials, no room for more units than
    requests), nor batch-invariant mode (fixed-span splits: a request's result must not depend on
    the batch), nor one request (nothing to balance) or more than :data:`MAX_BALANCED_BATCH`; nor
    a launch whose splits are already ``min_chunk`` keys of the longest request (the split count
    the span allows, :func:`num_splits`): no balanced unit is shorter, so the balanced split could
    only add units (measured on the H200: 3-15 % slower on such small ragged batches,
    lab/notes/mla-ragged.md)."""
    useful = -(-span // max(min_chunk, 1))
    return not invariant and 2 <= splits < useful and 1 < batch <= MAX_BALANCED_BATCH


def num_splits(cfg: MLAConfig, *, items: int, span: int, sm_count: int, fit: int) -> int:
    """KV splits per work item (request x head block).

    Enough programs for ``cfg.waves`` whole waves of resident programs, rounded down (the programs
    are equally long: a partly filled last wave costs nearly a whole program's time, see
    decode_configs.num_splits); no split shorter than ``min_chunk`` keys and no more partials than
    the workspace holds (``fit``); one split where the longest request holds at most
    ``min_split_span`` keys.
    """
    items = max(items, 1)
    want = max(1, cfg.waves * sm_count * cfg.programs_per_sm // items)
    useful = 1 if span <= cfg.min_split_span else max(1, -(-span // cfg.min_chunk))
    return max(1, min(want, useful, cfg.max_splits, fit))
