#!/usr/bin/env bash
# Decode's worst sweep rows beside FlashInfer (the whole sweep's worst ratios, lab/results/h200/2026-11-29/j-call3-sweep.md: sw43 1.63, sw57 1.41, sw54 1.37,
# sw52 1.36 are the four balanced launches on the streaming tiles (128 keys, 8 warps, unpipelined);
# sw33 a uniform streaming launch, sw51 / sw59 / sw12 / sw07 balanced long tiles), kvattn only,
# CUDA-graph replay, one call, arms as config overrides of the one tree: `nobal` the uniform split
# (balance_waves=0), `s3` the tiles pipelined (num_stages=3: the streaming tiles become the long
# ones), `w4` 64-key 4-warp tiles (more programs an SM). Then the host-time breakdown (issue 39's
# floors: the launcher alone, the key, the replay).
set -uo pipefail
source lab/probes/device_env.sh
timeout ${AB_S:-130} python3 benchmarks/run.py --suite sweep \
  --filter "sw43 ,sw57 ,sw54 ,sw52 ,sw33 ,sw51 ,sw59 ,sw12 ,sw07 " --graph-only --warmup 10 --rep 30 --no-peers \
  --ab nobal:decode:balance_waves=0 --ab s3:decode:num_stages=3 --ab w4:decode:block_n=64,num_warps=4 \
  --out "$OUT/ab-worst.json" --md "$OUT/ab-worst.md" --time-budget $(( ${AB_S:-130} - 15 )) 2> "$OUT/ab-worst.err"
grep "^| sw" "$OUT/ab-worst.md"
echo "A/B: $(( $(date +%s) - t0 )) s"
timeout ${HOST_S:-60} python3 benchmarks/host_time.py --breakdown --calls 200 --form-calls 100 \
  --json "$OUT/host-breakdown.json" > "$OUT/host-breakdown.txt" 2>&1; tail -n 25 "$OUT/host-breakdown.txt"
xz -9 "$OUT/ab-worst.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
