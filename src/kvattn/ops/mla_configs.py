"""Launch configurations of the MLA decode kernel, one table per GPU family.

No runtime autotuning (a tuning pass would stall a serving engine's first calls and cannot run
inside CUDA-graph capture). The sm90 entries were picked from local sm_90a compiles (registers,
spills, shared memory, wgmma vs mma.sync: the comments at the table) and are not
measured yet; ``override`` is the hook for a tuning pass.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, replace

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
    max_splits: int = 64


# (kv format, BLOCK_H) -> (BLOCK_N, num_warps, num_stages, programs per SM). "half" = 16-bit.
# Local sm_90a compiles (Triton 3.6, registers / shared memory / spills):
#   half 64: (32, 8, 2) 249 regs, 144 KB, wgmma, no spill. BLOCK_N 64 spills (255 + 24 B stack);
#            3 stages 180 KB, same registers. Two warpgroups each compute the whole [64, N]
#            score tile (Triton gives a chained dot's M = 64 to all 8 warps): see NOTES.
#   half 32: (64, 8, 3) 182 regs, 184 KB, mma.sync (M < 64: no wgmma), no spill.
#   half 16: (64, 8, 3) 144 regs, 164 KB, mma.sync, no spill; 4 warps hold the query operand in
#            every warp (255 regs + spills), so 8 warps split the 512 output columns finer.
#   fp8 64:  every tile size spills (~330 B: the word -> float16 conversion on top of the
#            accumulator); fp8 caches use BLOCK_H 32 instead (182 regs, 176 KB, no spill).
#   fp8 32 / 16: as half, 182 / 166 regs, no spill.
_SM90 = {
    ("half", 64): (32, 8, 2, 1),
    ("half", 32): (64, 8, 3, 1),
    ("half", 16): (64, 8, 3, 1),
    ("fp8", 32): (64, 8, 3, 1),
    ("fp8", 16): (64, 8, 3, 1),
}
_BLOCK_H_CAP = {"sm90": {"half": 64, "fp8": 32}}
_DEFAULT = {key: (bn, w, 2, 1) for key, (bn, w, _, _) in _SM90.items()} | {("fp8", 64): (32, 8, 2, 1)}
# Small tiles in the interpreter, so CI runs multi-tile loops over several pages.
_INTERPRETER = {(fmt, bh): (16, 4, 1, 1) for fmt in ("half", "fp8") for bh in (16, 32, 64)}
TABLES = {"sm90": _SM90, "default": _DEFAULT, "interpreter": _INTERPRETER}

_override: dict = {}


@contextlib.contextmanager
def override(**fields):
    """Replace config fields (``block_h`` too) for the duration of a ``with`` block (tuning, tests)."""
    old = dict(_override)
    _override.update(fields)
    config.cache_clear()
    try:
        yield
    finally:
        _override.clear()
        _override.update(old)
        config.cache_clear()


def _fmt(kv_format: str) -> str:
    return "fp8" if kv_format == "fp8" else "half"


def _next_power_of_2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


@functools.lru_cache(maxsize=None)
def config(arch: str, kv_format: str, num_heads: int) -> MLAConfig:
    """The config of a launch: ``BLOCK_H`` = the head count rounded up to a power of 2 in
    ``[16, cap]`` (cap 64, or the table's lower one), then the table's entry for it."""
    fmt = _fmt(kv_format)
    cap = _BLOCK_H_CAP.get(arch, {}).get(fmt, MAX_BLOCK_H)
    block_h = min(max(MIN_BLOCK_H, _next_power_of_2(num_heads)), cap)
    if "block_h" in _override:
        block_h = _override["block_h"]
    table = TABLES.get(arch, _DEFAULT)
    block_n, warps, stages, per_sm = table[(fmt, block_h)]
    cfg = MLAConfig(block_h, block_n, warps, stages, per_sm)
    if _override:
        cfg = replace(cfg, **_override)
    return cfg


def num_splits(cfg: MLAConfig, *, items: int, span: int, sm_count: int, fit: int) -> int:
    """KV splits per work item (request x head block).

    Enough programs for ``cfg.waves`` whole waves of resident programs, rounded down (the programs
    are equally long: a partly filled last wave costs nearly a whole program's time, see
    decode_configs.num_splits); no split shorter than ``min_chunk`` keys and no more partials than
    the workspace holds (``fit``).
    """
    items = max(items, 1)
    want = max(1, cfg.waves * sm_count * cfg.programs_per_sm // items)
    useful = max(1, -(-span // cfg.min_chunk))
    return max(1, min(want, useful, cfg.max_splits, fit))
