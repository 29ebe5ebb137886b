#!/usr/bin/env bash
# Session o, call 1 (no carry, ~250 s): where the split MLA launches of equal batches lose time at
# 16-64 heads (per-kernel times, the balanced launch against the uniform one by min_chunk arms, and
# their graph times), the fp8 16-head table choice by span (padded e4m3 programs for long ones)
# against the heads-in-N kernel (`narrow` arm), and sw12's / sw07's per-program timelines.
set -uo pipefail
source lab/probes/device_env.sh
MLA_ROWS=(--filter "bf16 Hq16 64x4096" --filter "Hq32 64x4096" --filter "bf16 Hq64 64x4096" --filter "fp8 Hq16 64x4096"
          --filter "bf16 Hq16 64x16384" --filter "Hq64 32x16384")
timeout 100 python3 lab/probes/kernel_times.py "${MLA_ROWS[@]}" --calls 40 --ab unif2k:mla:min_chunk=2048 \
  --ab unif4k:mla:min_chunk=4096 --ab unif8k:mla:min_chunk=8192 --json "$OUT/kt-mla.json" 2>&1 | grep -v Warning
timeout 150 python3 benchmarks/run.py --suite mla,sweep --filter "64x4096,bf16 Hq16 64x16384,Hq64 32x16384" \
  --graph-only --warmup 10 --rep 30 --no-peers --ab unif2k:mla:min_chunk=2048 --ab unif8k:mla:min_chunk=8192 \
  --ab unif4k:mla:min_chunk=4096 --out "$OUT/mla-unif.json" --md "$OUT/mla-unif.md" --time-budget 135 2>/dev/null \
  | grep "^| " | grep -v "^| class\|^|---" | cut -c1-260
timeout 90 python3 benchmarks/run.py --suite mla,sweep --filter "mla fp8 Hq16,sw67 ,sw68 ,sw76 ,sw79 " \
  --graph-only --warmup 10 --rep 30 --no-peers --ab narrow:mla:block_h=16 \
  --out "$OUT/mla-fp8rule.json" --md "$OUT/mla-fp8rule.md" --time-budget 80 2>/dev/null \
  | grep "^| " | grep -v "^| class\|^|---" | cut -c1-260
timeout 40 python3 lab/probes/kernel_times.py --filter "sw12 " --filter "sw07 " --calls 40 2>&1 | grep -v Warning
timeout 100 python3 benchmarks/timeline.py --sweep --filter "sw12 ,sw07 " --no-readers --reps 10 \
  --out "$OUT/tl.json" 2>&1 | tail -n 60
echo "done: $(( $(date +%s) - t0 )) s"
