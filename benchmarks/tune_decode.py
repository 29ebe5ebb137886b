"""Tune the decode kernels: time launch-config variants on the decode target shapes.

Each variant replaces fields of :class:`kvattn.ops.decode.configs.DecodeConfig` (tile, warps,
pipelining depth, split heuristic, PDL) for every call; shapes and inputs come from the benchmark
registry (``benchmarks/shapes.py``, ``benchmarks/problems.py``). Times are medians of CUDA-graph
replays (``do_bench``, L2 flushed), fractions are of the copy bandwidth measured in the same run.
The table that ends the output is what goes into ``lab/notes/decode.md`` (Decode, Single decode); the winning values go
into the config table of ``src/kvattn/ops/decode_configs.py``.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/tune_decode.py --out $OUT/tune.json
    PYTHONPATH=src python benchmarks/tune_decode.py --variants default,bn128 --filter "64x8192"

``--sweep`` times the sweep's paged decode rows (``benchmarks/sweep.py``) instead of :data:`SHAPES`;
a ``--filter`` may list several substrings, comma-separated. The ``floor_*`` variants launch a
timing floor of the split kernel (a patched copy of its source, ``benchmarks/decode_floors.py``)
in place of the library's, e.g. two fp8 rows and a ragged bf16 row::

    PYTHONPATH=src python benchmarks/tune_decode.py --sweep --filter "sw36 ,sw49 ,sw07 " \\
        --variants default,floor_rows64,floor_fp8mma_k,floor_nomerge,floor_mergecount,floor_noloads

A floor that does not apply to a row's cache (the fp8 floors on a bf16 cache) is reported as
skipped, not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from unittest import mock

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402

from benchmarks import decode_floors, problems, sweep  # noqa: E402
from benchmarks.ceilings import copy_gbps  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402
from kvattn.benchmarking import records  # noqa: E402
from kvattn.benchmarking.measure import rel_err  # noqa: E402
from kvattn.benchmarking.timing import Timer, back_to_back_us  # noqa: E402

# Largest relative difference from the table's output a variant may show (bfloat16 outputs; the
# split count changes the summation order) before it is flagged as computing something else.
MAX_REL_DIFF = 1e-2

VARIANTS = {
    "default": {},
    "stages2": {"num_stages": 2},
    "stages4": {"num_stages": 4},
    "warps8": {"num_warps": 8},
    "bn32": {"block_n": 32},
    "bn128": {"block_n": 128},
    "bn128w8": {"block_n": 128, "num_warps": 8},
    "chunk512": {"min_chunk": 512},
    "stages5": {"num_stages": 5},
    "w8s4": {"num_warps": 8, "num_stages": 4},
    "stages3": {"num_stages": 3},
    "bn64": {"block_n": 64},
    "inline5": {"page_ahead": False, "num_stages": 5},
    "inline6": {"page_ahead": False, "num_stages": 6},
    "nopdl": {"pdl": False},
    "cuda1": {"dot_single_row": False},
    "w8bn32": {"num_warps": 8, "block_n": 32},
    "w8bn64": {"num_warps": 8, "block_n": 64},
    "bn16": {"block_n": 16},
    "s3bn64": {"num_stages": 3, "block_n": 64},
    "s2bn64": {"num_stages": 2, "block_n": 64},
    "s4bn64": {"num_stages": 4, "block_n": 64},
    "w8s3bn128": {"num_warps": 8, "num_stages": 3, "block_n": 128},
    "s3": {"num_stages": 3},
    "w2": {"waves": 2},
    "w8s4bn128": {"num_warps": 8, "num_stages": 4, "block_n": 128},
    "w8s3bn128w2": {"num_warps": 8, "num_stages": 3, "block_n": 128, "waves": 2},
    "w8s2bn256": {"num_warps": 8, "num_stages": 2, "block_n": 256},
    "w8s3bn128c1k": {"num_warps": 8, "num_stages": 3, "block_n": 128, "min_chunk": 1024},
    "w3": {"waves": 3},
    "w2c128": {"waves": 2, "min_chunk": 128},
    "bn128s3": {"block_n": 128, "num_stages": 3},
    "bn32s4": {"block_n": 32, "num_stages": 4},
    "bn32s6": {"block_n": 32, "num_stages": 6},
    "w4": {"waves": 4},
    "w8": {"waves": 8},
    # Not a config: the split kernel alone, the combine launch skipped (outputs wrong), to see
    # what the second launch costs the split shapes.
    "nocombine": {"_no_combine": True},
    # fp8 caches of <= 8 query rows a KV head: the rows in the products' M dim (8 rows a program, the
    # kernel every floor runs on) instead of the keys
    "rows": {"keys_in_m": False},
}
# Whole tiles "tBLOCKN_WARPS_STAGES", whichever table the shape would use. Each variant's output is
# compared with the table's (flagged when off), but before a table takes one the GPU tests must
# pass with it (NVFP4 with 16-key tiles ran fast and computed wrong results, lab/notes/formats.md "Formats: NVFP4 in decode").
_TILES = [(64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 4, 5), (32, 4, 4), (32, 4, 6), (128, 4, 2), (128, 4, 3),
          (128, 4, 4), (128, 8, 2), (128, 8, 3), (128, 8, 4), (64, 8, 4), (32, 4, 3), (32, 4, 5), (16, 4, 4),
          (16, 4, 6), (32, 8, 4), (32, 2, 4), (16, 2, 4), (32, 2, 6), (16, 1, 4), (16, 1, 6), (16, 2, 3), (16, 2, 6),
          (16, 2, 8), (32, 1, 4), (32, 2, 3), (64, 2, 4), (64, 1, 4), (16, 1, 3), (16, 1, 5), (16, 1, 8), (16, 1, 10),
          (32, 1, 6), (32, 1, 3), (16, 2, 5), (32, 2, 5)]
VARIANTS.update({f"t{bn}_{w}_{st}": {"block_n": bn, "num_warps": w, "num_stages": st} for bn, w, st in _TILES})
# Unpipelined K/V loads (num_stages 1) with and without the L2 evict_first hint they can carry;
# "pipelined" is the long-tile entry the streaming one replaced.
VARIANTS.update({
    "stream128": {"block_n": 128, "num_warps": 8, "num_stages": 1, "evict_first": True},
    "stream64": {"block_n": 64, "num_warps": 4, "num_stages": 1, "evict_first": True},
    "stream128nohint": {"block_n": 128, "num_warps": 8, "num_stages": 1, "evict_first": False},
    "stream128w2": {"block_n": 128, "num_warps": 8, "num_stages": 1, "evict_first": True, "waves": 2},
    "pipelined": {"block_n": 128, "num_warps": 8, "num_stages": 3, "evict_first": False},
    "stream32": {"block_n": 32, "num_warps": 4, "num_stages": 1, "evict_first": True},
    "stream16": {"block_n": 16, "num_warps": 4, "num_stages": 1, "evict_first": True},
    "stream32pf": {"block_n": 32, "num_warps": 4, "num_stages": 1, "evict_first": True, "prefetch": 1},
})
# The lanes plan's request cap (a request's lanes at most; 0: the merge's unit cap) and the deal.
VARIANTS.update({"cap64": {"balance_lanes_cap": 64}, "cap128": {"balance_lanes_cap": 128},
                 "cap256": {"balance_lanes_cap": 256}, "deal": {"balance_lanes": False}})
# Split count caps, and more waves of the long / main tiles (load balance of few, long programs).
VARIANTS.update({
    "split12": {"max_splits": 12},
    "split8": {"max_splits": 8},
    "split4": {"max_splits": 4},
    "split2": {"max_splits": 2},
    "split1": {"max_splits": 1},
    "long_w4": {"block_n": 128, "num_warps": 8, "num_stages": 3, "waves": 4},
    "t64_4_4w2": {"block_n": 64, "num_warps": 4, "num_stages": 4, "waves": 2},
    "t64_4_4w4": {"block_n": 64, "num_warps": 4, "num_stages": 4, "waves": 4},
    "cap1": {"max_per_sm": 1},
    "cap2": {"max_per_sm": 2},
    "cap3": {"max_per_sm": 3},
    "cap4": {"max_per_sm": 4},
    "t64_4_4cap2": {"block_n": 64, "num_warps": 4, "num_stages": 4, "max_per_sm": 2},
    "t64_4_3cap2": {"block_n": 64, "num_warps": 4, "num_stages": 3, "max_per_sm": 2},
    "t32_4_3cap2": {"block_n": 32, "num_warps": 4, "num_stages": 3, "max_per_sm": 2},
    "t32_4_2cap2": {"block_n": 32, "num_warps": 4, "num_stages": 2, "max_per_sm": 2},
    "t32_4_3cap3": {"block_n": 32, "num_warps": 4, "num_stages": 3, "max_per_sm": 3},
    "t32_4_3cap4": {"block_n": 32, "num_warps": 4, "num_stages": 3, "max_per_sm": 4},
    "t32_4_3cap2pf0": {"block_n": 32, "num_warps": 4, "num_stages": 3, "max_per_sm": 2, "prefetch": 0},
    "t32_8_3cap2": {"block_n": 32, "num_warps": 8, "num_stages": 3, "max_per_sm": 2},
    "t64_8_3cap2": {"block_n": 64, "num_warps": 8, "num_stages": 3, "max_per_sm": 2},
    "t16_4_3cap2": {"block_n": 16, "num_warps": 4, "num_stages": 3, "max_per_sm": 2},
    "rope_stream32c2": {"block_n": 32, "num_warps": 4, "num_stages": 1, "evict_first": True, "max_per_sm": 2},
    "rope_stream32c3": {"block_n": 32, "num_warps": 4, "num_stages": 1, "evict_first": True, "max_per_sm": 3},
    "rope_stream32c4": {"block_n": 32, "num_warps": 4, "num_stages": 1, "evict_first": True, "max_per_sm": 4},
    "rope_stream16c4": {"block_n": 16, "num_warps": 4, "num_stages": 1, "evict_first": True, "max_per_sm": 4},
    "rope_stream64c2": {"block_n": 64, "num_warps": 4, "num_stages": 1, "evict_first": True, "max_per_sm": 2},
    "rope_stream64c3": {"block_n": 64, "num_warps": 4, "num_stages": 1, "evict_first": True, "max_per_sm": 3},
    "rope_stream64c4": {"block_n": 64, "num_warps": 4, "num_stages": 1, "evict_first": True, "max_per_sm": 4},
    "rope_stream64w8c2": {"block_n": 64, "num_warps": 8, "num_stages": 1, "evict_first": True, "max_per_sm": 2},
    "rope_stream128w8c1": {"block_n": 128, "num_warps": 8, "num_stages": 1, "evict_first": True, "max_per_sm": 1},
    "rope_stream128w8c2": {"block_n": 128, "num_warps": 8, "num_stages": 1, "evict_first": True, "max_per_sm": 2},
    "rope_t64_4_3c2": {"block_n": 64, "num_warps": 4, "num_stages": 3, "max_per_sm": 2},
    "rope_stream32w8c2": {"block_n": 32, "num_warps": 8, "num_stages": 1, "evict_first": True, "max_per_sm": 2},
    "stream128nohint_w2": {"block_n": 128, "num_warps": 8, "num_stages": 1, "evict_first": False, "waves": 2},
})
# NVFP4 one-warp tiles with fewer, longer splits
VARIANTS.update({
    "t16_1_6c512": {"block_n": 16, "num_warps": 1, "num_stages": 6, "min_chunk": 512},
    "t16_1_6c1k": {"block_n": 16, "num_warps": 1, "num_stages": 6, "min_chunk": 1024},
    "t16_1_6w2": {"block_n": 16, "num_warps": 1, "num_stages": 6, "max_per_sm": 2},
    "t16_1_6w4": {"block_n": 16, "num_warps": 1, "num_stages": 6, "max_per_sm": 4},
})
# NVFP4 tiles with the block scales read as 32-bit words (the launcher's choice on aligned
# caches), and "+bytes": the same tile with the scales read byte by byte (the unaligned path).
_NVFP4_TILES = [(32, 1, 3), (32, 1, 4), (32, 1, 6), (32, 2, 3), (32, 2, 4), (32, 4, 4), (64, 1, 4), (64, 2, 4),
                (64, 4, 4), (64, 4, 3), (128, 4, 3), (32, 1, 2), (32, 2, 2), (64, 1, 2), (64, 2, 3)]
VARIANTS.update({f"t{bn}_{w}_{st}": {"block_n": bn, "num_warps": w, "num_stages": st} for bn, w, st in _NVFP4_TILES})
VARIANTS.update({f"t{bn}_{w}_{st}+bytes": {"block_n": bn, "num_warps": w, "num_stages": st, "_sf_bytes": True}
                 for bn, w, st in _NVFP4_TILES})
VARIANTS["default+bytes"] = {"_sf_bytes": True}
# L2 prefetch of a contiguous cache's first tiles at a program's start (0: off).
VARIANTS.update({f"pf{n}": {"prefetch": n} for n in (0, 1, 2, 4, 8)})
# Small-batch paged shapes in the pattern of the best paged bare reads (benchmarks/read_floor.py:
# 16x4096 read fastest as 8 splits of 64-key, 4-warp, unpipelined programs).
VARIANTS.update({
    "stream64nohint": {"block_n": 64, "num_warps": 4, "num_stages": 1, "evict_first": False},
    "stream64w2": {"block_n": 64, "num_warps": 4, "num_stages": 1, "evict_first": True, "waves": 2},
    "t64_4_2": {"block_n": 64, "num_warps": 4, "num_stages": 2},
    "long_w2": {"block_n": 128, "num_warps": 8, "num_stages": 3, "waves": 2},
})
# Many short unpipelined programs without the hint (the fastest bare per-head read of single decode
# 32768's bytes: 64 splits a head of 32-key, 4-warp programs; lab/notes/method.md "Method: read floors").
VARIANTS.update({f"stream{bn}nohint_w{w}": {"block_n": bn, "num_warps": 4, "num_stages": 1, "evict_first": False,
                                            "waves": w} for bn in (16, 32, 64) for w in (1, 2, 4)})
VARIANTS.update({
    "stream64nohint_c3": {"block_n": 64, "num_warps": 4, "num_stages": 1, "evict_first": False, "max_per_sm": 3},
    "stream64w8nohint": {"block_n": 64, "num_warps": 8, "num_stages": 1, "evict_first": False},
})
# Contiguous 16-bit caches read by TMA (the table's tiles, and pipelined tiles that lost to the
# hinted streaming ones), with and without the L2 evict_first hint (runtime/ptx_hints.py).
VARIANTS.update({
    "tma": {"tma": True},
    "tma_hint": {"tma": True, "evict_first": True},
    "tma_hint_pf0": {"tma": True, "evict_first": True, "prefetch": 0},
    "long_tma_hint": {"block_n": 128, "num_warps": 8, "num_stages": 3, "tma": True, "evict_first": True},
    "long_tma": {"block_n": 128, "num_warps": 8, "num_stages": 3, "tma": True},
    "t64_4_3tma_hint": {"block_n": 64, "num_warps": 4, "num_stages": 3, "tma": True, "evict_first": True},
    "t64_4_4tma_hint": {"block_n": 64, "num_warps": 4, "num_stages": 4, "tma": True, "evict_first": True},
    "t32_4_4tma_hint": {"block_n": 32, "num_warps": 4, "num_stages": 4, "tma": True, "evict_first": True},
    "t64_8_3tma_hint": {"block_n": 64, "num_warps": 8, "num_stages": 3, "tma": True, "evict_first": True},
})
# Split partials merged by the combine launch instead of the split kernel's last program.
VARIANTS["combine"] = {"_env": {"KVATTN_FUSED_MERGE": "0"}}
# Timing floors of the split kernel (wrong or approximate results, timing only): a patched copy of
# its source built by benchmarks/decode_floors.py runs in its place (its docstring says what each
# takes out); "floor_rows64" is the fp8 floors' reference (the kernel on wgmma's 64-row tiles).
VARIANTS.update({f"floor_{floor}": {"_floor": floor} for floor in decode_floors.PATCHES})


def applies(name: str, shape: Shape) -> bool:
    """Whether variant ``name`` times something on ``shape`` (a floor of another cache format's
    kernel does not: reported as skipped)."""
    floor = VARIANTS[name].get("_floor")
    return floor is None or decode_floors.applies(floor, shape.kv_dtype)

SHAPES = [
    Shape("decode", 64, 8192),
    Shape("decode", 128, 2048),
    Shape("decode", 256, 1024),
    Shape("decode", 16, 4096),
    Shape("decode", 32, 4096),
    Shape("decode", 1, 32768),
    Shape("decode", 1, 32768, page_size=64, layout="HND"),
    Shape("decode", 4, 8192),
    Shape("decode", 8, 8192),
    Shape("decode", 64, 8192, page_size=64, layout="HND"),
    Shape("decode", 128, 2048, page_size=64),
    Shape("decode", 256, 1024, page_size=64),
    Shape("decode", 64, 8192, kv_dtype="fp8"),
    Shape("decode", 256, 1024, kv_dtype="fp8"),
    Shape("decode", 64, 8192, kv_dtype="nvfp4"),
    Shape("decode", 64, 8192, kv_dtype="nvfp4", head_dim=64),
    Shape("decode", 32, 8192, kv_dtype="nvfp4", head_dim=256),
    Shape("decode", 16, 4096, kv_dtype="nvfp4"),
    Shape("decode", 1, 32768, kv_dtype="nvfp4"),
    Shape("decode", 32, 8192, kv_dtype="nvfp4"),
    Shape("decode", 16, 4096, kv_dtype="nvfp4", head_dim=64),
    Shape("decode", 1, 32768, kv_dtype="nvfp4", head_dim=64),
    Shape("decode", 16, 4096, kv_dtype="nvfp4", head_dim=256),
    Shape("decode", 1, 32768, kv_dtype="nvfp4", head_dim=256),
    Shape("decode", 64, 8192, num_qo_heads=8, num_kv_heads=1),
    Shape("decode", 128, 8192, ragged=True),
    Shape("decode", 128, 8192, ragged=True, page_size=64),
    Shape("spec_decode", 64, 4096, q_len=1),
    Shape("spec_decode", 64, 4096, q_len=4),
    Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32),
    Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode="ROPE_LLAMA"),
    Shape("single_decode", 1, 16384, num_qo_heads=32, num_kv_heads=32),
    Shape("single_decode", 1, 32768, num_qo_heads=32, num_kv_heads=32),
    Shape("single_decode", 1, 32768, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode="ROPE_LLAMA"),
    Shape("single_decode", 1, 131072, num_qo_heads=32, num_kv_heads=32),
    Shape("single_decode", 1, 131072, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode="ROPE_LLAMA"),
]


@contextlib.contextmanager
def variant(name: str):
    """Apply a variant: its config fields through ``decode_configs.override``; ``_no_combine``
    replaces the combine launch by a no-op; ``_sf_bytes`` reads NVFP4 block scales byte by byte
    even where they could be read as words; ``_env`` sets environment switches; ``_floor`` puts
    a timing floor of the split kernel (``benchmarks/decode_floors.py``) in place of
    ``kvattn.ops.decode.plan.decode_split_kernel``. Cached launch plans are dropped on entry and exit."""
    from kvattn.ops.decode import configs as decode_configs
    from kvattn.ops.decode import plan as decode_launch
    from kvattn._formats_table import BY_NAME

    fields = dict(VARIANTS[name])
    no_combine = fields.pop("_no_combine", False)
    sf_bytes = fields.pop("_sf_bytes", False)
    env = fields.pop("_env", {})
    floor = fields.pop("_floor", None)
    real, real_code = decode_launch._combine_launch, decode_launch.kv_format_code
    real_split = decode_launch.decode_split_kernel
    decode_launch._PLANS.clear()
    if no_combine:
        decode_launch._combine_launch = lambda plan, splits: (lambda call: None)
    if sf_bytes:
        def bytes_code(*args):
            code = real_code(*args)
            nvfp4 = BY_NAME["nvfp4"]
            return nvfp4.kernel_code if code == nvfp4.words_code else code
        decode_launch.kv_format_code = bytes_code
    if floor:
        decode_launch.decode_split_kernel = decode_floors.floor_kernel(floor)
    try:
        with decode_configs.override(**fields), mock.patch.dict(os.environ, env):
            yield
    finally:
        decode_launch._combine_launch, decode_launch.kv_format_code = real, real_code
        decode_launch.decode_split_kernel = real_split
        decode_launch._PLANS.clear()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--filter", action="append", default=[],
                    help="keep shape ids containing this (or any of several, comma-separated)")
    ap.add_argument("--sweep", action="store_true",
                    help="the sweep's paged decode rows (benchmarks/sweep.py) instead of SHAPES")
    ap.add_argument("--eager", action="store_true", help="also time eager calls (default variant)")
    ap.add_argument("--noflush", action="store_true", help="also time back-to-back replays (first 2 variants)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rep", type=int, default=100)
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    shapes = sweep.select(sweep.decode_rows() if args.sweep else SHAPES, sweep.filter_parts(args.filter))
    if not shapes:
        ap.error(f"no shape matches --filter {args.filter}")
    return _run(args, names, shapes)


def _run(args, names: list[str], shapes: list[Shape]) -> int:
    """Time variants ``names`` on ``shapes`` (the GPU run of :func:`main`)."""
    device = torch.device("cuda")
    timer = Timer(device, warmup_ms=25, rep_ms=args.rep)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    env = records.environment(device)
    copy = copy_gbps(timer)
    env["copy_gbps"] = copy
    print(f"# {env['device']} {env['date']} torch {env['torch']} triton {env['triton']} copy {copy:.0f} GB/s",
          flush=True)
    rows = []
    for shape in shapes:
        prob = problems.build(shape, device, l2_bytes=l2, workspace_mib=128)
        fns = [s.kvattn for s in prob.sets]
        row = {"shape": shape.id, "bytes": prob.work.bytes, "graph_us": {}, "rel_diff": {}, "skipped": []}
        # Each variant's output is compared with the table's (which the GPU tests check): a
        # variant that computes something else is flagged, not only timed.
        with variant("default"):
            expected = fns[0]().clone()
        for name in names:
            if not applies(name, shape):
                row["skipped"].append(name)
                print(f"  {shape.id:48s} {name:10s} skipped (a floor of another cache format)", file=sys.stderr,
                      flush=True)
                continue
            t0 = time.perf_counter()
            try:
                us = timer.graph(fns, context=lambda: variant(name))
                with variant(name):
                    diff = rel_err(fns[0](), expected)
            except Exception as exc:  # noqa: BLE001 - a variant that fails to compile is reported
                print(f"  {shape.id} {name}: FAILED {type(exc).__name__}: {exc}"[:300], flush=True)
                continue
            row["graph_us"][name] = us
            row["rel_diff"][name] = diff
            flag = ("  (floor: off by design)" if "_floor" in VARIANTS[name] else "  WRONG") \
                if not diff <= MAX_REL_DIFF else ""
            print(f"  {shape.id:48s} {name:10s} {us:9.1f} us  {prob.work.bytes / us / 1e3 / copy:.3f}"
                  f"  diff {diff:.1e}{flag}  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        if args.eager:
            row["eager_us"] = timer.eager(fns)
        if args.noflush:
            for name in names[:2]:
                row[f"noflush_{name}_us"] = back_to_back_us(fns, lambda: variant(name))
        rows.append(row)
        del prob, fns
        torch.cuda.empty_cache()
    if args.out:
        records.write_json(args.out, {"env": env, "variants": VARIANTS, "rows": rows})

    print(f"\n# graph-replay us (fraction of copy BW {copy:.0f} GB/s); best per shape marked *, "
          f"outputs off the table's by more than {MAX_REL_DIFF:g} marked !")
    print(f"{'shape':48s} " + " ".join(f"{n:>13s}" for n in names) + ("        eager" if args.eager else ""))
    for row in rows:
        t = row["graph_us"]
        best = min(t.values()) if t else None
        cells = []
        for n in names:
            if n not in t:
                cells.append(f"{'skip' if n in row['skipped'] else '-':>13s}")
                continue
            frac = row["bytes"] / t[n] / 1e3 / copy
            mark = "!" if not row["rel_diff"][n] <= MAX_REL_DIFF else ("*" if t[n] == best else " ")
            cells.append(f"{t[n]:7.1f}/{frac:.3f}{mark}")
        eager = f" {row['eager_us']:9.1f}" if "eager_us" in row else ""
        for n in names[:2]:
            if f"noflush_{n}_us" in row:
                us = row[f"noflush_{n}_us"]
                eager += f"  nf-{n} {us:.1f}/{row['bytes'] / us / 1e3 / copy:.3f}"
        print(f"{row['shape']:48s} " + " ".join(cells) + eager)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
