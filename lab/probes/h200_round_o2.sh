#!/usr/bin/env bash
# Session o, call 2 (no carry, ~200 s): the balanced MLA combine with its plan before the PDL wait
# against the uniform split (min_chunk arms) on the equal grid rows and the balanced sweep rows;
# sw12's timeline under the lanes' request caps 64 / 128 / 256 and the deal; those caps as arms on
# the balanced decode rows.
set -uo pipefail
source lab/probes/device_env.sh
timeout 150 python3 benchmarks/run.py --suite mla,sweep --filter "Hq16 64x4096,Hq32 64x4096,Hq64 64x4096,Hq64 32x16384,sw66 ,sw67 ,sw68 ,sw69 ,sw70 ,sw77 ,sw78 " \
  --graph-only --warmup 10 --rep 30 --no-peers --ab unif2k:mla:min_chunk=2048 --ab unif4k:mla:min_chunk=4096 \
  --out "$OUT/mla-comb.json" --md "$OUT/mla-comb.md" --time-budget 140 2>/dev/null \
  | grep "^| " | grep -v "^| class\|^|---" | cut -c1-230
timeout 60 python3 lab/probes/kernel_times.py --filter "Hq64 64x4096" --filter "sw70 " --filter "sw66 " --calls 40 2>&1 | grep -v Warn
timeout 120 python3 benchmarks/timeline.py --sweep --filter "sw12 " --variants cap64,cap128,cap256,deal --no-readers --reps 10 \
  --out "$OUT/tl-caps.json" 2>&1 | grep -v Warn | tail -n 50
kv_rows ab-caps 110 "sw12 ,sw07 ,sw30 ,sw09 ,sw28 ,sw41 ,sw45 ,sw49 ,sw23 ,sw62 " --ab cap128:decode:balance_lanes_cap=128 \
  --ab cap256:decode:balance_lanes_cap=256
echo "done: $(( $(date +%s) - t0 )) s"
