#!/usr/bin/env bash
# After the lanes plan's second form (a uniform batch's items round robin; balanced D 256 grids of two
# programs an SM): the decode and common GPU tests under Triton 3.6, then the whole sweep beside
# FlashInfer (probe j3's run) with the dynamic deal as an arm (`--ab deal:decode:balance_lanes=false`).
# Carry [".peers"]. One call.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-decode ${TESTS_S:-130} tests/ops/decode tests/ops/common
echo "tests: $(( $(date +%s) - t0 )) s"
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
left=$(( ${TOTAL:-470} - $(date +%s) + t0 ))
timeout $left python3 benchmarks/run.py --suite sweep --fi-prebuild --ab deal:decode:balance_lanes=false \
  --out "$OUT/sweep.json" --md "$OUT/sweep.md" --time-budget $(( left - 90 )) 2> "$OUT/sweep.err"
grep "^| " "$OUT/sweep.md" | grep -v "^|---" | cut -c1-250
grep -c "time budget spent" "$OUT/sweep.md"
xz -9 "$OUT/sweep.err"
echo "done: $(( $(date +%s) - t0 )) s"
