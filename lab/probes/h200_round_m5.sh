#!/usr/bin/env bash
# The lanes plan's final form (ragged batches in lanes, uniform ones dealt): the decode and common GPU
# tests under Triton 3.6, then the lanes form against the deal alone (`--ab deal:decode:balance_lanes=false`)
# on the balanced rows, kvattn only, graph replay, the rows furthest apart in probe m4 first. No carry.
set -uo pipefail
source lab/probes/device_env.sh
export PYTHONPATH=src:${PYTHONPATH:-}
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-110} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests/ops/decode tests/ops/common > "$OUT/pytest-decode.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest-decode.txt" | tail -n 30
echo "tests: $(( $(date +%s) - t0 )) s"
xz -9 "$OUT/pytest-decode.txt" 2>/dev/null
ROWS="sw10 ,sw07 ,sw19 ,sw36 ,sw24 ,sw00 ,sw23 ,ragged64x,sw09 ,sw11 ,sw28 ,sw41 ,sw49 ,sw45 ,sw58 ,sw16 ,sw03 ,sw05 ,sw06 ,sw61 ,sw12 ,sw14 ,sw04 ,sw30 "
left=$(( ${TOTAL:-200} - $(date +%s) + t0 ))
timeout $left python3 benchmarks/run.py --suite decode,sweep --filter "$ROWS" \
  --graph-only --warmup 10 --rep 30 --no-peers --ab deal:decode:balance_lanes=false \
  --out "$OUT/ab-lanes.json" --md "$OUT/ab-lanes.md" --time-budget $(( left - 12 )) 2> "$OUT/ab-lanes.err"
grep "^| " "$OUT/ab-lanes.md" | grep -v "^| class\|^|---" | cut -c1-200
xz -9 "$OUT/ab-lanes.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
