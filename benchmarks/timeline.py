"""Per-program timelines of decode launches, in the benchmark's measurement (L2 flushed, graph replay).

Where the time of a split launch goes. Every program of the split kernel stamps (``%globaltimer``)
its entry, its exit from the grid-dependency wait and its end, with its SM (``%smid``); every work
item it runs (a balanced launch's dealt unit, for one KV head and row block) stamps when it was
claimed (the top of the deal loop's iteration: the program's first item at its start, later ones
when the counter's ``atom.add`` returned) and when its partial (or its final rows) were stored,
with its request, chunk, chunk count and key range; the last program of a request stamps the start
and end of its in-kernel merge; the combine kernel, where a launch has one, stamps its programs.
Bare reads of the same bytes, with a static grid-stride split and with blocks claimed from an
atomic counter, are traced the same way for comparison (registry shapes only).

The package is not changed: ``decode/kernels.py`` and ``common/combine.py`` are patched as text
(each replaced text must occur exactly once, so a kernel edit that moves it fails loudly) and
loaded as sibling modules (``benchmarks/patched_kernels.py``, as ``decode_floors.py`` does); the
launcher's ``decode_split_kernel`` / ``decode_combine_kernel`` are swapped for them while tracing.
The trace buffer's address is a constexpr of the patched source (``TRACE_ADDR``). Timestamps are
read after the stores they follow were issued, not completed; ``%globaltimer``'s resolution is the
GPU's (fine enough on an H100 to see 0.2 us spreads).

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/timeline.py --out $OUT/timeline.json
    PYTHONPATH=src python benchmarks/timeline.py --sweep --filter "sw07 ,sw12 " --no-readers --out $OUT/t.json
    PYTHONPATH=src python benchmarks/timeline.py --filter "L32768" --variants stream128nohint --no-readers

and on the CPU, without a GPU: each selected row's balanced plan on a faked H200 (sm90 tables, 132
SMs, 4.8 TB/s): its units, their key counts and the span's lower bounds (planned, not measured)::

    PYTHONPATH=src python benchmarks/timeline.py --plan --sweep --filter "sw07 ,sw12 ,sw54 ,sw57 "

``--sweep`` / ``--filter`` select rows as ``tune_decode.py`` does (a filter may list several
substrings, comma-separated). Times are microseconds from the launch's first program start; the
scalar summaries are medians over ``--reps`` replays, the per-program and per-unit detail (JSON)
that of the replay with the median span.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks import patched_kernels  # noqa: E402

# The trace buffer (int64 slots), one region a record kind; records past a region's capacity are
# not written (masked stores).
PROG_CAP = 1 << 14  # split programs: [sm, entry, after gdc_wait, end]
PROG_SLOTS = 4
ITEM_CAP = 1 << 16  # work items, by item index: [pid, b, split, n_splits, first key, end key, claimed, stored]
ITEM_SLOTS = 8
MERGE_SLOTS = 2  # by item index: [merge start, merge end] (the request's last program)
COMB_CAP = 1 << 16  # combine programs (row * Hq + head): [sm, entry, after gdc_wait, end]
COMB_SLOTS = 4
PROG_AT = 0
ITEM_AT = PROG_AT + PROG_CAP * PROG_SLOTS
MERGE_AT = ITEM_AT + ITEM_CAP * ITEM_SLOTS
COMB_AT = MERGE_AT + ITEM_CAP * MERGE_SLOTS
MARK_AT = COMB_AT + COMB_CAP * COMB_SLOTS
TRACE_SLOTS = MARK_AT + 8

# The address the patched source is built with where no buffer is given (the sm_90a compile
# tests, ``instrumented_kernel``): never dereferenced there.
FAKE_ADDR = 0x7F00_0000_0000

# Faked H200 of the CPU plan (tests/ops/decode/test_long_tiles_by_bandwidth.py's _plan_on).
H200_SMS = 132
H200_BW = 4.8e12
H200_L2 = 60 << 20


def _helpers(addr: int) -> str:
    """The trace functions, inserted into each patched module (its kernels call them)."""
    return f'''
TRACE_ADDR = tl.constexpr({int(addr)})  # timeline: the trace buffer (benchmarks/timeline.py)
from benchmarks.timeline import _now as _gtime, _smid  # timeline: the timer and SM id reads


@triton.jit
def _trace_put(slot, value, ok):
    """timeline: ``value`` into int64 slot ``slot`` of the trace buffer where ``ok``."""
    one = tl.arange(0, 1)
    base = tl.full([1], TRACE_ADDR, tl.int64).to(tl.pointer_type(tl.int64))
    tl.store(base + slot + one, value.to(tl.int64) + tl.zeros([1], tl.int64), mask=(one == 0) & ok)


'''


_GDC = "try:  # grid dependency control"


def kernel_patches(addr: int) -> list:
    """(text, replacement) pairs of ``ops/decode/kernels.py``."""
    p, i, m = PROG_AT, ITEM_AT, MERGE_AT
    item_ok = f"item < {ITEM_CAP}"
    return [
        (_GDC, _helpers(addr) + _GDC),
        # the program's entry and its exit from the grid-dependency wait
        ("    if USE_PDL:\n        gdc_wait()\n    # Two call sites",
         "    pid0 = tl.program_id(0)\n    t_entry = _gtime(pid0)\n    if USE_PDL:\n        gdc_wait()\n"
         "    t_waited = _gtime(pid0)\n    # Two call sites"),
        # an item is claimed: the first runtime statement of _decode_item (the deal loop's top)
        ("    mb = item % M_BLOCKS\n    rest = item // M_BLOCKS\n",
         "    t_claim = _gtime(item)\n    mb = item % M_BLOCKS\n    rest = item // M_BLOCKS\n"),
        # what it is: program, request, chunk, chunks of the request, keys [start, end) (after the
        # lanes plan has set them: the line after that block)
        ("    if PREFETCH > 0:\n",
         f"    rec = {i} + item.to(tl.int64) * {ITEM_SLOTS}\n"
         f"    _trace_put(rec, tl.program_id(0), {item_ok})\n"
         f"    _trace_put(rec + 1, b, {item_ok})\n"
         f"    _trace_put(rec + 2, split, {item_ok})\n"
         f"    _trace_put(rec + 3, n_splits, {item_ok})\n"
         f"    _trace_put(rec + 4, start, {item_ok})\n"
         f"    _trace_put(rec + 5, end, {item_ok})\n"
         f"    _trace_put(rec + 6, t_claim, {item_ok})\n"
         "    if PREFETCH > 0:\n"),
        # its partial (or its rows) stored
        ("    tl.store(part_lse_ptr + p_row, lse2, mask=as_mask(row_ok & partial))\n",
         "    tl.store(part_lse_ptr + p_row, lse2, mask=as_mask(row_ok & partial))\n"
         f"    _trace_put({i} + item.to(tl.int64) * {ITEM_SLOTS} + 7, _gtime(item), {item_ok})\n"),
        # the in-kernel merge: when the request's last program starts and ends merging
        ("            tl.atomic_xchg(count_ptr, 0, sem=\"relaxed\", scope=\"gpu\")\n",
         "            tl.atomic_xchg(count_ptr, 0, sem=\"relaxed\", scope=\"gpu\")\n"
         f"            _trace_put({m} + item.to(tl.int64) * {MERGE_SLOTS}, _gtime(item), {item_ok})\n"),
        ("                tl.store(lse_ptr + mg_rows * stride_lse_t + mg_heads, mg_lse2, mask=mg_ok)\n",
         "                tl.store(lse_ptr + mg_rows * stride_lse_t + mg_heads, mg_lse2, mask=mg_ok)\n"
         f"            _trace_put({m} + item.to(tl.int64) * {MERGE_SLOTS} + 1, _gtime(item), {item_ok})\n"),
        # the program's end (after the deal's finish count), its SM
        ("    if USE_PDL:\n        # At the end, not the start",
         f"    t_end = _gtime(pid0)\n    prog = {p} + pid0.to(tl.int64) * {PROG_SLOTS}\n"
         f"    _trace_put(prog, _smid(pid0), pid0 < {PROG_CAP})\n"
         f"    _trace_put(prog + 1, t_entry, pid0 < {PROG_CAP})\n"
         f"    _trace_put(prog + 2, t_waited, pid0 < {PROG_CAP})\n"
         f"    _trace_put(prog + 3, t_end, pid0 < {PROG_CAP})\n"
         "    if USE_PDL:\n        # At the end, not the start"),
    ]


def combine_patches(addr: int) -> list:
    """(text, replacement) pairs of ``ops/common/combine.py`` (decode_combine_kernel)."""
    return [
        (_GDC, _helpers(addr) + _GDC),
        ("    t = tl.program_id(0)\n    h = tl.program_id(1)\n    if USE_PDL:\n        gdc_wait()\n"
         "    # One row, as a [1] tensor",
         "    t = tl.program_id(0)\n    h = tl.program_id(1)\n    c_entry = _gtime(h)\n    if USE_PDL:\n"
         "        gdc_wait()\n    c_waited = _gtime(h)\n    # One row, as a [1] tensor"),
        ("                stride_lse_t, out_factor, HEAD_DIM, HAS_SINKS, OUT_PTR, OUT_FP8, STORE_LSE)\n\n\n"
         "@triton.jit\ndef balanced_combine_kernel",
         "                stride_lse_t, out_factor, HEAD_DIM, HAS_SINKS, OUT_PTR, OUT_FP8, STORE_LSE)\n"
         f"    cs = {COMB_AT} + (t.to(tl.int64) * NUM_HEADS + h) * {COMB_SLOTS}\n"
         f"    c_ok = cs < {COMB_AT + COMB_CAP * COMB_SLOTS}\n"
         "    _trace_put(cs, _smid(h), c_ok)\n    _trace_put(cs + 1, c_entry, c_ok)\n"
         "    _trace_put(cs + 2, c_waited, c_ok)\n    _trace_put(cs + 3, _gtime(h), c_ok)\n\n\n"
         "@triton.jit\ndef balanced_combine_kernel"),
    ]


_OWNER = "benchmarks/timeline.py"


def patched_sources(addr: int = FAKE_ADDR) -> tuple[str, str]:
    """The instrumented sources of ``decode/kernels.py`` and ``common/combine.py`` (each patched
    text found exactly once, else a RuntimeError naming this file)."""
    from kvattn.ops.common import combine
    from kvattn.ops.decode import kernels

    return (patched_kernels.patched_source(kernels, kernel_patches(addr), "timeline", _OWNER),
            patched_kernels.patched_source(combine, combine_patches(addr), "timeline", _OWNER))


def instrumented_modules(addr: int = FAKE_ADDR):
    """``(kernels, combine)``: the instrumented modules, siblings of the library's, writing to the
    trace buffer at ``addr`` (one pair an address and process)."""
    return _modules(int(addr))


@functools.lru_cache(maxsize=None)
def _modules(addr: int):
    from kvattn.ops.common import combine
    from kvattn.ops.decode import kernels

    k_src, c_src = patched_sources(addr)
    tag = "" if addr == FAKE_ADDR else f"_{addr:x}"
    return (patched_kernels.load_sibling(kernels, f"kernels_timeline{tag}", k_src),
            patched_kernels.load_sibling(combine, f"combine_timeline{tag}", c_src))


def __getattr__(name: str):
    """``instrumented_kernel`` / ``instrumented_combine``: the instrumented kernels at the fake
    address, for ``tests/ops/sm90.py``'s compiles (``"benchmarks.timeline.instrumented_kernel"``)."""
    if name == "instrumented_kernel":
        return instrumented_modules()[0].decode_split_kernel
    if name == "instrumented_combine":
        return instrumented_modules()[1].decode_combine_kernel
    raise AttributeError(name)


@contextlib.contextmanager
def instrumented(addr: int):
    """The decode launcher launches the instrumented kernels (plans dropped on entry and exit; no
    call replayed from a recording of the other kernel: the call cache suspended)."""
    from kvattn.ops.decode import plan as decode_launch
    from kvattn.runtime.callcache import suspend

    kernels, combine = instrumented_modules(addr)
    real = decode_launch.decode_split_kernel, decode_launch.decode_combine_kernel
    decode_launch._PLANS.clear()
    decode_launch.decode_split_kernel = kernels.decode_split_kernel
    decode_launch.decode_combine_kernel = combine.decode_combine_kernel
    suspend(1)
    try:
        yield
    finally:
        decode_launch.decode_split_kernel, decode_launch.decode_combine_kernel = real
        decode_launch._PLANS.clear()
        suspend(-1)


# ---------------------------------------------------------------------------------------------
# bare reads, traced the same way
# ---------------------------------------------------------------------------------------------
@triton.jit
def _now(x):
    """The global nanosecond timer (``x``: any scalar, to give the asm an operand)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _smid(x):
    """The SM the program runs on."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _record(tr_ptr, pid, t0, t2):
    o = tl.arange(0, 1)
    z = tl.zeros([1], tl.int64)
    tl.store(tr_ptr + pid * 4 + o, _smid(pid).to(tl.int64) + z)
    tl.store(tr_ptr + pid * 4 + 1 + o, t0 + z)
    tl.store(tr_ptr + pid * 4 + 2 + o, t0 + z)
    tl.store(tr_ptr + pid * 4 + 3 + o, t2 + z)


@triton.jit
def marker(ptr):
    tl.store(ptr + tl.arange(0, 1), _now(tl.program_id(0)) + tl.zeros([1], tl.int64))


@triton.jit
def static_reader(x_ptr, out_ptr, tr_ptr, n_blocks, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t0 = _now(pid)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(pid, n_blocks, tl.num_programs(0)):
        acc += tl.load(x_ptr + i.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))
    _record(tr_ptr, pid, t0, _now(pid))


@triton.jit
def claiming_reader(x_ptr, out_ptr, ctr_ptr, tr_ptr, n_claims, BLOCK: tl.constexpr, SUB: tl.constexpr):
    pid = tl.program_id(0)
    t0 = _now(pid)
    acc = tl.zeros([BLOCK], tl.float32)
    c = tl.atomic_add(ctr_ptr, 1, sem="relaxed")
    while c < n_claims:
        nxt = tl.atomic_add(ctr_ptr, 1, sem="relaxed")  # the next claim's latency overlaps these loads
        base = c.to(tl.int64) * (SUB * BLOCK)
        for j in tl.static_range(SUB):
            acc += tl.load(x_ptr + base + j * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
        c = nxt
    tl.store(out_ptr + pid, tl.sum(acc))
    _record(tr_ptr, pid, t0, _now(pid))


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------
def registry_shapes() -> list:
    """The rows traced without ``--sweep``."""
    from benchmarks.shapes import Shape

    return [
        Shape("decode", 16, 4096),
        Shape("decode", 1, 32768),
        Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32),
        Shape("single_decode", 1, 32768, num_qo_heads=32, num_kv_heads=32),
        Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode="ROPE_LLAMA"),
    ]


def select_rows(sweep_rows: bool, filters: list[str]) -> list:
    """The rows to trace: the sweep's paged decode rows (``sweep_rows``) or :func:`registry_shapes`,
    kept where a filter matches their id as a whole (ragged ids hold commas: ``[1,88289]``) or by
    any of its comma-separated parts (``tune_decode.py``'s rule)."""
    from benchmarks import sweep

    return sweep.select(sweep.decode_rows() if sweep_rows else registry_shapes(), sweep.filter_parts(filters))


def row_name(shape) -> str:
    return f"{shape.label} {shape.id}" if shape.label and not shape.id.startswith(shape.label) else shape.id


# ---------------------------------------------------------------------------------------------
# the balanced plan on the host (common.balance mirrored) and the CPU estimate
# ---------------------------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pieces(n: int, k: int, block_n: int) -> list[int]:
    """``split_bounds``: ``n`` keys in ``k`` chunks of whole tiles (the last ones may be short or empty)."""
    piece = max(_cdiv(_cdiv(n, k), block_n) * block_n, block_n)
    return [max(0, min(piece, n - s * piece)) for s in range(k)]


def unit_counts(lens, *, splits: int, target: int, cap: int, min_chunk: int, block_n: int) -> tuple[list, int | None]:
    """``common.balance.unit_counts`` on the host: each request's units and the chunk (None where
    the batch is not ragged and keeps ``splits`` a request)."""
    total, longest, batch = sum(lens), max(lens), len(lens)
    if longest * batch * 4 <= 5 * total:
        return [splits] * batch, None
    chunk = max(_cdiv(total, target), _cdiv(longest, cap))
    chunk = max(_cdiv(chunk, block_n) * block_n, min_chunk)
    return [max(_cdiv(n, chunk), 1) for n in lens], chunk


def host_units(lens, *, capacity: int, splits: int, target: int, cap: int, min_chunk: int,
               block_n: int) -> tuple[list, int | None]:
    """``([(b, split, n_b, keys)], chunk)``: the units of a balanced plan in deal order, as
    ``common.balance.unit_counts`` and ``split_bounds`` cut them (``chunk``: None where the batch
    is not ragged and keeps ``splits`` a request)."""
    lens = [min(max(n, 0), capacity) for n in lens]
    counts, chunk = unit_counts(lens, splits=splits, target=target, cap=cap, min_chunk=min_chunk, block_n=block_n)
    units = [(b, s, k, keys) for b, (n, k) in enumerate(zip(lens, counts)) for s, keys in enumerate(pieces(n, k, block_n))]
    return units, chunk


def host_lanes(lens, *, capacity: int, lanes: int, cap: int, min_chunk: int, block_n: int) -> tuple[list, list]:
    """``([(b, split, n_b, keys)], lane_keys)``: the units of the lanes plan in lane order and each
    lane's keys, as ``common.balance.lane_span`` / ``lane_piece`` cut them (a ragged batch)."""
    from kvattn.ops.common.balance import LANE_FIXED_KEYS

    lens = [min(max(n, 0), capacity) for n in lens]
    fixed = max(1, LANE_FIXED_KEYS // block_n)
    tiles = [max(1, _cdiv(n, block_n)) for n in lens]
    cost = [t + fixed for t in tiles]
    share = max(_cdiv(sum(cost), lanes), _cdiv(max(cost), cap - 1), max(1, min_chunk // block_n))
    units, lane_keys, end = [], [0] * lanes, 0
    for b, (n, t, c) in enumerate(zip(lens, tiles, cost)):
        end += c
        pos = end - t  # the cost position of the request's first tile
        lo_lane, hi_lane = pos // share, (end - 1) // share
        for lane in range(lo_lane, hi_lane + 1):
            lo = max(lane * share - pos, 0) * block_n
            hi = min(min((lane + 1) * share - pos, t) * block_n, n)
            keys = max(0, hi - lo)
            units.append((b, lane - lo_lane, hi_lane - lo_lane + 1, keys))
            lane_keys[lane] += keys
    return units, lane_keys


def launch_facts(split) -> dict:
    """The facts of a split launch (``fast_launch.Launch``) the summaries read."""
    c, f = split.constexprs, split.fixed
    return {"programs": split.grid[0], "balanced": bool(c["BALANCED"]), "block_n": c["BLOCK_N"],
            "num_warps": split.options["num_warps"], "num_stages": split.options["num_stages"],
            "num_kv_heads": c["NUM_KV_HEADS"], "m_blocks": c["M_BLOCKS"], "merge_block_s": c["MERGE_BLOCK_S"],
            "min_chunk": c["MIN_CHUNK"], "unit_target": f["unit_target"], "num_splits": f["num_splits"],
            "head_dim": c["HEAD_DIM"], "page_size": c["PAGE_SIZE"], "lanes": bool(c.get("LANES")),
            "lane_cap": c.get("LANE_CAP", 0)}


def plan_units(shape, facts: dict) -> list:
    """The units of ``shape``'s balanced launch (``facts``: :func:`launch_facts`): the lanes plan's
    in lane order where the launch takes it and the batch is ragged, else the deal's."""
    lanes = plan_lanes(shape, facts)
    if lanes is not None:
        return lanes[0]
    from kvattn.ops.common.balance import unit_cap

    lens = shape.seq_lens()
    capacity = _cdiv(max(lens), facts["page_size"]) * facts["page_size"]
    return host_units(lens, capacity=capacity, splits=facts["num_splits"], target=facts["unit_target"],
                      cap=unit_cap(facts["merge_block_s"]), min_chunk=facts["min_chunk"],
                      block_n=facts["block_n"])[0]


def plan_lanes(shape, facts: dict) -> tuple[list, list] | None:
    """:func:`host_lanes` of ``shape``'s balanced launch, or None where it deals its units (no
    LANES, or a batch the 5/4 rule finds uniform)."""
    from kvattn.ops.common.balance import unit_cap

    lens = shape.seq_lens()
    if not facts.get("lanes") or max(lens) * len(lens) * 4 <= 5 * sum(lens):
        return None
    capacity = _cdiv(max(lens), facts["page_size"]) * facts["page_size"]
    return host_lanes(lens, capacity=capacity, lanes=facts["programs"] // (facts["num_kv_heads"] * facts["m_blocks"]),
                      cap=facts["lane_cap"] or unit_cap(facts["merge_block_s"]), min_chunk=facts["min_chunk"],
                      block_n=facts["block_n"])


def bytes_per_key(shape) -> int:
    """K and V bytes of one key of one KV head (element bits of the cache format)."""
    from kvattn._formats_table import BY_NAME

    return 2 * shape.head_dim * BY_NAME[shape.kv_dtype].element_bits // 8


def _greedy(durations: list, slots: int) -> float:
    """Makespan of ``durations`` dealt in order to ``slots`` slots, each taking the next when its
    last ends (slot ``i`` the ``i``-th first: the deal's first items are the programs' own)."""
    import heapq

    heap = [(0.0, i) for i in range(slots)]
    end = 0.0
    for d in durations:
        t, i = heapq.heappop(heap)
        end = max(end, t + d)
        heapq.heappush(heap, (t + d, i))
    return end


def estimate(units: list, facts: dict, bpk: int, *, sms: int = H200_SMS, bandwidth: float = H200_BW,
             lane_keys: list | None = None) -> dict:
    """What the plan alone says of a balanced launch's span (no GPU): units, their keys, the load
    of a program if the items were dealt evenly, and bounds of the span in us at ``bandwidth`` and
    in ``u``: the copy time of the mean unit at an SM's share (``bandwidth / sms``). An item is one
    unit for one KV head and row block (it reads the unit's keys of one head). Two deal models,
    items in the plan's order, no fixed cost a unit, no merge, no latency:

    * ``sm_model``: each SM copies at its share whoever runs on it (a program alone on its SM
      takes the whole share): items dealt to SMs;
    * ``program_model``: each program copies at ``bandwidth / programs`` at most (a program alone
      on its SM takes only its own part): items dealt to programs.

    With ``lane_keys`` (the lanes plan: each lane's keys, static), ``lanes_model``: the busiest
    lane's keys at the program model's rate.
    """
    per_item = facts["num_kv_heads"] * facts["m_blocks"]
    keys = [k for *_, k in units]
    programs = facts["programs"]
    items = len(units) * per_item
    item_keys = sum(keys) * per_item
    t_key = bpk / (bandwidth / sms) * 1e6  # us a key at an SM's share
    mean_unit = sum(keys) / len(keys)
    u = mean_unit * t_key  # us: the mean unit at an SM's share
    largest = max(keys)
    program_load = item_keys / programs  # keys a program, dealt evenly
    copy_us = item_keys * bpk / bandwidth * 1e6  # every byte at the whole GPU's bandwidth
    dealt = [k for k in keys for _ in range(per_item)]
    sm_model = _greedy([k * t_key for k in dealt], sms)
    program_model = _greedy([k * t_key * programs / sms for k in dealt], programs)
    hist: dict[int, int] = {}
    for k in keys:
        hist[k] = hist.get(k, 0) + 1
    per_request: dict[int, int] = {}
    for b, _, n_b, _ in units:
        per_request[b] = n_b
    return {
        "programs": programs, "units": len(units), "items": items, "items_per_program_even": items / programs,
        "units_per_request": [per_request[b] for b in sorted(per_request)],
        "keys_min": min(keys), "keys_median": statistics.median(keys), "keys_max": largest,
        "keys_mean": mean_unit, "keys_hist": sorted(hist.items(), reverse=True),
        "program_load_keys": program_load, "largest_over_program_load": largest / program_load,
        "u_us": u, "copy_us": copy_us, "copy_u": copy_us / u,
        "largest_at_sm_share_us": largest * t_key, "largest_at_sm_share_u": largest * t_key / u,
        "lower_bound_us": max(copy_us, largest * t_key),
        "sm_model_us": sm_model, "sm_model_u": sm_model / u,
        "program_model_us": program_model, "program_model_u": program_model / u,
        **({"lanes_model_us": max(lane_keys) * t_key * programs / sms,
            "lanes_model_u": max(lane_keys) * t_key * programs / sms / u} if lane_keys else {}),
    }


def estimate_text(name: str, est: dict, facts: dict) -> str:
    hist = ", ".join(f"{c} x {k}" for k, c in est["keys_hist"][:6])
    more = f" (+{len(est['keys_hist']) - 6} sizes)" if len(est["keys_hist"]) > 6 else ""
    return (
        f"{name}\n"
        f"  launch: {facts['programs']} programs, tiles {facts['block_n']} keys / {facts['num_warps']} warps / "
        f"{facts['num_stages']} stages, an item {facts['num_kv_heads']} KV head(s) x {facts['m_blocks']} row "
        f"block(s), merge {facts['merge_block_s']} partials a round, unit target {facts['unit_target']}\n"
        f"  units {est['units']} ({est['items']} items; a request {' '.join(map(str, est['units_per_request']))}), "
        f"{est['items_per_program_even']:.2f} items a program dealt evenly\n"
        f"  keys a unit min / median / max {est['keys_min']} / {est['keys_median']:.0f} / {est['keys_max']}, mean "
        f"{est['keys_mean']:.0f}; sizes (count x keys) {hist}{more}\n"
        f"  mean program load {est['program_load_keys']:.0f} item-keys; largest unit / mean program load "
        f"{est['largest_over_program_load']:.2f}\n"
        f"  u (mean unit at an SM's share) {est['u_us']:.2f} us; all bytes at full bandwidth {est['copy_us']:.1f} us "
        f"= {est['copy_u']:.2f} u; largest unit at an SM's share {est['largest_at_sm_share_us']:.1f} us = "
        f"{est['largest_at_sm_share_u']:.2f} u; span >= {est['lower_bound_us']:.1f} us\n"
        f"  deal models (no fixed costs, no merge): by SM {est['sm_model_us']:.1f} us = {est['sm_model_u']:.2f} u; "
        f"by program at bandwidth / programs {est['program_model_us']:.1f} us = {est['program_model_u']:.2f} u"
        + (f"\n  lanes (static, the busiest lane at bandwidth / programs): {est['lanes_model_us']:.1f} us = "
           f"{est['lanes_model_u']:.2f} u" if "lanes_model_us" in est else ""))


def faked_h200_launch(shape, bandwidth: float = H200_BW):
    """The split launch of ``shape``'s decode call planned on a faked H200 (sm90 tables, 132 SMs,
    60 MB of L2, ``bandwidth``) from CPU tensors: nothing runs (``tests/ops/decode/
    test_balanced_plan.py``'s ``_plan_of``, with the row's own batch, span, pages, heads and layout;
    a 16-bit cache as float16, which shares bfloat16's config rows; an fp8 cache as e4m3, in the
    interpreter's byte format)."""
    from unittest import mock

    import torch

    import kvattn
    from kvattn.ops.decode import plan as decode_launch
    from kvattn.runtime import fast_launch

    if shape.kv_dtype not in ("bfloat16", "float16", "fp8") or shape.q_len != 1:
        raise ValueError(f"{shape.id}: the CPU plan covers 16-bit and fp8 caches and one query row")
    # (TRITON_INTERPRET: the backend takes CPU tensors only then; the launches are recorded, not run)
    env = {"KVATTN_FUSED_MERGE": "1", "KVATTN_CALL_CACHE": "0", "KVATTN_BACKEND": "triton", "TRITON_INTERPRET": "1"}
    lens = shape.seq_lens()
    max_len, page, hkv = max(lens), shape.page_size, shape.num_kv_heads
    pages = shape.batch * _cdiv(max_len, page)
    dims = (pages, page, hkv, shape.head_dim) if shape.layout == "NHD" else (pages, hkv, page, shape.head_dim)
    dtype = torch.float16  # (the interpreter takes no bfloat16; both are the tables' "half" format)
    k = torch.empty(dims, dtype=torch.float8_e4m3fn if shape.kv_dtype == "fp8" else dtype)
    tables = torch.zeros(shape.batch, pages // shape.batch, dtype=torch.int32)
    q = torch.empty(shape.batch, shape.num_qo_heads, shape.head_dim, dtype=dtype)
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, env))
        stack.enter_context(mock.patch.object(decode_launch, "arch", lambda device, interpreter: "sm90"))
        stack.enter_context(mock.patch.object(decode_launch._device, "sm_count", lambda device: H200_SMS))
        stack.enter_context(mock.patch.object(decode_launch._device, "l2_bytes", lambda device: H200_L2))
        stack.enter_context(mock.patch.object(decode_launch._device, "memory_bandwidth", lambda device: bandwidth))
        stack.enter_context(mock.patch.object(fast_launch.Launch, "__call__", lambda self, call: None))
        stack.enter_context(mock.patch.object(decode_launch, "_PLANS", {}))
        kvattn.decode.xqa_batch_decode_with_kv_cache(
            q, (k, torch.empty_like(k)), torch.zeros(128 << 20, dtype=torch.uint8), tables,
            torch.tensor(lens, dtype=torch.int32), max_len, bmm1_scale=0.1, bmm2_scale=1.0, out=torch.empty_like(q),
            kv_layout=shape.layout)
        (plan,) = decode_launch._PLANS.values()
        return plan.launches(max_len)[0]


def plan_report(shapes) -> dict:
    """The CPU estimate of each balanced row (:func:`estimate`), printed; rows whose launch is not
    balanced are named and skipped."""
    out = {}
    for shape in shapes:
        name = row_name(shape)
        try:
            facts = launch_facts(faked_h200_launch(shape))
        except ValueError as exc:
            print(f"{name}: skipped ({exc})")
            continue
        if not facts["balanced"]:
            print(f"{name}: not a balanced launch ({facts['programs']} programs, {facts['num_splits']} splits)")
            out[name] = {"facts": facts}
            continue
        lanes = plan_lanes(shape, facts)
        est = estimate(plan_units(shape, facts), facts, bytes_per_key(shape), lane_keys=lanes and lanes[1])
        out[name] = {"facts": facts, "estimate": est}
        print(estimate_text(name, est, facts), flush=True)
    return out


# ---------------------------------------------------------------------------------------------
# the trace: parsed, summarised
# ---------------------------------------------------------------------------------------------
def _records(tr, at: int, cap: int, slots: int, key: int) -> list:
    """``(index, record)`` of the written records of a region (slot ``key`` of a record > 0)."""
    import torch

    region = torch.as_tensor(tr[at: at + cap * slots], dtype=torch.int64).view(cap, slots)
    idx = torch.nonzero(region[:, key] > 0).flatten()
    return list(zip(idx.tolist(), region[idx].tolist()))


def parse_trace(tr, *, item_decode: tuple[int, int] | None = None) -> dict:
    """One replay's records from the trace buffer ``tr`` (a CPU tensor or a list of ints; -1:
    unwritten), times in ns as recorded. ``item_decode``: ``(NUM_KV_HEADS, M_BLOCKS)`` of the
    launch, to name each item's KV head."""
    progs = [{"pid": pid, "sm": sm, "start": t0, "waited": t1, "end": t2}
             for pid, (sm, t0, t1, t2) in _records(tr, PROG_AT, PROG_CAP, PROG_SLOTS, 1)]
    merges = dict(_records(tr, MERGE_AT, ITEM_CAP, MERGE_SLOTS, 0))
    units = []
    for item, (pid, b, split, n_splits, k0, k1, claim, stored) in _records(tr, ITEM_AT, ITEM_CAP, ITEM_SLOTS, 6):
        u = {"item": item, "pid": pid, "b": b, "split": split, "n_splits": n_splits, "keys": max(0, k1 - k0),
             "claim": claim, "stored": stored}
        if item in merges:
            u["merge_start"], u["merge_end"] = merges[item]
        if item_decode:
            hkv, mblocks = item_decode
            u["kvh"] = item // mblocks % hkv
        units.append(u)
    comb = [{"sm": sm, "start": t0, "waited": t1, "end": t2}
            for _, (sm, t0, t1, t2) in _records(tr, COMB_AT, COMB_CAP, COMB_SLOTS, 1)]
    return {"programs": progs, "units": units, "combine": comb, "mark": int(tr[MARK_AT])}


def _union_ns(intervals: list) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _mmm(values: list) -> list:
    return [min(values), statistics.median(values), max(values)] if values else [0, 0, 0]


def summarise(rec: dict, bpk: int = 0) -> dict:
    """The summary of one replay (:func:`parse_trace`'s records; ``bpk``: bytes an item reads a
    key, for the units' GB/s): us from the first program's start.

    * ``span_us``: first start to last end; ``start_spread_us``: first to last start;
    * ``sm_busy``: each SM's time with a program on it (union of its programs' [start, end]) over
      the span; ``max_per_sm``: programs live on one SM at once;
    * ``median_end_us``, ``tail_after_median_us`` (last end - median end), ``last_alone_us`` (last
      end - the end before it: the last program running alone);
    * ``units_per_program`` (min / median / max), unit durations (claimed -> stored) and GB/s;
    * ``critical``: the program whose chain of units (first claim to its last stored partial or
      merge end) is longest: its units, their keys and durations, its merge time and the gaps
      between one unit's end and the next claim;
    * ``merges``: per request (its last program), start and end; ``last_claim_us``: when the deal's
      last item was claimed; the combine launch's wait exit and end where it has one."""
    progs, units = rec["programs"], rec["units"]
    if not progs:
        return {"programs": 0}
    t0 = min(p["start"] for p in progs)
    us = lambda ns: (ns - t0) / 1e3  # noqa: E731
    ends = sorted(p["end"] for p in progs)
    span = ends[-1] - t0
    by_sm: dict[int, list] = {}
    for p in progs:
        by_sm.setdefault(p["sm"], []).append((p["start"], p["end"]))
    busy = {sm: _union_ns(iv) / span if span else 1.0 for sm, iv in sorted(by_sm.items())}
    max_per_sm = 0
    for iv in by_sm.values():
        live = 0
        for _, d in sorted([(s, 1) for s, _ in iv] + [(e, -1) for _, e in iv], key=lambda x: (x[0], x[1])):
            live += d
            max_per_sm = max(max_per_sm, live)
    median_end = statistics.median(ends)
    r = {
        "programs": len(progs), "sms": len(by_sm), "max_per_sm": max_per_sm,
        "span_us": span / 1e3, "start_spread_us": us(max(p["start"] for p in progs)),
        "wait_exit_us": us(max(p["waited"] for p in progs)),
        "sm_busy": {str(sm): round(f, 4) for sm, f in busy.items()},
        "sm_busy_mmm": _mmm(list(busy.values())), "sm_busy_mean": statistics.mean(busy.values()),
        "median_end_us": us(median_end), "tail_after_median_us": (ends[-1] - median_end) / 1e3,
        "last_alone_us": (ends[-1] - ends[-2]) / 1e3 if len(ends) > 1 else span / 1e3,
        "mark_to_start_us": (t0 - rec["mark"]) / 1e3 if rec.get("mark", -1) > 0 else None,
    }
    if units:
        per_prog: dict[int, list] = {p["pid"]: [] for p in progs}
        for u in units:
            per_prog.setdefault(u["pid"], []).append(u)
        counts = [len(v) for v in per_prog.values()]
        durs = [(u["stored"] - u["claim"]) / 1e3 for u in units]
        rates = [u["keys"] * bpk / d / 1e3 for u, d in zip(units, durs) if d > 0 and u["keys"] > 0] if bpk else []
        r.update({"units": len(units), "units_per_program": _mmm(counts), "unit_us": _mmm(durs),
                  "unit_gbps": _mmm(rates), "last_claim_us": us(max(u["claim"] for u in units))})
        best = None
        for pid, us_ in per_prog.items():
            if not us_:
                continue
            us_ = sorted(us_, key=lambda u: u["claim"])
            done = [u.get("merge_end", u["stored"]) for u in us_]
            chain = max(done) - us_[0]["claim"]
            if best is None or chain > best[0]:
                best = (chain, pid, us_)
        chain, pid, chain_units = best
        work = sum(u["stored"] - u["claim"] for u in chain_units)
        merge = sum(u["merge_end"] - u["merge_start"] for u in chain_units if "merge_start" in u)
        prog = next(p for p in progs if p["pid"] == pid)
        r["critical"] = {
            "pid": pid, "sm": prog["sm"], "chain_us": chain / 1e3, "work_us": work / 1e3, "merge_us": merge / 1e3,
            "gaps_us": (chain - work - merge) / 1e3, "start_us": us(prog["start"]), "end_us": us(prog["end"]),
            "units": [{"b": u["b"], "split": u["split"], "n_splits": u["n_splits"], "keys": u["keys"],
                       "claim_us": round(us(u["claim"]), 3), "us": round((u["stored"] - u["claim"]) / 1e3, 3),
                       **({"merge_us": round((u["merge_end"] - u["merge_start"]) / 1e3, 3)}
                          if "merge_start" in u else {})} for u in chain_units],
        }
        merges = [u for u in units if "merge_start" in u]
        if merges:
            r["merges"] = {str(u["b"]) + (f".{u['kvh']}" if "kvh" in u else ""): {
                "pid": u["pid"], "n_splits": u["n_splits"], "start_us": round(us(u["merge_start"]), 3),
                "us": round((u["merge_end"] - u["merge_start"]) / 1e3, 3)} for u in merges}
            r["merge_us_max"] = max((u["merge_end"] - u["merge_start"]) / 1e3 for u in merges)
            r["last_merge_end_us"] = us(max(u["merge_end"] for u in merges))
    if rec.get("combine"):
        r["combine_wait_exit_us"] = us(min(c["waited"] for c in rec["combine"]))
        r["combine_end_us"] = us(max(c["end"] for c in rec["combine"]))
    return r


_MEDIANS = ("span_us", "start_spread_us", "wait_exit_us", "sm_busy_mean", "median_end_us", "tail_after_median_us",
            "last_alone_us", "last_claim_us", "merge_us_max", "last_merge_end_us", "combine_wait_exit_us",
            "combine_end_us", "mark_to_start_us")


def combine_replays(runs: list[dict]) -> dict:
    """Medians of the replays' scalar summaries, the median-span replay's detail, and how
    consistently the same programs are the slow ones (programs' durations, first half of the
    replays against the second)."""
    med = {k: statistics.median(r[k] for r in runs) for k in _MEDIANS
           if all(r.get(k) is not None for r in runs) and k in runs[0]}
    for k in ("sm_busy_mmm", "units_per_program", "unit_us", "unit_gbps"):
        if k in runs[0]:
            med[k] = [statistics.median(r[k][j] for r in runs) for j in range(3)]
    order = sorted(range(len(runs)), key=lambda i: runs[i]["span_us"])
    detail = runs[order[len(order) // 2]]
    med["replays"] = len(runs)
    med["spans_us"] = [round(r["span_us"], 3) for r in runs]
    med["detail"] = {k: v for k, v in detail.items() if k not in med or k in ("span_us",)}
    return med


def summary_text(name: str, s: dict) -> str:
    """A few lines for a row: span, SM busy, the tail, units a program, the critical path, merges."""
    d = s["detail"]
    if not d.get("programs"):
        return f"{name}: no program records"
    lo, mid, hi = s["sm_busy_mmm"]
    lines = [
        f"{name}: {d['programs']} programs on {d['sms']} SMs (<= {d['max_per_sm']} an SM at once); span "
        f"{s['span_us']:.1f} us (replays {min(s['spans_us']):.1f}-{max(s['spans_us']):.1f}), starts spread "
        f"{s['start_spread_us']:.2f}",
        f"  SM busy min / median / max {lo:.3f} / {mid:.3f} / {hi:.3f} (mean {s['sm_busy_mean']:.3f}); median "
        f"program ends {s['median_end_us']:.1f}, the last {s['tail_after_median_us']:.1f} us later, alone for "
        f"{s['last_alone_us']:.1f}",
    ]
    if "units_per_program" in s:
        per_prog = "/".join(f"{v:g}" for v in s["units_per_program"])
        unit_us = "/".join(f"{v:.1f}" for v in s["unit_us"])
        gbps = "/".join(f"{v:.1f}" for v in s["unit_gbps"])
        lines.append(f"  {d['units']} units (items); a program min / median / max {per_prog}; unit us {unit_us}, "
                     f"GB/s {gbps}; last claim at {s['last_claim_us']:.1f}")
        c = d["critical"]
        chain = ", ".join(f"b{u['b']}.{u['split']}/{u['n_splits']} {u['keys']}k {u['us']:.1f}"
                          + (f"+m{u['merge_us']:.1f}" if "merge_us" in u else "") for u in c["units"][:8])
        more = f" (+{len(c['units']) - 8})" if len(c["units"]) > 8 else ""
        lines.append(
            f"  critical: program {c['pid']} (SM {c['sm']}), {len(c['units'])} units, chain {c['chain_us']:.1f} us = "
            f"units {c['work_us']:.1f} + merge {c['merge_us']:.1f} + gaps {c['gaps_us']:.1f}, ends "
            f"{c['end_us']:.1f}: {chain}{more}")
    if "merge_us_max" in s:
        lines.append(f"  merges: {len(d['merges'])}, longest {s['merge_us_max']:.2f} us, last ends "
                     f"{s['last_merge_end_us']:.1f}")
    if "combine_end_us" in s:
        lines.append(f"  combine: wait exit {s['combine_wait_exit_us']:.1f}, end {s['combine_end_us']:.1f}")
    if s.get("graph_us"):
        lines.append(f"  graph replay: library {s['graph_us']:.1f} us, instrumented "
                     f"{s['graph_us_instrumented']:.1f} us")
    if "launch" in s and s["launch"]:
        f = s["launch"]
        lines.append(f"  launch: {f['programs']} programs, {'balanced' if f['balanced'] else 'uniform'}, tiles "
                     f"{f['block_n']} keys / {f['num_warps']} warps / {f['num_stages']} stages, "
                     f"{f['num_splits']} splits, merge {f['merge_block_s']} a round")
    if "plan_estimate" in s:
        e = s["plan_estimate"]
        lines.append(f"  plan (not measured): {e['units']} units, u {e['u_us']:.1f} us; copy bound {e['copy_us']:.1f}, "
                     f"deal by SM {e['sm_model_us']:.1f}, by program {e['program_model_us']:.1f} us")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the device run
# ---------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--filter", action="append", default=[],
                    help="keep rows whose id contains this (or any of several, comma-separated)")
    ap.add_argument("--sweep", action="store_true",
                    help="the sweep's paged decode rows (benchmarks/sweep.py) instead of the registry's few")
    ap.add_argument("--plan", action="store_true",
                    help="no GPU: each row's balanced plan on a faked H200 and the span's lower bounds")
    ap.add_argument("--variants", default="", help="tune_decode variants to trace besides the default")
    ap.add_argument("--no-readers", action="store_true", help="skip the bare reads")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--noflush", action="store_true", help="replay without flushing L2 before each replay")
    ap.add_argument("--no-time", action="store_true",
                    help="skip timing each row's graph replay with the library's and the instrumented kernels")
    ap.add_argument("--rep-ms", type=int, default=30, help="do_bench's rep (ms) of those timings")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    if any(v.startswith("floor_") for v in names):
        ap.error("the floor_* variants swap in their own (uninstrumented) kernel")
    args.rows = select_rows(args.sweep, args.filter)
    if not args.rows:
        ap.error(f"no row matches --filter {args.filter}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plan:
        out = plan_report(args.rows)
        if args.out:
            Path(args.out).write_text(json.dumps({"h200_faked": {"sms": H200_SMS, "bandwidth": H200_BW},
                                                  "rows": out}, indent=1))
        return 0
    return _run(args)


def _run(args) -> int:
    import torch

    from benchmarks import problems
    from benchmarks.tune_decode import variant
    from kvattn.benchmarking.timing import Timer, capture_graphs
    from kvattn.ops.decode import plan as decode_launch

    dev = torch.device("cuda")
    trace = torch.full((TRACE_SLOTS,), -1, dtype=torch.int64, device=dev)
    addr = trace.data_ptr()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    flush = torch.empty(256 << 20, dtype=torch.int8, device=dev)
    timer = Timer(dev, warmup_ms=10, rep_ms=args.rep_ms)
    from kvattn.runtime import device as _device

    peak = _device.memory_bandwidth(dev) or H200_BW  # the plan estimate's bandwidth (peak, from the clocks)

    @contextlib.contextmanager
    def traced(name: str):
        with instrumented(addr), variant(name):  # (variant keeps the instrumented kernel as its own)
            yield

    def trace_fns(fns, reps: int, item_decode=None, bpk: int = 0) -> dict:
        graphs = capture_graphs(fns)
        runs = []
        for i in range(reps + 3):
            trace[:MARK_AT].fill_(-1)
            if not args.noflush:
                flush.zero_()  # as do_bench does before each timed call
            marker[(1,)](trace[MARK_AT:])
            graphs[i % len(graphs)].replay()
            torch.cuda.synchronize()
            if i >= 3:
                runs.append(summarise(parse_trace(trace.cpu(), item_decode=item_decode), bpk))
        return combine_replays(runs)

    out = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "triton": triton.__version__,
           "sms": sms, "rows": {}}
    for shape in args.rows:
        prob = problems.build(shape, dev, l2_bytes=l2, workspace_mib=128)
        fns = [s.kvattn for s in prob.sets]
        bpk = bytes_per_key(shape) if shape.suite != "single_decode" else 0
        for name in ["default"] + [v for v in args.variants.split(",") if v]:
            key = f"{row_name(shape)} | kvattn {name}"
            with traced(name):
                fns[0]()
                torch.cuda.synchronize()
                plans = list(decode_launch._PLANS.values())
                facts = launch_facts(plans[-1].launches(max(shape.seq_lens()))[0]) if plans else None
                decode = (facts["num_kv_heads"], facts["m_blocks"]) if facts else None
                r = trace_fns(fns, args.reps, decode, bpk)
            r["launch"] = facts
            if not args.no_time:  # how much the stamps cost the launch (graph replay, L2 flushed)
                r["graph_us"] = timer.graph(fns, context=lambda: variant(name))
                r["graph_us_instrumented"] = timer.graph(fns, context=lambda: traced(name))
            if facts and facts["balanced"] and shape.suite == "decode":
                lanes = plan_lanes(shape, facts)
                r["plan_estimate"] = estimate(plan_units(shape, facts), facts, bpk, sms=sms, bandwidth=peak,
                                              lane_keys=lanes and lanes[1])
            out["rows"][key] = r
            print(summary_text(key, r), flush=True)
            if args.out:  # after every row: a run cut by its time limit keeps the rows it traced
                Path(args.out).write_text(json.dumps(out, indent=1))
        if args.no_readers or shape.label or shape.pos_encoding_mode != "NONE":  # (not the sweep's rows)
            continue
        x = torch.randn(int(prob.work.bytes) // 2, dtype=torch.float16, device=dev)
        res = torch.empty(16 * sms, device=dev)
        ctr = torch.zeros(1, dtype=torch.int32, device=dev)
        readers = {}
        for per_sm, block in ((4, 4096), (8, 2048)):
            def static(p=per_sm * sms, b=block, x=x):
                static_reader[(p,)](x, res, trace, x.numel() // b, BLOCK=b, num_warps=4)
            readers[f"static read {per_sm}/SM x {block * 2 // 1024} KB"] = static
        for per_sm, block, sub in ((4, 4096, 4), (8, 2048, 4), (8, 2048, 8)):
            def claim(p=per_sm * sms, b=block, s=sub, x=x):
                ctr.zero_()
                claiming_reader[(p,)](x, res, ctr, trace, x.numel() // (b * s), BLOCK=b, SUB=s, num_warps=4)
            readers[f"claiming read {per_sm}/SM x {sub} x {block * 2 // 1024} KB"] = claim
        for name, fn in readers.items():
            key = f"{row_name(shape)} | {name}"
            r = out["rows"][key] = trace_fns([fn], args.reps)
            print(summary_text(key, r), flush=True)
        del prob, x
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
