"""The decode launches of every decode row of the sweep and the grid, planned on a faked H200 (CPU, no
GPU), and the balanced launches' device plan replayed in Python.

Each row's call (``benchmarks/problems.py``'s: its lengths, ``max_seq_len`` = the longest, a 256 MiB
workspace, the pools' shapes and strides) runs once with ``tests/ops/decode/test_balanced_plan.py``'s
faked H200 (``plan.arch`` "sm90", 132 SMs, 60 MB of L2, its peak copy bandwidth, launches recorded and not run). A row's
record: the launch's tile (keys, warps, stages), keys in M or not, programs an SM, split count, balanced or uniform, grid,
merge (in the kernel, its partials a round, or a combine launch) and, for a balanced launch, what
``common.balance`` computes on the device from the lengths: ragged or not, the chunk, the units
(each request's count) and the longest unit. ``--compare`` lists the rows whose records differ.

    PYTHONPATH=src python3 lab/probes/decode_plan_rows.py --out before.json
    PYTHONPATH=src python3 lab/probes/decode_plan_rows.py --compare before.json after.json
    PYTHONPATH=src python3 lab/probes/decode_plan_rows.py --filter sw07 --filter sw12   # print only

``--override FIELD=VALUE`` plans under ``decode_configs.override`` (what ``benchmarks/run.py --ab
NAME:decode:FIELD=VALUE`` times). ``--gpu h100`` / ``unknown`` fakes the H100's peak copy bandwidth or
none (the main table replaces the long tiles by bandwidth an SM: ``configs.main_replaces_long``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # (the tests' tier: the plan's facts as the plan tests see them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

SM_COUNT = 132
WORKSPACE_MIB = 256  # benchmarks/runner.py's default
# Peak copy bandwidth (bytes/s) as runtime.device.memory_bandwidth derives it from the memory clock and
# bus width the driver reports: H200 3201 MHz x 6144 bits, H100 SXM 2619 MHz x 5120 bits; "unknown"
# is what a CPU (and the plan tests' faked H200) reports: the tables as measured on the H100.
BANDWIDTH = {"h200": 2 * 3201e6 * 6144 / 8, "h100": 2 * 2619e6 * 5120 / 8, "unknown": 0.0}


def _fake_h200(gpu="h200"):
    """tests/ops/decode/test_balanced_plan.py's _faked_h200, without pytest, with the peak copy
    bandwidth of ``gpu`` (``BANDWIDTH``; the two GPUs have the same SM count, and the L2 size reaches
    only the streaming tiles' spans)."""
    from kvattn.ops.decode import plan as decode_launch
    from kvattn.runtime import fast_launch

    os.environ["KVATTN_FUSED_MERGE"] = "1"
    os.environ["KVATTN_CALL_CACHE"] = "0"
    os.environ["KVATTN_BACKEND"] = "triton"
    decode_launch.arch = lambda device, interpreter: "sm90"
    decode_launch._device.sm_count = lambda device: SM_COUNT
    decode_launch._device.l2_bytes = lambda device: 60 << 20
    decode_launch._device.memory_bandwidth = lambda device: BANDWIDTH[gpu]
    fast_launch.Launch.__call__ = lambda self, call: None


def rows(filters=None):
    from benchmarks import shapes as grid, sweep

    out = [s for s in sweep.SWEEP if s.suite in ("decode", "spec_decode")]
    out += grid.select(grid.GRID, suites=("decode", "spec_decode"))
    if filters:
        out = [s for s in out if any(f.lower() in s.id.lower() for f in filters)]
    return out


def device_plan(lens, capacity, *, splits, unit_target, min_chunk, block_n, merge_block_s):
    """``common.balance.unit_counts`` and each unit's keys (``split_bounds``), in Python."""
    from kvattn.ops.common.balance import unit_cap

    lens = [min(max(n, 0), capacity) for n in lens]
    batch, total, longest = len(lens), sum(lens), max(lens)
    ragged = longest * batch * 4 > 5 * total
    chunk = max(-(-total // unit_target), -(-longest // unit_cap(merge_block_s)))
    chunk = max(-(-chunk // block_n) * block_n, min_chunk)
    counts = [max(-(-n // chunk), 1) if ragged else splits for n in lens]
    units = []  # (request, keys) in deal order
    for b, (n, k) in enumerate(zip(lens, counts)):
        piece = max(-(-(-(-n // k)) // block_n) * block_n, block_n)
        units += [(b, max(0, min(piece, n - s * piece))) for s in range(k)]
    return dict(ragged=ragged, chunk=chunk if ragged else None, units=len(units), counts=counts,
                longest_unit=max(k for _, k in units), unit_keys=[k for _, k in units],
                unit_request=[b for b, _ in units])


def plan_row(shape, overrides=None):
    """The record of one row (see the module docstring)."""
    import torch

    import kvattn
    from kvattn.ops.decode import configs as decode_configs
    from kvattn.ops.decode import plan as decode_launch

    decode_launch._PLANS.clear()
    built = []  # (plans are not cached under an override: the call's plan recorded as it is built)
    real = decode_launch._Plan
    decode_launch._Plan = lambda facts: built.append(real(facts)) or built[-1]
    lens = shape.seq_lens()
    b, q_len, hq, hkv, d, page = (shape.batch, shape.q_len, shape.num_qo_heads, shape.num_kv_heads,
                                  shape.head_dim, shape.page_size)
    need = [-(-n // page) for n in lens]
    width, total = max(max(need), 1), sum(need) + 1
    inner = (page, hkv) if shape.layout == "NHD" else (hkv, page)
    sf = None
    if shape.kv_dtype == "nvfp4":
        k = torch.empty((total, *inner, d // 2), dtype=torch.uint8)
        sf_t = torch.empty((total, *inner, d // 16), dtype=torch.float8_e4m3fn)
        sf = (sf_t, torch.empty_like(sf_t))
    else:
        # (float16 for bfloat16: the interpreter has no bfloat16, and both read the "half" table)
        dt = {"bfloat16": torch.float16, "fp8": torch.float8_e4m3fn}[shape.kv_dtype]
        k = torch.empty((total, *inner, d), dtype=dt)
    tables = torch.zeros(b, width, dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q_lens = shape.q_lens()
    q = torch.empty(sum(q_lens), hq, d, dtype=torch.float16)
    cu = None
    if shape.ragged_drafts:
        cu = torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    ws = torch.zeros(WORKSPACE_MIB << 20, dtype=torch.uint8)
    max_len = max(lens)
    ctx = decode_configs.override(**overrides) if overrides else _null()
    with ctx:
        kvattn.decode.xqa_batch_decode_with_kv_cache(
            q, (k, torch.empty_like(k)), ws, tables, seq_lens, max_len, bmm1_scale=0.1, bmm2_scale=1.0,
            out=torch.empty_like(q), kv_layout=shape.layout, q_len_per_req=q_len, kv_cache_sf=sf, q_cu_seq_lens=cu)
        decode_launch._Plan = real
        plan = built[-1]
        span = max_len
        split, combine, _, _, merged = plan.launches(span)
        cfg = plan.config_for(span)
        per_sm = decode_configs.resident_slots(cfg, sm_count=1, kv_format=plan.kv_format, head_dim=plan.head_dim,
                                               rope_query=plan.rope_query)
    c, f = split.constexprs, split.fixed
    rec = dict(
        id=shape.id, tile=[c["BLOCK_N"], split.options["num_warps"], split.options["num_stages"]],
        evict_first=cfg.evict_first, per_sm=per_sm, items=plan.items, keys_in_m=bool(c["KEYS_IN_M"]),
        block_m=plan.block_m, m_blocks=plan.m_blocks, splits=f["num_splits"], balanced=bool(c["BALANCED"]),
        grid=list(split.grid), merge_in_kernel=bool(c["MERGE"]), merge_block_s=c["MERGE_BLOCK_S"],
        combine=combine is not None, merged=merged, unit_target=f["unit_target"], min_chunk=c["MIN_CHUNK"],
    )
    if c["BALANCED"]:
        dp = device_plan(lens, width * page, splits=f["num_splits"], unit_target=f["unit_target"],
                         min_chunk=c["MIN_CHUNK"], block_n=c["BLOCK_N"], merge_block_s=c["MERGE_BLOCK_S"])
        rec["device"] = {k: v for k, v in dp.items() if k not in ("unit_keys", "unit_request", "counts")}
        rec["device"]["max_units_a_request"] = max(dp["counts"])
    return rec


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--filter", action="append")
    p.add_argument("--override", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--compare", nargs=2)
    p.add_argument("--gpu", choices=sorted(BANDWIDTH), default="h200",
                   help="whose peak copy bandwidth the faked GPU reports (h200; h100; unknown: none, as a CPU)")
    args = p.parse_args(argv)
    if args.compare:
        a, b = (json.load(open(x)) for x in args.compare)
        changed = [k for k in a if a[k] != b.get(k)]
        for k in changed:
            print(k)
            print("  before:", json.dumps(a[k]))
            print("  after: ", json.dumps(b.get(k)))
        print(f"{len(changed)} of {len(a)} rows' launches differ")
        return
    _fake_h200(args.gpu)
    over = {}
    for item in args.override:
        key, value = item.split("=", 1)
        over[key] = int(value) if value.lstrip("-").isdigit() else float(value)
    records = {}
    for s in rows(args.filter):
        rec = plan_row(s, over)
        records[s.id] = rec
        if not args.out:
            print(json.dumps(rec))
    if args.out:
        json.dump(records, open(args.out, "w"), indent=1)
        print(f"{len(records)} rows -> {args.out}")


if __name__ == "__main__":
    main()
