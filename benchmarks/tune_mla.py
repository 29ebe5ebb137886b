"""Tune the MLA decode kernel: time launch-config variants on the MLA benchmark shapes.

Each variant replaces fields of :class:`kvattn.ops.mla.configs.MLAConfig` (``block_h`` included)
for every call; shapes and inputs come from the benchmark registry. Times are medians of
CUDA-graph replays (``do_bench``, L2 flushed); the winners go into ``src/kvattn/ops/mla/configs.py``.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/tune_mla.py --filter "Hq128 64x4096" --variants default,bn16s3

``--sweep`` times the sweep's MLA rows (``benchmarks/sweep.py``: ragged lengths, pages of 16, 32
and 64) instead of the registry's (pages of 64 only), e.g. a timing floor over pages of 16::

    PYTHONPATH=src python benchmarks/tune_mla.py --sweep --filter sw77 --variants default,ws_nocopies
"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

from benchmarks import mla_ws_floors, shapes, sweep, tuning  # noqa: E402

VARIANTS = {
    "default": {},
    # BLOCK_H 64 (Hq >= 64): bf16 table entry (32, 8, 3); fp8 query + fp8 cache (fp8 scores) (32, 8, 3)
    "bn32s2": {"block_n": 32, "num_stages": 2},
    "bn32s3": {"block_n": 32, "num_stages": 3},
    "bn32s4": {"block_n": 32, "num_stages": 4},  # bf16: 216 KB, 249 regs; fp8 scores: 128 KB, 242 regs
    "bn64s3": {"block_n": 64, "num_stages": 3},  # fp8 scores only (255 regs, no spill); bf16 spills
    "bn16s3": {"block_n": 16, "num_stages": 3},
    "bn16s4": {"block_n": 16, "num_stages": 4},
    # fp8 query + fp8 cache on the float16-operand path (BLOCK_H 32, the previous default): A/B
    # fp8 query + fp8 cache with few heads (Hq <= 32): fp8 scores at BLOCK_H 64, rows past Hq padded
    "fp8qk64": {"qk_fp8": True, "block_h": 64, "block_n": 64, "num_stages": 3},
    "fp8qk64s2": {"qk_fp8": True, "block_h": 64, "block_n": 32, "num_stages": 3},
    "fp8f16": {"qk_fp8": False, "block_h": 32, "block_n": 64, "num_stages": 3},
    # BLOCK_H 16 / 32 (memory-bound); the table's entry is (64, 8, 3)
    "bn64s2": {"block_n": 64, "num_stages": 2},
    "bn32s4p2": {"block_n": 32, "num_stages": 4, "programs_per_sm": 2},
    "w2": {"waves": 2},
    # heads in the N dim (S^T = K Q^T, O^T = V^T P^T): wgmma with M = keys at any Hq, no padded heads.
    # Local sm_90a compiles: bf16 (64, 4, 2) 168 regs 164 KB, (64, 8, 2) 186 regs 164 KB ((64, 4, 3)
    # needs 236 KB); fp8 scores (64, 8, 2|3|4) 176-178 regs, 51 / 87 / 123 KB (4 warps: 255 regs + spills)
    "hn16s2": {"heads_as_n": True, "block_h": 16, "block_n": 64, "num_warps": 4, "num_stages": 2},
    "hn16w8s2": {"heads_as_n": True, "block_h": 16, "block_n": 64, "num_warps": 8, "num_stages": 2},
    "fp8hn16": {"heads_as_n": True, "qk_fp8": True, "block_h": 16, "block_n": 64, "num_warps": 8, "num_stages": 3},
    "fp8hn16s2": {"heads_as_n": True, "qk_fp8": True, "block_h": 16, "block_n": 64, "num_warps": 8,
                  "num_stages": 2},
    "fp8hn16n32": {"heads_as_n": True, "qk_fp8": True, "block_h": 16, "block_n": 32, "num_warps": 4,
                   "num_stages": 3},
    "fp8hn16n32s4": {"heads_as_n": True, "qk_fp8": True, "block_h": 16, "block_n": 32, "num_warps": 4,
                     # tried with a split/join P.V conversion (since reverted):
                     # lab/notes/mla.md "MLA: heads in N for few heads"
                     "num_stages": 4},
    # score products unchained (layout fences, mla/kernels.py _mla_tile_scores): each warpgroup computes
    # half of the score tile's N instead of all of it. Local sm_90a compiles (regs, shared memory):
    # bf16 (32, 8, 3) 255 / 184 KB, (32, 8, 2) 255 / 148 KB, (64, 8, 2) 255 + 8 B stack / 224 KB;
    # heads in N (64, 8, 2) 255 + 32 B / 224 KB; fp8 scores (64, 8, 3) 254 / 184 KB, (64, 8, 2) 253 /
    # 148 KB, (64, 8, 4) 254 / 220 KB, (32, 8, 3) 251 / 128 KB; fp8 heads in N at 16 heads 223 / 87 KB
    "sp32s3": {"split_scores": True, "block_n": 32, "num_stages": 3},
    "sp32s2": {"split_scores": True, "block_n": 32, "num_stages": 2},
    "sp32s4": {"split_scores": True, "block_n": 32, "num_stages": 4},
    "sp64s2": {"split_scores": True, "block_n": 64, "num_stages": 2},
    "sp64s3": {"split_scores": True, "block_n": 64, "num_stages": 3},
    "sp64s4": {"split_scores": True, "block_n": 64, "num_stages": 4},
    # 16 warps (four warpgroups, 128 registers a thread): bf16 (64, 16, 2) 88 B stack, (32, 16, 3) 8 B;
    # fp8 scores (64, 16, 3) 56 B
    "sp64w16s2": {"split_scores": True, "block_n": 64, "num_warps": 16, "num_stages": 2},
    "sp32w16s3": {"split_scores": True, "block_n": 32, "num_warps": 16, "num_stages": 3},
    "sp64w16s3": {"split_scores": True, "block_n": 64, "num_warps": 16, "num_stages": 3},
    "hnsp64s2": {"split_scores": True, "heads_as_n": True, "block_n": 64, "num_stages": 2},
    # bf16 at 16 heads, heads in N with split scores: (64, 8, 2) 128 regs, 164 KB ((64, 8, 3) 236 KB: too much)
    "hnsp16s2": {"split_scores": True, "heads_as_n": True, "block_h": 16, "block_n": 64, "num_warps": 8,
                 "num_stages": 2},
    "fp8hn16sp": {"split_scores": True, "heads_as_n": True, "qk_fp8": True, "block_h": 16, "block_n": 64,
                  "num_warps": 8, "num_stages": 3},
    "fp8hn16s4": {"heads_as_n": True, "qk_fp8": True, "block_h": 16, "block_n": 64, "num_warps": 8,
                  "num_stages": 4},
    # the table's config on the Triton kernel where the Gluon one would run (KVATTN_GLUON=0)
    "triton": {"_env": {"KVATTN_GLUON": "0"}},
    # mla/kernels_gluon.py's kernel where the warp-specialised one (mla/kernels_gluon_ws.py) would run
    # (KVATTN_GLUON_WS=0). For an fp8 query over an fp8 cache, "gluon" and "triton" both run the
    # Triton kernel's fp8 scores.
    "gluon": {"_env": {"KVATTN_GLUON_WS": "0"}},
    # Timing floors of the warp-specialised kernel (wrong results, timing only): a patched copy of
    # its source built by benchmarks/mla_ws_floors.py runs in its place. (The schedule variants
    # measured once, S_B not staggered behind S_A and P_A read from shared memory, are recorded in
    # lab/notes/mla.md "MLA: seesaw (warp-specialised Gluon kernel)"; the kernel keeps the schedule taken.)
    "ws_nocopies": {"_ws_floor": "nocopies"},
    "ws_nopv": {"_ws_floor": "nopv"},
    "ws_noscores": {"_ws_floor": "noscores"},
    # the e4m3 form only: no float16 conversion of the values (P.V reads stale buffers)
    "ws_noconvert": {"_ws_floor": "noconvert"},
    # the epilogue's stores off (what a program's output rows cost at its end)
    "ws_nostore": {"_ws_floor": "nostore"},
    # the final rows straight from the accumulator (the before form of the staged final rows)
    "ws_syncstore": {"_ws_floor": "syncstore"},
    # fp8 at 16-32 heads: the warp-specialised kernel's e4m3 form (rows padded to 64) in place of
    # the table's heads-in-N Triton kernel, and that form without its value conversion: issue 41's
    # fp8 bound (1.7x bf16) against the conversion (lab/notes/mla.md "MLA: 16-64 heads, MTP and fp8
    # 16 heads beside FlashInfer (H200)")
    "fp8ws": {"qk_fp8": True, "heads_as_n": False, "block_h": 64, "block_n": 64, "num_warps": 8, "num_stages": 3},
    "fp8ws_noconvert": {"qk_fp8": True, "heads_as_n": False, "block_h": 64, "block_n": 64, "num_warps": 8,
                        "num_stages": 3, "_ws_floor": "noconvert"},
}


def main(argv=None, grid=None) -> int:
    """``grid``: the shapes to time (default: the registry's MLA shapes, or the sweep's with
    ``--sweep``), before ``--filter``."""
    args = tuning.parse_args(__doc__, argv, extra=lambda ap: ap.add_argument(
        "--sweep", action="store_true", help="the sweep's MLA rows (benchmarks/sweep.py) instead of the registry's"))
    if grid is None:
        grid = [s for s in sweep.SWEEP if s.suite == "mla"] if args.sweep else shapes._mla_grid()
    from kvattn.ops.mla import configs as mla_configs
    from kvattn.ops.mla import plan as mla_launch

    def context_for(shape, name):
        @contextlib.contextmanager
        def context(fields=VARIANTS[name]):
            fields = dict(fields)
            mla_launch._PLANS.clear()  # plans hold their configs (and the environment switches)
            floor = fields.pop("_ws_floor", None)
            kernel = mla_ws_floors.floor_kernel(floor) if floor else mla_launch.mla_gluon_ws_kernel
            try:
                with mock.patch.dict(os.environ, fields.pop("_env", {})), mla_configs.override(**fields), \
                        mock.patch.object(mla_launch, "mla_gluon_ws_kernel", kernel):
                    yield
            finally:
                mla_launch._PLANS.clear()
        return context

    tuning.time_variants(grid, args, context_for, workspace_mib=256)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
