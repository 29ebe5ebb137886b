#!/usr/bin/env bash
# After the lanes plan's second form (a uniform batch's items round robin; balanced D 256 grids of two
# programs an SM): the decode and common GPU tests under Triton 3.6, then the whole sweep beside
# FlashInfer (probe j3's run) with the dynamic deal as an arm (`--ab deal:decode:balance_lanes=false`).
# Carry [".peers"]. One call.
set -uo pipefail
source lab/probes/device_env.sh
t0=$(date +%s)
export PYTHONPATH=src:${PYTHONPATH:-}
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-130} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests/ops/decode tests/ops/common > "$OUT/pytest-decode.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest-decode.txt" | tail -n 30
echo "tests: $(( $(date +%s) - t0 )) s"
xz -9 "$OUT/pytest-decode.txt" 2>/dev/null
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
left=$(( ${TOTAL:-470} - $(date +%s) + t0 ))
timeout $left python3 benchmarks/run.py --suite sweep --fi-prebuild --ab deal:decode:balance_lanes=false \
  --out "$OUT/sweep.json" --md "$OUT/sweep.md" --time-budget $(( left - 90 )) 2> "$OUT/sweep.err"
grep "^| " "$OUT/sweep.md" | grep -v "^|---" | cut -c1-250
grep -c "time budget spent" "$OUT/sweep.md"
xz -9 "$OUT/sweep.err"
echo "done: $(( $(date +%s) - t0 )) s"
