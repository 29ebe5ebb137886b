"""How unevenly the MLA launch's programs load the SMs on the sweep's MLA rows (CPU model, no GPU).

The MLA launch splits every request into the same number of splits, each a fixed share of its own
request's length (ops/mla/kernels_gluon.py ``split_work``), so on a ragged batch the longest
request's programs set the launch's time. This model lays the programs out in launch order on an
H200's resident slots (132 SMs x the config's programs an SM; a slot takes the next program when
its last one ends), each program costing its keys plus a fixed 64 keys, and prints the makespan
over the perfectly balanced time (total keys / slots), for the uniform split and for the balanced
split of the launch's plan (mla/plan.py, ``BALANCED``; "uniform kept" where the plan keeps the
uniform split: one split, or an equal batch). Rows with few programs over many slots (the batch
too small to fill the GPU) read high for that reason too. It plans with the table's ``min_chunk``
(256); launches the warp-specialised kernel runs now plan with ``configs.SEESAW_PLAN`` (128 keys,
one split up to 256), which ``lab/probes/mla_launches.py`` lays out as the plan does.

    PYTHONPATH=src python lab/probes/mla_balance_sim.py
"""

from __future__ import annotations

import heapq
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import sweep  # noqa: E402
from kvattn.ops.mla import configs  # noqa: E402

SM_COUNT = 132  # H200 (and H100 SXM)
BANDWIDTH = 4.81e12  # an H200's peak copy bandwidth (bytes/s)
OVERHEAD_KEYS = 64  # a program's fixed cost, in keys


def makespan(lens: list[int], head_blocks: int, splits: int, slots: int) -> tuple[float, float]:
    """The uniform split's programs laid out (:func:`lay_out`), and the perfectly balanced time."""
    programs = []
    for length in lens:
        chunk = -(-length // splits) if length else 0
        for s in range(splits):
            programs += [max(0, min(chunk, length - s * chunk)) + OVERHEAD_KEYS] * head_blocks
    return lay_out(programs, slots), sum(programs) / slots


def balanced_programs(lens: list[int], splits: int, block_n: int, min_chunk: int) -> list[int] | None:
    """The keys of each unit of the balanced split (common.balance.launch_unit, MLA's plan), or
    None where the launch keeps the uniform split (configs.balanced)."""
    if not configs.balanced(splits=splits, batch=len(lens), invariant=False, span=max(lens), min_chunk=min_chunk):
        return None
    total, longest, batch = sum(lens), max(lens), len(lens)
    if longest * batch * 4 <= 5 * total:
        return None  # an equal batch: the uniform split
    chunk = max(-(-total // max(batch * (splits - 1), 1)), -(-longest // configs.MAX_UNITS))
    chunk = max(-(-chunk // block_n) * block_n, min_chunk)
    units = []
    for length in lens:
        n = max(1, -(-length // chunk))
        piece = max(-(-(-(-length // n)) // block_n) * block_n, block_n)
        units += [max(0, min(piece, length - s * piece)) for s in range(n)]
    return units


def lay_out(costs: list[int], slots: int) -> float:
    """The time the programs ``costs`` take in launch order on ``slots`` resident slots (a slot
    takes the next program when its last one ends)."""
    free = [0.0] * slots
    end = 0.0
    for cost in costs:
        t = heapq.heappop(free) + cost
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def main() -> None:
    for shape in sweep.draw():
        if shape.suite != "mla":
            continue
        fmt = "fp8" if shape.kv_dtype == "fp8" else "bfloat16"
        q_fp8 = shape.q_dtype == "fp8"
        lens = shape.seq_lens()
        narrow = configs.config("sm90", fmt, shape.num_qo_heads, q_fp8)
        cfg = configs.padded_heads("sm90", fmt, shape.num_qo_heads, q_fp8, sm_count=SM_COUNT,
                                   bandwidth=BANDWIDTH) or narrow
        head_blocks = -(-shape.num_qo_heads // cfg.block_h)
        splits = configs.num_splits(cfg, items=shape.batch * head_blocks, span=max(lens), sm_count=SM_COUNT,
                                    fit=1 << 20)
        if cfg is not narrow and max(lens) < configs.padded_min_keys(fmt, q_fp8) * splits:  # (plan.for_span)
            cfg, head_blocks = narrow, -(-shape.num_qo_heads // narrow.block_h)
            splits = configs.num_splits(cfg, items=shape.batch * head_blocks, span=max(lens), sm_count=SM_COUNT,
                                        fit=1 << 20)
        slots = SM_COUNT * cfg.programs_per_sm
        end, ideal = makespan(lens, head_blocks, splits, slots)
        units = balanced_programs(lens, splits, 64, cfg.min_chunk)
        # the balanced split: its units, each head block a program, in launch order (idle units cost the overhead)
        bal = "uniform kept"
        if units is not None:
            idle = head_blocks * (shape.batch * splits - len(units))
            costs = [u + OVERHEAD_KEYS for u in units for _ in range(head_blocks)] + [OVERHEAD_KEYS] * idle
            bal = f"balanced split {lay_out(costs, slots) / ideal:5.2f}"
        print(f"{shape.label} {fmt:8s} Hq{shape.num_qo_heads:<3d} B{shape.batch:<3d} max {max(lens):6d} "
              f"mean {sum(lens) / len(lens):7.0f} splits {splits:2d} programs {shape.batch * head_blocks * splits:4d} "
              f"makespan / balanced {end / ideal:5.2f}  {bal}")


if __name__ == "__main__":
    main()
