"""Launch configurations of the prefill kernel, one table per GPU family (no runtime autotuning).

Autotuning would stall a serving engine's first calls and cannot run inside CUDA-graph capture,
so configurations are fixed per (operand kind, head_dim). Every sm90 entry was compiled for
sm_90a and checked: wgmma for both products, no register spills in the loops, shared memory within
the 227 KB an H100 program may use (the facts are in the comments, with the H100 A/B that picked
the half D128 entry; lab/notes/prefill.md).

Operand kinds: the cache format's ``config_key`` (:mod:`kvattn._formats_table`): ``"half"``
(fp16/bf16 query and cache), ``"fp8"`` / ``"nvfp4"`` (a 16-bit or fp8 query over an fp8 / NVFP4
cache: tiles converted to float16 operands in registers, read as 32-bit words where aligned); and
``"fp8qk"`` (fp8 query and fp8 cache: Q.K^T on fp8 tensor cores, MLA's name for the same).

Where the pages let TMA read whole tiles (``prefill_launch.tma_views``), a kind with a
:data:`TMA_TABLES` entry for the head_dim (16-bit caches, and fp8 scores) takes it instead of its
gather entry.

Skip-softmax fixes the tiles at 128 x 128 (the semantics' tile, ``kvattn.reference.prefill``):
:data:`SKIP` holds warps and stages per head_dim for that shape.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int  # query rows per program
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the K/V loads


# Compiled for sm_90a (Triton 3.6, 16-byte aligned strides, page 64 HND unless said), registers / stack
# bytes / shared memory; the loops' spill-free is what matters (a one-off 8-16 B outside them is harmless):
#   half D64  128x128 w8 s2: 230 regs, none,  80 KB
#   half D128 128x128 w8 s2: 255 regs, 8 B (one STL/LDL pair outside the loops), 160 KB; page 16: 254,
#        none; page 128: 16 B outside the loops. H100 A/B at 1x8192x8192 (before the FMA logits):
#        128x128 s2 390 TFLOP/s > 128x128 s3 368 = 64x64 w4 s4 367 > 128x64 s3 327.
#   half D256 128x32  w8 s2: 254 regs, none, 128 KB
#   fp8 / nvfp4 (16-bit query, words path; H100 at 1x8192x8192 p64 HND, graph us, lab/notes/formats.md
#        "Formats: fp8 and NVFP4 caches in prefill"): D128 128x128 w8 s2 fp8 1623 / NVFP4 1710 (128x64 w8 s3, the old entry:
#        1967 / 2237; s3 1644 / 1732), 239 / 255 regs, no spill in the plain kernel; with window,
#        sinks, split tables and an NVFP4 output at page 16, 24-64 B spilled (fp8: 4 spill ops in
#        the loops). D64: fp8 128x64 w8 s3 865 (128x128 s2 1041), NVFP4 128x128 w8 s2 1168 (128x64
#        s3 1660), 186-218 regs, no spill. D256 (Hq 16): 128x64 w8 s2 fp8 1768 / NVFP4 2433 against
#        64x32 w8 s3 4064 / 5331 and 128x32 s2 2104 / 2831, although it spills (256-352 B, in the
#        loops too): every D256 tile of these kinds spills on the words path.
#   fp8qk D64  128x128 w8 s2: 167 regs, none, 48 KB   fp8qk D128 128x128 w8 s2: 229, none, 96 KB (H100: = s3)
#   fp8qk D256 128x64  w8 s2: 244 regs, none, 112 KB
_SM90 = {
    ("half", 64): PrefillConfig(128, 128, 8, 2),
    ("half", 128): PrefillConfig(128, 128, 8, 2),
    ("half", 256): PrefillConfig(128, 32, 8, 2),
    ("fp8", 64): PrefillConfig(128, 64, 8, 3),
    ("fp8", 128): PrefillConfig(128, 128, 8, 2),
    ("fp8", 256): PrefillConfig(128, 64, 8, 2),
    ("nvfp4", 64): PrefillConfig(128, 128, 8, 2),
    ("nvfp4", 128): PrefillConfig(128, 128, 8, 2),
    ("nvfp4", 256): PrefillConfig(128, 64, 8, 2),
    ("fp8qk", 64): PrefillConfig(128, 128, 8, 2),
    ("fp8qk", 128): PrefillConfig(128, 128, 8, 2),
    ("fp8qk", 256): PrefillConfig(128, 64, 8, 2),
}
# Caches read by TMA (the launcher's choice where the pages allow it: a tile inside one page, 16-byte
# aligned rows; see prefill_launch.tma_views), (kind, head_dim) -> config; absent: the gathers of _SM90.
# 16-bit caches ("half"):
# H100 (graph us, lab/notes/prefill.md "Prefill: K/V tiles by TMA"; gathers -> TMA): D128 128x64 w4 s2 (one warpgroup
# holds all 128 rows; 255 regs, ~100 B spilled outside the hot path, 96 KB: two programs an SM)
# 1x8192x8192 1368 -> 1113, 4x2048 451 -> 359, 16x512x4096 1432 -> 1151, 8x1024x8192 2680 -> 2269
# (s3 1174 / 384 / 1147 / 2324; 64x64 w4 s3 1297 / 412 / 1500 / 2891); D64 64x64 w4 s3 981 -> 656
# (128x64 w4 s2 729); D256 (Hq 16) 128x64 w8 s2 1765 -> 1041 (64x64 w4 s3 1445).
_SM90_TMA = {
    ("half", 64): PrefillConfig(64, 64, 4, 3),
    ("half", 128): PrefillConfig(128, 64, 4, 2),
    ("half", 256): PrefillConfig(128, 64, 8, 2),
    # fp8 query and fp8 pages ("fp8qk": fp8 scores straight from the TMA tile, V converted to float16
    # once). H100 (graph us at 1x8192x8192, lab/notes/prefill.md "Prefill: fp8 query over fp8 pages by TMA"; gathers -> TMA): D128 128x64
    # w4 s2 1161 -> 998 (s3 1007, 128x128 w8 s2 1153, 64x64 w4 s3 1401); D64 64x64 w4 s2 807 -> 661
    # (s3 671, 128x64 w4 s2 700); D256 (Hq 16) 64x64 w4 s2 1067 -> 1004 (128x64 w8 s2 1135).
    ("fp8qk", 64): PrefillConfig(64, 64, 4, 2),
    ("fp8qk", 128): PrefillConfig(128, 64, 4, 2),
    ("fp8qk", 256): PrefillConfig(64, 64, 4, 2),
    # fp8 pages with a 16-bit query ("fp8") gather: TMA tiles converted to the query's type (Triton's e4m3 ->
    # bf16, K and V) were no faster (H100, lab/notes/prefill.md "Prefill: fp8 query over fp8 pages by TMA": 1x8192x8192 D128
    # best 128x128 w8 s2 1612 vs gathered words 1651 us, D64 847 vs 856, D256 1722 vs 1723), nor with float16
    # operands (q in registers: D128 1598 vs 1596; D64 812 vs 840, D256 1580 vs 1730).
}


@dataclass(frozen=True)
class WSConfig:
    """Tiles of the warp-specialised Gluon kernel (:mod:`.kernels_gluon_ws`; 128 query rows a program)."""

    block_n: int  # keys per tile
    stages: int  # K and V buffers a ring
    pingpong: bool  # the two consumer warpgroups take turns issuing their products


# Gluon warp-specialised kernel (16-bit caches, pages of a multiple of 64, Hopper), head_dim -> config.
# sm_90a (Triton 3.6 and 3.7.1, page 64 HND): 168 registers at entry (producer warpgroup 24, consumer
# warpgroups 240 each), no spill in the loops; shared memory: query 2 x [64, D], K and V rings of
# stages x [block_n, D]: D64 144 KB, D128 160 KB, D256 192 KB. H200 (graph us, lab/notes/prefill.md
# "Prefill: warp-specialised Gluon kernel"): ping-pong off was faster on 3 of the 4 bf16 shapes
# (1x8192x8192 967 vs 997 us, 4x2048 306 vs 314, 8x1024x8192 1793 vs 1826); 3 buffers within 1 %,
# 64-key tiles 10-20 % slower.
_SM90_WS = {64: WSConfig(128, 4, False), 128: WSConfig(128, 2, False), 256: WSConfig(64, 2, False)}
# fp8 caches (a converter partition turns the copied bytes into float16 operands, see kernels_gluon_ws), by
# operand kind: "fp8" (16-bit query: K and V converted, a ring of bytes each) and "fp8qk" (fp8 query:
# scores on the copied K bytes, V converted). D128 / D256 take the 16-bit tiles (shared memory: D128
# 225 KB with both byte rings; fp8qk D256 160 KB; D256 under a 16-bit query would need 256 KB and
# keeps the Triton kernel). D64 takes 2 buffers a ring, not 4: with 4, every D64 fp8 launch on the
# H100 gave NaN rows (bf16, fp16 and fp8 queries; 2 buffers passed; lab/notes/prefill.md "Prefill: fp8
# caches in the warp-specialised kernel").
_SM90_WS_FP8 = {("fp8", 64): WSConfig(128, 2, False), ("fp8", 128): _SM90_WS[128],
                ("fp8qk", 64): WSConfig(128, 2, False), ("fp8qk", 128): _SM90_WS[128],
                ("fp8qk", 256): _SM90_WS[256]}


# Staging an fp8 cache's pages (ops.prefill.staging) against converting them in the Gluon kernel:
# the pass runs at copy bandwidth outside the attention kernel (~8 bytes a key's K and V element,
# 4 for an fp8 query: V only), so it pays where each key serves enough query rows (max_q_len x the
# GQA group) to spread it over; the converter costs the attention kernel ~15-25 % whatever the
# rows. H100, 4 x 512 new rows over 16384 (rows x group = 2048): staged 940 us, converter 1045
# (bf16 query); 793 / 842 (fp8 query). By cache kind. lab/notes/prefill.md "Prefill: pages
# dequantised once a call". "half": a 16-bit cache in pages of under 64 tokens, staged in pages of
# 64 (the alternative: the Gluon kernel copying a box a page, ~10 % slower than pages of 64 at
# 1 x 8192), the pass moving 8 bytes a K and V element.
STAGE_MIN_ROWS = {"fp8": 2048, "fp8q": 2048, "half": 8192}


# An fp8 query over an fp8 cache whose V pages are staged as float16 (no converter, so no limit on
# the ring): D128 takes 3 buffers (H100, 1 x 8192: 780 us against 823 with 2; 4 x 2048: 288 / 281).
_SM90_WS_STAGED_V = {64: _SM90_WS_FP8[("fp8qk", 64)], 128: WSConfig(128, 3, False), 256: _SM90_WS[256]}


def ws_config(head_dim: int, kind: str = "half") -> WSConfig | None:
    """The Gluon kernel's tiles for ``head_dim`` and operand ``kind`` (``"half"``, ``"fp8"``,
    ``"fp8qk"``, as :func:`config`, and ``"fp8qk-staged"``: an fp8 query's V staged); None: that
    launch stays on the Triton kernel."""
    if kind == "half":
        return _SM90_WS.get(head_dim)
    if kind == "fp8qk-staged":
        return _SM90_WS_STAGED_V.get(head_dim)
    return _SM90_WS_FP8.get((kind, head_dim))


# head_dim -> (num_warps, num_stages) at 128 x 128: D64 188 regs, clean; D128 255 regs, 32 B spilled;
# D256 255 regs, 880 B spilled and unpipelined (a 128 x 256 float32 accumulator alone is 128
# registers a thread at 8 warps; 16 warps cap registers at 128 and spill more): correct, slow.
_SM90_SKIP = {64: (8, 3), 128: (8, 3), 256: (8, 1)}

_DEFAULT = {key: PrefillConfig(c.block_m, c.block_n, c.num_warps, 2) for key, c in _SM90.items()}
_DEFAULT_SKIP = {d: (w, 1 if d == 256 else 2) for d, (w, _) in _SM90_SKIP.items()}

# Small tiles so CPU tests cover multi-tile query and key loops, and tiles inside / across pages.
_INTERPRETER = {(kind, d): PrefillConfig(16, 16, 4, 1) for kind in ("half", "fp8", "nvfp4", "fp8qk") for d in (64, 128, 256)}
_INTERPRETER_SKIP = {d: (4, 1) for d in (64, 128, 256)}

TABLES = {"sm90": _SM90, "default": _DEFAULT, "interpreter": _INTERPRETER}
TMA_TABLES = {"sm90": _SM90_TMA}
SKIP_TABLES = {"sm90": _SM90_SKIP, "default": _DEFAULT_SKIP, "interpreter": _INTERPRETER_SKIP}
SKIP_TILE = 128  # = kvattn.reference.SKIP_SOFTMAX_TILE_M = SKIP_SOFTMAX_TILE_N


def config(arch: str, kind: str, head_dim: int, skip: bool = False, tma: bool = False) -> PrefillConfig | None:
    """The configuration for ``arch`` (``"sm90"``, ``"default"``, ``"interpreter"``) and operand
    ``kind``; with ``tma`` (pages read by TMA) there may be none (then None: the launcher gathers
    instead, as it does with skip-softmax)."""
    if tma:
        return None if skip else TMA_TABLES.get(arch, {}).get((kind, head_dim))
    if skip:
        warps, stages = SKIP_TABLES[arch][head_dim]
        return PrefillConfig(SKIP_TILE, SKIP_TILE, warps, stages)
    return TABLES[arch][(kind, head_dim)]
