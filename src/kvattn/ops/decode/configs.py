"""Launch configurations of the decode kernels, one table per GPU family.

Decode has no runtime autotuning: a tuning pass would stall the first real calls of a serving
engine and cannot run inside CUDA-graph capture. The tables were measured with
``benchmarks/tune_decode.py`` (see ``lab/notes/decode.md`` and ``lab/notes/single-decode.md``); a GPU
without its own table uses ``"default"``, the interpreter uses small tiles so CI exercises
multi-tile and multi-page loops.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from ..._formats_table import BY_NAME
from ...runtime.plans import config_override


# Peak copy bandwidth an SM (GB/s) past which the main table's tiles replace the long ones (the
# long table's comment below says why).
LONG_MAX_SM_GBPS = 32.0
# Keys a split of the streaming tiles holds at most past that bandwidth (stream_split_limit)
STREAM_SPLIT_KEYS = 768


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the K/V loads
    waves: int = 1  # the split count fills this many whole waves of resident programs (num_splits)
    tail_splits: int = 0  # >0: split counts up to this one may fill the last wave better (num_splits)
    min_chunk: int = 256  # fewest keys worth a split of their own
    max_splits: int = 64
    dot_single_row: bool = False  # tensor cores even when a program has one query row
    pdl: bool = False  # programmatic dependent launch between the split and combine kernels
    page_ahead: bool = True  # page ids loaded a tile ahead (see decode/kernels.py); False: pipeliner-staged
    prefetch: int = 0  # tiles of contiguous K/V asked of L2 at a program's start (not paged caches)
    evict_first: bool = False  # K/V marked evict_first in L2 (Triton keeps it on unpipelined loads; TMA: ptx_hints)
    max_per_sm: int = 0  # programs an SM the split count plans for, at most (0: as many as fit)
    # >0: ptxas's cap on a thread's registers (the launch option), so that more programs fit an SM;
    # occupancy() bounds its register estimate by it. 0: ptxas's own choice.
    maxnreg: int = 0
    tma: bool = False  # a contiguous 16-bit cache read by TMA (evict_first: hinted by runtime/ptx_hints.py)
    invariant_span: int = 1024  # keys a split in batch-invariant mode (rounded up to BLOCK_N; invariant_splits)
    # Ragged batches (common.balance): the batch's keys cut into about balance_waves x resident
    # programs' worth of units (at least the uniform split's count), none under balance_min_chunk
    # keys; 0 keeps the uniform split only.
    balance_waves: int = 4
    balance_min_chunk: int = 512
    balance_max_waves: int = 4  # launches of more items than this many waves keep the uniform split
    # float32 values a thread a balanced launch's in-kernel merge loads a round (plan._merge_block_s),
    # which sets a request's unit cap (common.balance.unit_cap). At 8 query rows the main tiles'
    # balanced kernel compiles to the same registers at 2 or 4 partials a round (196 on pages of
    # 64, 162 on pages of 16, no stack; sm_90a, Triton 3.6: two programs an SM either way), so
    # plan._Plan._merge_round_of gives their 4-warp programs the long tiles' round where it
    # replaces them at one KV head.
    balance_merge_values: int = 16
    # A ragged batch of a balanced launch in lanes (common.balance.lane_span: one equal share of the
    # batch's tiles a lane, static) rather than units dealt by the counter; a uniform batch is dealt
    # either way (lab/notes/decode-ragged-batches.md "The lanes plan").
    balance_lanes: bool = True
    balance_lanes_cap: int = 0  # a request's lanes at most (0: the deal's unit cap, common.balance.unit_cap)
    # >0: a lanes launch merges in the kernel only requests of at most this many units, and a combine
    # launch the rest (common.combine.lanes_combine_kernel); 0: every request in the kernel; None:
    # the GPU's rule (combine_units)
    balance_combine_units: int | None = None
    # >0: a uniform launch that merges its splits by the combine launch, of splits of at most
    # COMBINE_STAGES_KEYS keys, runs this many stages (plan._Plan.combine_form; the split count
    # follows the programs an SM they fit). 0: the tile's own.
    combine_stages: int = 0
    # >0: on GPUs past long_max_sm_gbps of copy an SM, launches of one query row an item run this
    # many stages: from the plan's own table (paged MHA decode) a launch whose split count at them
    # is above one (it merges its splits; plan._Plan.config_for), from the contig table (single
    # decode past the streaming spans) every launch (plan._Plan.__init__). 0: the tile's own.
    one_row_stages: int = 0
    # >0: RoPE launches of one query row an item over a contiguous cache (single decode) take tiles
    # of this many keys instead of the halved RoPE tile, on GPUs past long_max_sm_gbps of copy an SM
    # (plan._Plan.__init__). 0: the halved tile.
    rope_wide_block_n: int = 0
    # fp8 caches: whether a uniform launch merged by the combine launch may put the keys in M
    # (plan._Plan.combine_form; False: the rows in M at 8 rows, faster or level on all 7 such rows
    # of the sweep: lab/notes/decode-combine-launches.md "fp8's rows in M in the combine launches").
    combine_keys_in_m: bool = False
    # The streaming tiles take a span only while its splits hold at most this many keys, on GPUs of
    # the long table's bandwidth an SM and more (stream_split_limit); 1: never. Read from the stream
    # table's config.
    stream_split_keys: int = STREAM_SPLIT_KEYS
    # The long table's tiles only on GPUs of at most this peak copy bandwidth an SM (GB/s; past it
    # the main table's replace them: main_replaces_long). Read from the long table's config.
    long_max_sm_gbps: float = LONG_MAX_SM_GBPS
    # fp8 caches, <= 8 query rows a KV head: keys in the products' M dim (plan._keys_in_m): 24 x 48740
    # fp8 on pages of 16 731 -> 692 us on an H200 (lab/notes/formats.md "Formats: keys in M and the
    # page offsets, measured"). The short-request table's programs keep the rows in M (config()).
    keys_in_m: bool = True
    # Paged caches without block scales: token offsets computed where the page ids load, V's taken
    # from K's where the tables and strides are the same (plan._page_offsets): fp8 rows up to 12 % and
    # bf16 rows 1-8 % faster on an H200, none slower (the same note).
    page_offsets: bool = True
    # With the page offsets, tiles of whole pages or in one page: one page id and 64-bit offset a
    # run of rows in one page, a row's int32 offset in its page (plan._page_runs): the bf16 loop
    # 533 -> 340 SASS instructions a 64-key tile on pages of 64, 542 -> 387 on pages of 16 (sm_90a,
    # Triton 3.6); on an H200 128 x 2048 p64 265 -> 256 us, 256 x 1024 p16 266 -> 256, none slower
    # (lab/notes/formats.md "Formats: page runs, measured").
    page_runs: bool = True


# (kv format, head_dim) -> (BLOCK_N, num_warps, num_stages); "half" = float16/bfloat16.
# Measured on an H100 (lab/notes/decode.md "Decode: tiles, stages and warps"): ("half", 128) and ("fp8", 128). The other rows keep
# the bytes per tile of those two and are not tuned yet.
_SM90 = {
    ("half", 64): (128, 4, 3),
    ("half", 128): (64, 4, 4),
    ("half", 256): (32, 4, 3),
    ("fp8", 64): (128, 4, 3),
    ("fp8", 128): (128, 4, 3),
    ("fp8", 256): (64, 4, 3),
    # NVFP4 (codes and scales read as words, KV_NVFP4_WORDS), measured on an H100
    # (lab/notes/formats.md "Formats: NVFP4 in decode"): one-warp programs where each gets a long split,
    # 64x8192 D64 / D128 321 -> 212 / 498 -> 402 us against (128, 4, 3); D256 (32, 2, 3) 629 -> 585
    # against (64, 4, 3). Never under 32 keys a tile: on an H100 (Triton 3.6) 16-key tiles computed
    # wrong results with 1, 2 or 4 warps on the byte path (unaligned caches; the words path
    # computes them right but no faster: lab/notes/formats.md "Formats: NVFP4 in decode"); tests/ops/decode/test_configs.py guards it.
    ("nvfp4", 64): (32, 1, 3),
    ("nvfp4", 128): (32, 1, 3),
    ("nvfp4", 256): (32, 2, 3),
}
# Launches of at most one work item an SM (small batches): every item is split, and one-warp
# programs get short splits. NVFP4 D128, measured on an H100 (lab/notes/formats.md "Formats: NVFP4 in decode"):
# 16x4096 88.6 -> 74.9 us, 1x32768 44.7 -> 43.8 with (64, 2, 3) instead of the main table's
# (32, 1, 3); at 32x8192 (256 items) the main table's wins (214 vs 252). D64's and D256's main
# entries win on those shapes as they are.
_SM90_FEW = {
    ("nvfp4", 128): (64, 2, 3),
}
# Long tiles: for launches whose work items all fit one wave of long-tile programs (small
# batches, single decode: the sequence is split to fill that wave) and for pages of 64+ tokens
# (a tile spans two whole pages). Measured on an H100 (lab/notes/decode.md): 16x4096 0.79 ->
# 0.82, 1x32768 0.65 -> 0.67, single decode 32768 0.90 -> 0.92, 64x8192 page 64 0.98 -> 0.99;
# with more items on 16-token pages they lose (128x2048 0.95 -> 0.92, 32x4096 0.905 -> 0.895:
# one 8-warp program per SM balances worse).
_SM90_LONG = {
    ("half", 128): (128, 8, 3),
}
# The long tiles were measured on an H100 (3.35 TB/s peak over 132 SMs: 25 GB/s an SM). On an H200
# (4.8 TB/s peak over the same 132 SMs: 36.5 GB/s an SM) the main table's tiles beat them on most
# launches that take them, same run (lab/notes/decode.md "Decode: the long tiles on an H200"):
# sw16 532 -> 474 us, sw06 443 -> 396, sw28 420 -> 366, sw51 228 -> 170, 16x4096 p16 92.6 -> 84.5,
# ragged 128 x [1, 8192] p64 584 -> 565; they lose by 3 % at most elsewhere (sw27 13.4 -> 13.8,
# sw46 351 -> 357). A likely reason: an SM that streams its bytes faster needs more of them in
# flight, and two main-tile programs keep 3 tiles of 32 KB each in flight (192 KB an SM) against
# one long-tile program's 2 of 64 KB (128 KB). So the choice reads the GPU's peak copy bandwidth
# an SM (runtime.device.memory_bandwidth, main_replaces_long): past LONG_MAX_SM_GBPS the main table
# replaces the long one; at or below it (H100 SXM 25; H100 NVL and GH200 with HBM3 about 30, not
# measured) the long tiles stay. Balanced launches at one KV head take the main tiles at the long
# tiles' merge round (plan._Plan._merge_round_of: sw12 66.4 us long, 89.5 main, 62.3 main at the
# long round; sw07 186 / 220 / 187).
# Short requests (every request at most SHORT_SPAN keys): more, shorter programs an SM, so each
# short program's setup (query, page ids) hides behind the others' copies. 16-bit caches: three
# 4-warp programs instead of one long-tile program, on pages of 64+ tokens (smaller pages already
# run 64-key tiles); fp8: four instead of two, on any page size. Measured on an H100
# (lab/notes/decode.md): 256x1024 page 64 0.948 -> 0.963, fp8 256x1024 page 16 0.828 -> 0.853; at
# 2048 keys the long tiles still win (128x2048 page 64 0.957 vs 0.949).
_SM90_SHORT = {
    ("half", 128): (64, 4, 3),
    ("fp8", 128): (64, 4, 3),
}
_SHORT_MIN_PAGE = {"half": 64, "fp8": 1}
SHORT_SPAN = 1024
# The main tiles' stages at three programs an SM (70 KB of shared memory against 4 stages' 104),
# which two rules take on an H200 (the config's combine_stages and one_row_stages):
# - uniform launches of the main tiles that merge by the combine launch (a few requests cut into
#   many splits), with a split count for three an SM, shorter splits. Measured on an H200 against 4
#   stages, same run (lab/notes/decode-combine-launches.md "Uniform launches at three programs an
#   SM"): 3 ragged requests with 2 drafts 53.7 -> 49.1 us, 2 requests up to 14739 keys 35.8 -> 31.9,
#   5 log-normal requests 40.7 -> 38.2; launches that merge in the kernel (balanced) keep 4 stages,
#   which they need (10 x 49133 494 -> 513 at 3). Only where the main tiles replace the long ones
#   (an H200; an H100's small batches run the long tiles);
# - launches of one query row an item (MHA, 32 / 32 heads) that split their items: a one-row
#   program does little arithmetic a tile and waits on its copies, which a third program an SM
#   hides. Measured on an H200, same run (same note, "One-row launches at three programs an SM"):
#   5 ragged requests up to 4857 keys 65.8 -> 64.9 us, 1 x 92435 365 -> 360, 4 log-normal requests
#   up to 32854 45.4 -> 43.6; a launch of 3584 items that does not split 571 -> 574, so it keeps 4.
#   Only past LONG_MAX_SM_GBPS of copy an SM (not measured on an H100).
_SM90_THREE_AN_SM_STAGES = {("half", 128): 3}
# RoPE single decode (one query row an item, contiguous cache): 64-key tiles instead of the halved
# 32, on a GPU past LONG_MAX_SM_GBPS of copy an SM. On an H100 64 keys were slower (config()); on
# an H200, same run (lab/notes/single-decode.md "Single decode: RoPE's 64-key tiles on an H200"):
# 4096 / 32768 / 131072 keys 32.2 / 176 / 669 -> 29.0 / 151 / 553 us (Triton 3.6), 31.2 / 177 /
# 672 -> 28.7 / 148 / 539 (3.7.1), where 3 or 4 programs an SM at 32 keys gained half as much.
_SM90_ROPE_WIDE = {("half", 128): 64}
# The combine launches' rule holds while their splits hold at most this many keys at the tile's own
# stages: 2 x 80360 keys with 2 drafts at 64/8 heads (splits of 5022 keys, near the copy limit
# already) 168 -> 173 us at 3.
COMBINE_STAGES_KEYS = 2048
# Streaming tiles: launches that split every work item (few items: small batches, single decode)
# and read at most STREAM_MAX_L2 times the L2 size of K/V. Their K/V loads are not software
# pipelined (num_stages 1), so Triton keeps an evict_first hint on them: the streamed K/V, read
# once, leaves L2 first, and the dirty lines other kernels left there (in the benchmark, the L2
# flush's) are not written back during the call. Latency is hidden by more programs an SM
# instead. Measured on an H100 (lab/notes/decode.md): 1x32768 0.672 -> 0.729, single decode 4096
# 0.559 -> 0.639; past ~4 L2 sizes the hint costs more than it saves (single decode 32768 0.925
# -> 0.891), and launches that do not split lose (16x4096 0.825 -> 0.819).
_SM90_STREAM = {
    ("half", 128): (128, 8, 1),
}
STREAM_MAX_L2 = 4
# One-row tiles past the streaming spans: a launch of one query row an item over a contiguous
# cache (single decode, MHA) whose span is too long for the streaming tiles' hint. Many short
# unpipelined programs without the hint (4 an SM, 16 splits a head at 32 heads) instead of one
# long pipelined program an SM: the block scheduler keeps every SM busy to the end. Found from
# bare reads of single decode 32768's bytes (the fastest per-head read: many 32-64-key, 4-warp,
# unpipelined programs), measured on an H100 (lab/notes/single-decode.md "Single decode: balancing the programs of 32768"): single decode 32768
# 192.2-192.4 -> 189.0-189.1 us (0.92 -> 0.94 of copy bandwidth), 131072 710.0-710.7 -> 703.6-703.9;
# with the hint, or 16- / 32-key tiles, or 8 warps, slower. Paged caches do not gain (16x4096 and
# 8x8192 within 1 %, 64x8192 p64 0.99 -> 0.76: too many items for it), so they keep the long tiles.
_SM90_CONTIG = {
    ("half", 128): (64, 4, 1),
}
# The one-row contiguous tiles pipelined (2 stages, the same programs and splits) on a GPU past
# LONG_MAX_SM_GBPS of copy an SM: on an H200, same run (lab/notes/single-decode.md "Single decode:
# the one-row tiles pipelined on an H200"), single decode 32768 / 131072 142.9 / 519.8 -> 137.3 /
# 494.9 us, where 128- or 32-key tiles and 8 warps were 22-40 % slower; beside FlashInfer in
# another run 135 / 485 against its 136 / 485. The H100's many short unpipelined programs (above)
# stay there.
_SM90_CONTIG_PIPELINED_STAGES = {("half", 128): 2}
# RoPE's streaming tiles: one query row an item (MHA single decode) over a contiguous 16-bit cache,
# within the streaming spans. RoPE's tiles stay pipelined (its per-key query rotation needs the
# copies in flight), read by TMA with the L2 evict_first hint that the streaming tiles get from
# register loads (runtime/ptx_hints.py puts it on the TMA copies; Triton cannot). Measured on an H100
# (lab/notes/single-decode.md "Single decode: the L2 hint on pipelined copies"): single decode RoPE 4096 38.4 -> 36.3 us (NONE 34.2); TMA
# without the hint 39.9, 64-key tiles 37.1; past the streaming spans the hint loses (32768 191.5
# -> 201.4). The entry is RoPE's own tile before config() halves it: 32 keys, 4 warps, 3 stages.
_SM90_ROPE_STREAM = {
    ("half", 128): (64, 4, 3),
}
_DEFAULT = {key: (bn, w, 2) for key, (bn, w, _) in _SM90.items()}
_INTERPRETER = {key: (32 if key[1] <= 128 else 16, 4, 1) for key in _SM90}

TABLES = {"sm90": _SM90, "default": _DEFAULT, "interpreter": _INTERPRETER}
LONG_TABLES = {"sm90": _SM90_LONG}
FEW_TABLES = {"sm90": _SM90_FEW}
SHORT_TABLES = {"sm90": _SM90_SHORT}
STREAM_TABLES = {"sm90": _SM90_STREAM}
CONTIG_TABLES = {"sm90": _SM90_CONTIG}
ROPE_STREAM_TABLES = {"sm90": _SM90_ROPE_STREAM}
# config(..., kind): the main table, or one of the measured special-purpose tables above.
KINDS = {"main": TABLES, "long": LONG_TABLES, "few": FEW_TABLES, "short": SHORT_TABLES, "stream": STREAM_TABLES,
         "contig": CONTIG_TABLES, "rope_stream": ROPE_STREAM_TABLES}

_override: dict = {}


# ``with override(**fields):`` replaces config fields for the block (the tuning script's hook).
override = config_override(_override, lambda: config.cache_clear())


# Per-SM resources of the GPUs the tables target (sm90): shared memory a multiprocessor can give
# its programs (less 1 KB reserved per program), 32-bit registers, resident warps.
_SMEM_PER_SM = 228 * 1024
_REGS_PER_SM = 65536
_WARPS_PER_SM = 64


def occupancy(cfg: DecodeConfig, kv_format: str, head_dim: int, rope_query: bool, balanced: bool = False) -> int:
    """Programs of the split kernel that fit on one multiprocessor at once (an estimate).

    Shared memory: ``num_stages - 1`` K/V tile buffers (what Triton 3.6 allocates for the
    pipelined copies) and 4-6 KB of operand / reduction scratch, as the compiled kernels show; fp8
    caches add the float16 tile their words are converted into. Registers: what ptxas gave the
    tuned kernels (``benchmarks/inspect_kernels.py``, or ptxas on a local sm_90a compile): ~150 a
    thread for fp8 at 128-key tiles, at most 128 otherwise (up to 140 with 16-bit page runs on
    3-stage 64-key tiles, which shared memory holds to 3 programs an SM anyway); NVFP4 grows with
    the elements a thread converts a tile (``block_n * D / threads``): 96-110 at 32, 128-146 at 64,
    168-213 at 128 (Triton 3.6, sm_90a, the words formats), which ``96 + elements`` bounds from
    above. The balanced kernel (``balanced``: its plan and in-kernel merge) takes more with 16-bit
    caches: 168 at D 64-128 (up to 200 with page runs on 4-stage tiles, which shared memory holds
    to 2 programs an SM anyway), 212-218 at D 256 (three programs an SM at D 256 by the unbalanced
    estimate, two in truth, so a grid of three a SM ran a second partial wave). An estimate above
    the truth leaves slots idle; one below plans a second, partial wave.
    """
    fmt = BY_NAME[kv_format]
    # bytes a staged element: the stored width, at least one byte (NVFP4's half-byte codes come
    # with their scales and conversion scratch; the estimate keeps the byte it was measured with)
    elem = max(1, fmt.element_bits // 8)
    smem = (cfg.num_stages - 1) * cfg.block_n * head_dim * elem * 2 + (4 if rope_query else 6) * 1024
    regs = 128
    if fmt.config_key == "fp8":  # read as words (KV_FP8_WORDS): a float16 tile staged for the MMA
        smem += cfg.block_n * head_dim * 2
        regs = 160 if cfg.block_n >= 128 else 128
    elif fmt.config_key == "nvfp4":
        regs = min(255, 96 + cfg.block_n * head_dim // (32 * cfg.num_warps))
    elif balanced:
        regs = 168 if head_dim <= 128 else 224
    if cfg.maxnreg:
        regs = min(regs, cfg.maxnreg)
    fit = min(_SMEM_PER_SM // (smem + 1024), _REGS_PER_SM // (regs * 32 * cfg.num_warps),
              _WARPS_PER_SM // cfg.num_warps)
    return max(1, fit)


def num_splits(cfg: DecodeConfig, *, items: int, span: int, sm_count: int, fit: int, max_programs,
               kv_format: str, head_dim: int, rope_query: bool) -> int:
    """KV splits per work item (request x KV head x row block).

    Enough programs for ``cfg.waves`` whole waves of resident programs (``occupancy`` per SM),
    rounded down: the programs of a decode are equally long, so a last wave that is only partly
    full costs nearly a whole program's time with most of the GPU idle (measured on an H100:
    rounding ``4 programs per SM`` up instead cost up to 12 %, see lab/notes/decode.md "Decode: split counts
    in whole waves of resident programs"). No split shorter than ``min_chunk`` keys, no more
    partials than the workspace holds (``fit``), and at most ``max_programs`` programs (xqa's
    ``sm_count``).
    """
    items = max(items, 1)
    per_sm = occupancy(cfg, kv_format, head_dim, rope_query)
    if cfg.max_per_sm:
        per_sm = min(per_sm, cfg.max_per_sm)
    slots = sm_count * per_sm
    want = max(1, cfg.waves * slots // items)
    useful = max(1, -(-span // cfg.min_chunk))  # ceil
    cap = min(useful, cfg.max_splits, fit)
    if max_programs is not None:
        cap = min(cap, max(1, max_programs // items))
    splits = max(1, min(want, cap))
    if cfg.tail_splits and wants_tail_fit(items, slots, splits, per_sm):
        splits = tail_fit(items, slots, splits, min(cap, cfg.tail_splits))
    return max(1, splits)


def past_sm_bandwidth(bandwidth: float, sm_count: int, gbps: float) -> bool:
    """Whether a GPU's peak copy bandwidth (``bandwidth`` bytes/s, 0 where unknown) over its
    ``sm_count`` SMs is past ``gbps`` GB/s an SM (a config's ``long_max_sm_gbps``: an H200 is, an
    H100 is not): the bound of every rule measured on the H200 only."""
    return bandwidth > gbps * 1e9 * sm_count


def combine_units(cfg: DecodeConfig, *, sm_count: int, bandwidth: float) -> int:
    """The requests' unit count past which a lanes launch of one program a unit leaves them to the
    lanes combine launch (``plan._combine_units``; 0: none): the config's
    ``balance_combine_units`` where it is set, else ``COMBINE_UNITS`` on a GPU that launches the
    combine behind the split (``cfg.pdl``) and is past the config's ``long_max_sm_gbps``
    (``past_sm_bandwidth``: an H200, where it was measured; an H100 keeps the in-kernel merge its
    grid was recorded with, as the equal one-KV-head batch pays the early combine launch's
    scheduling, +0.4-0.9 us on an H200)."""
    if cfg.balance_combine_units is not None:
        return cfg.balance_combine_units
    return COMBINE_UNITS if cfg.pdl and past_sm_bandwidth(bandwidth, sm_count, cfg.long_max_sm_gbps) else 0


def tile_splits(cfg: DecodeConfig, *, paged: bool, sm_count: int, bandwidth: float) -> bool:
    """Whether a paged launch of ``cfg``'s table of fewer programs than SMs may cut its splits down
    to one tile (``plan._Plan.num_splits``): on a GPU past the config's ``long_max_sm_gbps``
    (``past_sm_bandwidth``: an H200, where it was measured). Such launches
    are bound by each program's chain of tiles, not by the bytes: on an H200, 1-5 requests at 8-64
    query heads 10-27 % faster (a 3-token request of 1193 keys 15.1 -> 11.5 us;
    lab/notes/decode-combine-launches.md "Splits of one tile for launches under one program an SM").
    An H100 keeps ``min_chunk`` as measured there."""
    return paged and past_sm_bandwidth(bandwidth, sm_count, cfg.long_max_sm_gbps)


# Launches of two or more programs an SM whose whole-wave split count runs at most TAIL_WAVES waves
# filled below TAIL_FILL take the split count of tail_fit (one program an SM: wants_tail_fit).
# Measured on an H200 (lab/notes/decode.md "Decode: filling the last wave"): 22 x 24305 pages of 64
# at 64/8 heads (176 items on 132 long-tile slots, 0.67 full) 729 -> 528 us; 256 x 1024 pages of 64
# (2048 items on 396 short-tile slots: 5.2 waves 0.86 full, which the block scheduler already evens
# out) lost 265 -> 282 under the rule without these bounds.
TAIL_WAVES = 2
TAIL_FILL = 0.8
TAIL_SPLITS = 16  # the most splits tail_fit considers (sm90 tables)
# Lanes launches of one program a unit (one KV head, one row block: plan._combine_units) leave a
# ragged batch's requests of more than COMBINE_UNITS units to the lanes combine launch, whose
# programs a batch found uniform starts early and which then exits under the split launch
# (programmatic dependent launch: sm90 tables; only past the long table's bandwidth an SM, an H200,
# where it was measured: combine_units). Such launches cap a request's lanes at COMBINE_LANE_CAP (where
# balance_lanes_cap is 0) instead of the in-kernel merge's unit cap, which the combine does not
# have. Measured on an H200, same run (lab/notes/
# decode-sw12.md "The combine launch started early for uniform batches"): sw12 (45 log-normal
# requests to 51550 keys, 8/1 heads, pages of 64) 54.8 -> 53.4 us; the equal 64 x 8192 pages of 16
# at 8/1 heads 82.8 -> 83.6 (+2.2 when the combine launch started after the split); the rows of
# more KV heads level.
COMBINE_UNITS = 1
COMBINE_LANE_CAP = 64


def wants_tail_fit(items: int, slots: int, splits: int, per_sm: int) -> bool:
    """Whether a launch of ``items x splits`` programs on ``slots`` resident ones (``per_sm`` an
    SM) looks for a split count that fills its last wave better (``tail_fit``).

    Two or more programs an SM: only launches of at most ``TAIL_WAVES`` waves filled below
    ``TAIL_FILL``. Past those, the block scheduler evens the waves out by itself, and more splits
    only add partials and merges (256 x 1024 pages of 64: 2048 items on 396 short-tile slots, 5.2
    waves 0.86 full, lost 265 -> 282 us under the unbounded rule on an H200).

    One program an SM (the long tiles: 8 warps and 136 KB of shared memory each), whatever the
    waves and the fill: no second program shares an SM, so the last wave's idle slots cost a whole
    program's time however many waves came before (51 x 11629 pages of 64 at 64/8 heads: 408 items,
    4 waves 0.77 full, 0.79 of copy bandwidth on an H200 where FlashInfer reads 1.0). Measured on an
    H200 with the unbounded rule on every launch: 57 x 26788 pages of 32 at 16/2 heads (114 items,
    0.86 full) 465 -> 443 us, the grid's long-tile launches unchanged (0.96+ full already, which
    ``tail_fit`` keeps); lab/notes/decode.md "Decode: filling the last wave" and "Decode: HND rows
    and the last wave"."""
    if per_sm == 1:
        return wave_fill(items, slots, splits) < 1.0
    return -(-items * splits // slots) <= TAIL_WAVES and wave_fill(items, slots, splits) < TAIL_FILL


def wave_fill(items: int, slots: int, splits: int) -> float:
    """The busy fraction of the slots over a launch of ``items x splits`` equally long programs:
    its programs over the slots of the waves it runs (the last one rounded up)."""
    programs = items * splits
    return programs / (slots * -(-programs // slots))


def tail_fit(items: int, slots: int, splits: int, most: int) -> int:
    """The split count in ``[splits, most]`` whose waves are fullest (``wave_fill``), ``splits``
    kept unless another fills them by 4 points more (each split adds partials and a merge). The
    whole-waves-rounded-down rule leaves most slots idle where the items are a wave and a bit (176
    items on 132 slots: 0.67) or fewer than the slots (80 on 132: 0.61); 3 and 6 splits fill 1.0
    and 0.91."""
    best, fill = splits, wave_fill(items, slots, splits)
    for k in range(splits + 1, most + 1):
        f = wave_fill(items, slots, k)
        if f > fill + 0.04:
            best, fill = k, f
    return best


def balance_pays(cfg: DecodeConfig, *, items: int, sm_count: int, kv_format: str, head_dim: int,
                 rope_query: bool) -> bool:
    """Whether a launch may take the balanced split of a ragged batch (``common.balance``).

    Measured on an H200 beside the uniform split in one run (docs/performance.md, "Ragged
    batches"): it pays where two or more programs share an SM (a program's next unit then starts
    while the other streams: ragged 128 x [1, 8192] p16 634 -> 592 us, 64 x [1, 12000] p16 541 ->
    477, log-normal batches 0.2-0.95x), and with one program an SM where the items fit one wave
    (a few requests, one of them long: 45 log-normal requests at 8/1 heads 367 -> 78 us, 22
    requests up to 88k 273 -> 220; equal 16 x 4096 pays 82 -> 87); it loses with one program an SM
    over several waves (the long tiles of pages of 64: ragged 128 x [1, 8192] p64 593 -> 640) and
    where the items already fill many waves, which the hardware's block scheduler balances by
    itself (112 one-row MHA requests, 6.8 waves: 604 -> 672; equal 256 x 1024: 282 -> 286)."""
    per_sm = resident_slots(cfg, sm_count=1, kv_format=kv_format, head_dim=head_dim, rope_query=rope_query)
    return (per_sm >= 2 or items <= sm_count) and items <= cfg.balance_max_waves * sm_count * per_sm


def balance_target(cfg: DecodeConfig, *, sm_count: int, programs_per_unit: int, kv_format: str, head_dim: int,
                   rope_query: bool) -> int:
    """Units the balanced split of a ragged batch aims at (``common.balance``): ``balance_waves``
    waves of resident programs, a unit being ``programs_per_unit`` programs (KV heads x row
    blocks)."""
    slots = resident_slots(cfg, sm_count=sm_count, kv_format=kv_format, head_dim=head_dim, rope_query=rope_query)
    return max(1, cfg.balance_waves * slots // max(1, programs_per_unit))


def balance_min_span(cfg: DecodeConfig, *, items: int, splits: int, slots: int) -> int:
    """Shortest key span (the host bound ``max_seq_len``) for which a launch of ``items`` work items
    at ``splits`` uniform splits takes the balanced split (``common.balance``); 0: every span.

    Where the uniform launch's ``items x splits`` programs fit one wave of ``slots`` resident
    programs, they all run at once and the longest holds ``span / splits`` keys in whole tiles
    (``split_bounds``). The balanced plan cuts no unit under ``balance_min_chunk`` keys in whole
    tiles, and its grid is that same wave: up to ``splits`` such chunks of span, its longest
    program cannot hold fewer keys than the uniform launch's longest, so the deal brings only its
    costs (the plan at every program's start, the counters, a chain of merge rounds in a request's
    last unit, up to ``common.balance.unit_cap`` partials, where the uniform launch merges its
    ``splits`` in one combine launch or in fewer rounds). Small batches of short requests: fp8
    4 x [1, 4075] p64 HND 64/8 heads (32 items, 8 splits of 475 keys on 264 slots, the plan's
    units 512 keys merged in 4 rounds of 2) ran 23.9 us uniform against 26.7 balanced on an H200
    (lab/notes/decode-ragged-batches.md "Small batches under the deal")."""
    if items * splits > slots:
        return 0
    chunk = -(-cfg.balance_min_chunk // cfg.block_n) * cfg.block_n
    return splits * chunk + 1


def resident_slots(cfg: DecodeConfig, *, sm_count: int, kv_format: str, head_dim: int, rope_query: bool,
                   balanced: bool = False) -> int:
    """Programs of the split kernel resident at once over ``sm_count`` SMs (one wave): the
    ``occupancy`` estimate, at most ``cfg.max_per_sm`` an SM where the config caps it. A balanced
    launch has at least this many programs (``plan._Plan.balance``), so a ragged batch of few
    items deals its units over the whole GPU."""
    per_sm = occupancy(cfg, kv_format, head_dim, rope_query, balanced)
    if cfg.max_per_sm:
        per_sm = min(per_sm, cfg.max_per_sm)
    return sm_count * per_sm


def _fmt(kv_format: str) -> str:
    """The tables' key of a cache format (the format table's ``config_key``)."""
    return BY_NAME[kv_format].config_key


# The special-purpose table measured with RoPE; the others were measured without it.
_ROPE_KINDS = ("rope_stream",)


def _measured(kind: str, arch: str, kv_format: str, head_dim: int, block_m: int, rope: bool) -> bool:
    """Whether the ``kind`` table has an entry for this launch. The special-purpose tables were
    measured for one 16-row block only, RoPE's with RoPE and the others without it."""
    return (rope == (kind in _ROPE_KINDS) and block_m == 16
            and (_fmt(kv_format), head_dim) in KINDS[kind].get(arch, {}))


def wants_long_tiles(arch: str, kv_format: str, head_dim: int, block_m: int, rope: bool, *,
                     page_size: int, items: int, sm_count: int) -> bool:
    """Whether a launch takes the long-tile table (``config(..., "long")``): pages of 64+ tokens,
    or work items that all fit one wave of long-tile programs."""
    if not _measured("long", arch, kv_format, head_dim, block_m, rope):
        return False
    if page_size >= 64:
        return True
    long = config(arch, kv_format, head_dim, block_m, rope, "long")
    return items <= sm_count * occupancy(long, kv_format, head_dim, False)


def main_replaces_long(arch: str, kv_format: str, head_dim: int, block_m: int, rope: bool, *, sm_count: int,
                       bandwidth: float) -> bool:
    """Whether a launch the long tiles would take (``wants_long_tiles``) takes the main table's
    instead: on a GPU whose peak copy bandwidth (``bandwidth`` bytes/s, 0 where unknown) over its
    ``sm_count`` SMs is past the long table's ``long_max_sm_gbps`` (``LONG_MAX_SM_GBPS``: an H200,
    not an H100). An unknown bandwidth keeps the long tiles, as measured on the H100."""
    if not _measured("long", arch, kv_format, head_dim, block_m, rope):
        return False
    long = config(arch, kv_format, head_dim, block_m, rope, "long")
    return past_sm_bandwidth(bandwidth, sm_count, long.long_max_sm_gbps)


def wants_few_item_tiles(arch: str, kv_format: str, head_dim: int, block_m: int, rope: bool, *, items: int,
                         sm_count: int) -> bool:
    """Whether a launch takes the few-items table (``config(..., "few")``): at most one work item
    an SM."""
    return _measured("few", arch, kv_format, head_dim, block_m, rope) and items <= sm_count


def has_short_tiles(arch: str, kv_format: str, head_dim: int, block_m: int, rope: bool, *,
                    page_size: int) -> bool:
    """Whether a launch takes the short-request table (``config(..., "short")``) for key spans of
    at most ``SHORT_SPAN``: for 16-bit caches only on pages of 64+ tokens (where the long tiles
    are the rule otherwise)."""
    if not _measured("short", arch, kv_format, head_dim, block_m, rope):
        return False
    return page_size >= _SHORT_MIN_PAGE[_fmt(kv_format)]


def wants_stream_tiles(arch: str, kv_format: str, head_dim: int, block_m: int, rope: bool, *, items: int,
                       sm_count: int) -> bool:
    """Whether a launch may take the streaming table (``config(..., "stream")``), for spans whose
    K/V bytes are at most ``STREAM_MAX_L2`` L2 sizes: a long-tile launch would split every one of
    its ``items`` (at most half a wave of them)."""
    if not _measured("stream", arch, kv_format, head_dim, block_m, rope):
        return False
    long = config(arch, kv_format, head_dim, block_m, rope, "long")
    return 2 * items <= sm_count * occupancy(long, kv_format, head_dim, False)


def wants_one_row_tiles(kind: str, arch: str, kv_format: str, head_dim: int, block_m: int, rope: bool, *,
                        paged: bool, rows: int) -> bool:
    """Whether a launch takes the ``kind`` table of one-row launches over a contiguous cache
    (single decode with one query head a KV head), as measured: ``"contig"`` for spans past the
    streaming tiles, ``"rope_stream"`` for RoPE's spans within ``stream_span`` (the launcher reads
    by TMA only where TMA's alignment rules hold; elsewhere the same tiles run without the hint)."""
    return _measured(kind, arch, kv_format, head_dim, block_m, rope) and not paged and rows == 1


def stream_split_limit(stream: DecodeConfig, *, batch: int, sm_count: int, bandwidth: float) -> int:
    """Keys a split of the ``stream`` tiles may hold at most (0: any) in a launch of ``batch``
    requests, on a GPU of peak copy bandwidth ``bandwidth`` (bytes/s, 0 where unknown) over
    ``sm_count`` SMs: ``stream_split_keys`` for several requests past the long table's
    ``long_max_sm_gbps`` (an H200), else no limit (one request; an H100, as measured).

    On an H200 the unpipelined streaming tiles lost to the main table's on the sweep's few-request
    rows whose splits are long, and won where they are short, same run: 921-1453 keys a split
    10-16 % slower (a long request among short ones: the short ones' programs end at once and
    leave the long one's alone on their SMs, where only a pipeline keeps copies in flight),
    231-695 keys 4-16 % faster. One request of 32768 keys (993 a split, every program busy, two
    an SM) stayed 5 % faster on the streaming tiles (lab/notes/decode-ragged-batches.md "The
    streaming tiles against the lanes")."""
    if batch <= 1 or not past_sm_bandwidth(bandwidth, sm_count, stream.long_max_sm_gbps):
        return 0
    return stream.stream_split_keys


def stream_span(*, batch: int, num_kv_heads: int, row_bytes: float, l2_bytes: int) -> int:
    """Longest key span a streaming launch takes: K and V of ``batch x num_kv_heads`` rows of
    ``row_bytes`` a token, at most ``STREAM_MAX_L2`` times ``l2_bytes`` in all."""
    return int(STREAM_MAX_L2 * l2_bytes // max(1, batch * num_kv_heads * 2 * row_bytes))


@functools.lru_cache(maxsize=None)
def config(arch: str, kv_format: str, head_dim: int, block_m: int, rope: bool, kind: str = "main") -> DecodeConfig:
    """The launch config from the ``kind`` table (``KINDS``; GPUs without a main table of their own
    use ``"default"``), adjusted for RoPE and the accumulator's size."""
    fmt = _fmt(kv_format)
    tables = KINDS[kind]
    table = tables.get(arch, _DEFAULT) if kind == "main" else tables[arch]
    block_n, warps, stages = table[(fmt, head_dim)]
    if rope:
        # RoPE keeps two float32 [BLOCK_N, D/2] cos/sin tables live (and one-row programs a square
        # [BLOCK_N, BLOCK_N] score tile): halve the tile. Measured on an H100: 64 was slower.
        block_n = max(16, block_n // 2)
    if block_m * head_dim >= 64 * 128:
        warps = max(warps, 8)  # the [BLOCK_M, D] float32 accumulator
    sm90 = arch == "sm90"
    # RoPE on sm90, measured on an H100 (lab/notes/single-decode.md "Single decode: RoPE split count and programs an SM"):
    # - at most 3 pipeline stages, and a split count planned for two programs an SM although four
    #   fit (half as many programs, each twice as long): single decode 4096 / 32768 / 131072 42.9 /
    #   202.1 / 744.6 us with 4 stages and four an SM, 39.4 / 193.1 / 713.1 with 3 and two;
    # - an L2 prefetch of the first tile, which only RoPE's setup is long enough to hide (4096
    #   44.0 -> 43.0 us; NONE and deeper prefetches equal or slower).
    sm90_rope = sm90 and rope
    if sm90_rope:
        stages = min(stages, 3)
    # The short-request tiles (spans of at most SHORT_SPAN keys: 16 64-key tiles a program at most)
    # keep fp8's query rows in M: on an H200 256 x 1024 p16 171.3 -> 162.4 us and 3 requests of at
    # most 370 keys 11.6 -> 11.2 with them, where long programs lose by 5-7 % (64 x 8192 p16 320 ->
    # 344, sw36 704 -> 752; lab/notes/formats.md "Formats: rows in M at 8 rows for short requests").
    main_sm90 = sm90 and kind == "main" and not rope
    three_an_sm = _SM90_THREE_AN_SM_STAGES.get((fmt, head_dim), 0) if main_sm90 else 0
    contig_stages = _SM90_CONTIG_PIPELINED_STAGES.get((fmt, head_dim), 0) if sm90 and kind == "contig" else 0
    rope_wide = _SM90_ROPE_WIDE.get((fmt, head_dim), 0) if sm90_rope and kind in ("main", "rope_stream") else 0
    cfg = DecodeConfig(block_n, warps, stages, pdl=sm90, dot_single_row=arch != "interpreter",
                       keys_in_m=kind != "short", tail_splits=TAIL_SPLITS if sm90 else 0,
                       combine_stages=three_an_sm, one_row_stages=three_an_sm or contig_stages,
                       rope_wide_block_n=rope_wide,
                       prefetch=1 if sm90_rope else 0, max_per_sm=2 if sm90_rope else 0,
                       evict_first=kind in ("stream", "rope_stream"), tma=kind == "rope_stream")
    if _override:
        cfg = replace(cfg, **_override)
    return cfg
