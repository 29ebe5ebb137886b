"""The launches kvattn makes for the MLA rows of the sweep and the MLA grid on an H200, planned on
the CPU (no GPU): the Hopper family and 132 SMs faked as tests/ops/mla/test_combine_launch.py
does, the Gluon kernels on (Triton >= 3.5), the benchmark's 256 MiB workspace and ``max_seq_len =
max(lens)`` (benchmarks/problems.py ``_mla_set``). For each row: the split kernel, balanced or
uniform, the split count, the grid, the combine and its tile; then the units the programs take on
the device (a Python copy of ``common.gluon_balance.balanced_split_work`` / ``split_work``), the
longest program's tiles, the live programs, and the partial bytes written and merged.

    PYTHONPATH=src python lab/probes/mla_launches.py [--filter sw7] [--override min_chunk=128,...]
                                                    [--diff min_chunk=128]

``--override`` plans under ``mla.configs.override`` (as ``benchmarks/run.py --ab`` times it);
``--diff`` prints only the rows whose launch differs between the table and the override.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch  # noqa: E402

from benchmarks import shapes as bench_shapes, sweep  # noqa: E402
from benchmarks.run import parse_ab  # noqa: E402
from kvattn.formats import FP8_DTYPE  # noqa: E402
from kvattn.ops.mla import configs as mla_configs, plan as mla_plan  # noqa: E402

SM_COUNT = 132
BANDWIDTH = 4.81e12  # an H200's peak copy bandwidth (bytes/s), as the driver gives it
WORKSPACE = 256 << 20
BLOCK_N = 64  # the Gluon kernels' tile (and the Triton kernel's on sm90)


def rows(filters=None):
    out = [s for s in sweep.draw() if s.suite == "mla"] + [s for s in bench_shapes.GRID if s.suite == "mla"]
    return [s for s in out if not filters or any(f in s.id for f in filters)]


def build_plan(shape) -> mla_plan._Plan:
    dt = {"bfloat16": torch.bfloat16, "fp8": FP8_DTYPE}
    q_dtype, kv_dtype = dt[shape.q_dtype], dt[shape.kv_dtype]
    lens = shape.seq_lens()
    page = shape.page_size
    pages_per_seq = -(-max(lens) // page)
    pages = max(1, sum(-(-n // page) for n in lens))
    rows_ = shape.q_len * shape.num_qo_heads
    facts = mla_plan.MLAFacts(
        device=torch.device("cpu"), interpreter=False, q_shape=(shape.batch, rows_, 576),
        q_stride=(rows_ * 576, 576, 1), q_dtype=q_dtype, kv_shape=(pages, page, 576),
        kv_stride=(page * 576, 576, 1), kv_dtype=kv_dtype, table_stride=(pages_per_seq, 1),
        out_stride=(rows_ * 512, 512, 1), ws_numel=WORKSPACE, has_logit=False, has_out_scale=False,
        aligned4=True, aligned16=True, gluon_on=True, gluon_ws_on=True, q_len=shape.q_len)
    with mock.patch.object(mla_plan, "arch", lambda device, interp: "sm90"), \
            mock.patch.object(mla_plan._device, "sm_count", lambda device: SM_COUNT), \
            mock.patch.object(mla_plan._device, "memory_bandwidth", lambda device: BANDWIDTH):
        return mla_plan._Plan(facts)


def units(lens, splits, balanced, min_chunk, block_n=BLOCK_N):
    """Keys of each live unit (request-major) and the grid's idle units, as the kernels cut them."""
    def piece(n, parts):  # common.softmax_merge.split_bounds
        return max(-(-(-(-n // parts)) // block_n) * block_n, block_n)

    def cut(n, parts):
        p = piece(n, parts)
        return [max(0, min(p, n - s * p)) for s in range(parts)]

    total, longest, batch = sum(lens), max(lens), len(lens)
    if balanced and longest * batch * 4 > 5 * total:  # ragged: balance.unit_counts
        chunk = max(-(-total // max(batch * (splits - 1), 1)), -(-longest // mla_configs.MAX_UNITS))
        chunk = max(-(-chunk // block_n) * block_n, min_chunk)
        per = [cut(n, max(1, -(-n // chunk))) for n in lens]
    else:
        per = [cut(n, splits) for n in lens]
    live = [k for p in per for k in p]
    return per, batch * splits - len(live)


def describe(shape, plan: mla_plan._Plan) -> dict:
    lens = shape.seq_lens()
    span = max(lens)
    plan = plan.for_span(span)  # (the narrow plan where padded programs would be short)
    split, combine, *_ = plan.launches(span)
    splits = split.fixed["num_splits"]
    balanced = bool(split.constexprs.get("BALANCED"))
    kernel = split.kernel.fn.__name__ if hasattr(split.kernel, "fn") else getattr(split.kernel, "__name__", "?")
    block_n = split.constexprs["BLOCK_N"]
    per, idle = units(lens, splits, balanced, plan.cfg.min_chunk, block_n)
    flat = [k for p in per for k in p]
    tiles = [-(-k // block_n) for k in flat]
    rows_ = plan.num_heads
    d = dict(
        kernel=kernel, block_h=plan.cfg.block_h, h_blocks=plan.h_blocks, splits=splits, balanced=balanced,
        grid=split.grid[0], live=len(flat) * plan.h_blocks, max_tiles=max(tiles), sum_tiles=sum(tiles),
        units_max=max(len(p) for p in per), idle=idle * plan.h_blocks,
        partial_mb=(len(flat) * rows_ * 513 * 4 / 1e6) if combine is not None else 0.0,
        combine=None,
    )
    if combine is not None:
        ck = combine.kernel.fn.__name__ if hasattr(combine.kernel, "fn") else "?"
        d["combine"] = (f"{ck} grid {combine.grid[0]}x{combine.grid[1]} BLOCK_S {combine.constexprs['BLOCK_S']}"
                        + (f"/{combine.constexprs['BLOCK_S_FEW']}" if "BLOCK_S_FEW" in combine.constexprs else "")
                        + (" pdl" if combine.options.get("launch_pdl") else ""))
    d["lens"] = f"B{len(lens)} max {span} mean {sum(lens) / len(lens):.0f} total {sum(lens)}"
    return d


def line(shape, d) -> str:
    mode = "balanced" if d["balanced"] else "uniform"
    return (f"{shape.id}\n    {d['lens']}; {d['kernel']} BLOCK_H {d['block_h']} x{d['h_blocks']} hb, S {d['splits']} "
            f"{mode}, grid {d['grid']} ({d['live']} live), longest program {d['max_tiles']} tiles, "
            f"{d['sum_tiles']} unit-tiles, <= {d['units_max']} units a request; "
            f"partials {d['partial_mb']:.1f} MB; combine: {d['combine']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--filter", action="append")
    ap.add_argument("--override", default="", help="FIELD=VALUE,... of mla.configs.override")
    ap.add_argument("--diff", default="", help="FIELD=VALUE,...: print the rows whose launch this changes")
    args = ap.parse_args()
    for shape in rows(args.filter):
        base = describe(shape, build_plan(shape))
        if args.diff:
            with mla_configs.override(**parse_ab("x:mla:" + args.diff)[2]):
                other = describe(shape, build_plan(shape))
            keys = ("kernel", "block_h", "splits", "balanced", "grid", "max_tiles", "live", "combine")
            same = all(base[k] == other[k] for k in keys)
            print(("same     " if same else "CHANGED  ") + shape.id)
            if not same:
                print("  table:   " + line(shape, base).split("\n")[1].strip())
                print("  override:" + line(shape, other).split("\n")[1].strip())
            continue
        if args.override:
            with mla_configs.override(**parse_ab("x:mla:" + args.override)[2]):
                base = describe(shape, build_plan(shape))
        print(line(shape, base))


if __name__ == "__main__":
    main()
