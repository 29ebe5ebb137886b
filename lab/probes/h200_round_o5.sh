#!/usr/bin/env bash
# Next (not run yet): the balanced MLA combine merging 2 / 4 / 8 heads a program (configs'
# combine_heads: the plan's per-program derivation shared; sm_90a registers 32 / 56 / 102 / 128 at
# 1 / 2 / 4 / 8 heads, lab/notes/mla-ragged.md "The balanced combine's registers") against the
# table (one head) and the uniform split (`unif2k`) on the equal grid rows and the balanced sweep
# rows, graph times and per-kernel times; then the MLA balanced tests with the field on the GPU.
# Then sw12's / sw07's paged read floor (lab/probes/paged_read_floor.py). No carry, one call (~250 s). Adopt a count only if no row loses; then the whole GPU suite.
set -uo pipefail
source lab/probes/device_env.sh
timeout 120 python3 benchmarks/run.py --suite mla,sweep --filter "Hq16 64x4096,Hq32 64x4096,Hq64 64x4096,Hq64 32x16384,sw66 ,sw67 ,sw68 ,sw69 ,sw70 ,sw77 ,sw78 " \
  --graph-only --warmup 10 --rep 30 --no-peers --ab hc2:mla:combine_heads=2 --ab hc4:mla:combine_heads=4 \
  --ab hc8:mla:combine_heads=8 --ab unif2k:mla:min_chunk=2048 --out "$OUT/mla-hc.json" --md "$OUT/mla-hc.md" \
  --time-budget 110 2>/dev/null | grep "^| " | grep -v "^| class\|^|---" | cut -c1-260
timeout 40 python3 lab/probes/kernel_times.py --filter "Hq64 64x4096" --filter "Hq16 64x4096" --filter "sw70 " --calls 40 \
  --ab hc2:mla:combine_heads=2 --ab hc4:mla:combine_heads=4 --ab hc8:mla:combine_heads=8 2>&1 | grep -v Warn
gpu_tests mla-balanced 60 tests/ops/mla/test_balanced.py tests/ops/mla/test_seesaw_plan.py tests/ops/mla/test_combine_launch.py
# sw12's and sw07's pages read bare at 1-4 programs an SM (the decode kernel's copies and products,
# no softmax): is ~26 GB/s an SM the loads' rate or the kernel's?
timeout 60 python3 lab/probes/paged_read_floor.py --filter "sw12 " --filter "sw07 " --json "$OUT/paged-read.json" 2>&1 \
  | grep -v Warn
echo "done: $(( $(date +%s) - t0 )) s"
