"""How unevenly the MLA launch's programs load the SMs on the sweep's MLA rows (CPU model, no GPU).

The MLA launch splits every request into the same number of splits, each a fixed share of its own
request's length (ops/mla/kernels_gluon.py ``split_work``), so on a ragged batch the longest
request's programs set the launch's time. This model lays the programs out in launch order on an
H200's resident slots (132 SMs x the config's programs an SM; a slot takes the next program when
its last one ends), each program costing its keys plus a fixed 64 keys, and prints the makespan
over the perfectly balanced time (total keys / slots). Rows with few programs over many slots
(the batch too small to fill the GPU) read high for that reason too.

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
OVERHEAD_KEYS = 64  # a program's fixed cost, in keys


def makespan(lens: list[int], head_blocks: int, splits: int, slots: int) -> tuple[float, float]:
    programs = []
    for length in lens:
        chunk = -(-length // splits) if length else 0
        for s in range(splits):
            programs += [max(0, min(chunk, length - s * chunk)) + OVERHEAD_KEYS] * head_blocks
    free = [0.0] * slots
    end = 0.0
    for cost in programs:
        t = heapq.heappop(free) + cost
        end = max(end, t)
        heapq.heappush(free, t)
    return end, sum(programs) / slots


def main() -> None:
    for shape in sweep.draw():
        if shape.suite != "mla":
            continue
        fmt = "fp8" if shape.kv_dtype == "fp8" else "bfloat16"
        q_fp8 = shape.q_dtype == "fp8"
        cfg = configs.padded_heads("sm90", fmt, shape.num_qo_heads, q_fp8) or configs.config(
            "sm90", fmt, shape.num_qo_heads, q_fp8)
        head_blocks = -(-shape.num_qo_heads // cfg.block_h)
        lens = shape.seq_lens()
        splits = configs.num_splits(cfg, items=shape.batch * head_blocks, span=max(lens), sm_count=SM_COUNT,
                                    fit=1 << 20)
        end, ideal = makespan(lens, head_blocks, splits, SM_COUNT * cfg.programs_per_sm)
        print(f"{shape.label} {fmt:8s} Hq{shape.num_qo_heads:<3d} B{shape.batch:<3d} max {max(lens):6d} "
              f"mean {sum(lens) / len(lens):7.0f} splits {splits:2d} programs {shape.batch * head_blocks * splits:4d} "
              f"makespan / balanced {end / ideal:5.2f}")


if __name__ == "__main__":
    main()
