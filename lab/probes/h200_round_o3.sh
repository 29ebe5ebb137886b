#!/usr/bin/env bash
# Session o, call 3 (no carry, ~500 s): the balanced MLA combine at rounds of at most 4 partials over
# many programs (plan._WIDE_MERGE_PROGRAMS_PER_SM) against the uniform split (`unif2k`) on the equal
# grid rows and on the balanced sweep rows, its per-kernel times; the whole GPU suite (Triton 3.6);
# then sw12's in-kernel merge at wider rounds (balance_merge_values) with the lanes' cap at 64.
set -uo pipefail
source lab/probes/device_env.sh
timeout 80 python3 benchmarks/run.py --suite mla,sweep --filter "Hq16 64x4096,Hq32 64x4096,Hq64 64x4096,Hq64 32x16384,sw66 ,sw70 ,sw77 " \
  --graph-only --warmup 10 --rep 30 --no-peers --ab unif2k:mla:min_chunk=2048 \
  --out "$OUT/mla-comb.json" --time-budget 75 2>/dev/null | grep -v "^| " | grep "us\|^shape" | cut -c1-200
timeout 30 python3 lab/probes/kernel_times.py --filter "Hq64 64x4096" --filter "sw70 " --calls 40 2>&1 | grep -v Warn
echo "mla: $(( $(date +%s) - t0 )) s"
gpu_tests pytest ${TESTS_S:-345} tests
echo "tests: $(( $(date +%s) - t0 )) s"
timeout 50 python3 benchmarks/run.py --suite sweep --filter "sw12 ,sw07 ,sw30 " --graph-only --warmup 10 --rep 30 --no-peers \
  --ab mv32c64:decode:balance_merge_values=32,balance_lanes_cap=64 --ab mv64c64:decode:balance_merge_values=64,balance_lanes_cap=64 \
  --out "$OUT/ab-merge.json" --time-budget 45 2>/dev/null | grep -v "^| " | grep "us\|^shape" | cut -c1-220
echo "done: $(( $(date +%s) - t0 )) s"
