#!/usr/bin/env bash
# The whole GPU suite under Triton 3.6 with the lanes plan of ragged batches (common.balance.lane_units:
# every program group a fixed share of the batch's tiles, the default) and the PAGING tuple; then the
# lanes plan against the dynamic deal (`--ab deal:decode:balance_lanes=false`) on every sweep row the
# faked H200 plan sends to the balanced launch (27 rows), the grid's ragged rows and two spec-decode
# rows, kvattn only, graph replay. One call, no carry.
set -uo pipefail
source lab/probes/device_env.sh
export PYTHONPATH=src:${PYTHONPATH:-}
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-330} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest.txt" | tail -n 30 | tee "$OUT/pytest-summary.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
xz -9 "$OUT/pytest.txt" 2>/dev/null
ROWS="sw00 ,sw03 ,sw04 ,sw05 ,sw06 ,sw07 ,sw09 ,sw10 ,sw11 ,sw12 ,sw14 ,sw15 ,sw16 ,sw19 ,sw23 ,sw24 ,sw28 ,sw30 ,sw32 ,sw36 ,sw40 ,sw41 ,sw45 ,sw48 ,sw49 ,sw58 ,sw59 ,sw43 ,sw52 ,ragged128x,ragged64x"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
timeout $left python3 benchmarks/run.py --suite decode,sweep --filter "$ROWS" \
  --graph-only --warmup 10 --rep 30 --no-peers --ab deal:decode:balance_lanes=false \
  --out "$OUT/ab-lanes.json" --md "$OUT/ab-lanes.md" --time-budget $(( left - 15 )) 2> "$OUT/ab-lanes.err"
grep "^| " "$OUT/ab-lanes.md" | grep -v "^| class\|^|---" | cut -c1-230
xz -9 "$OUT/ab-lanes.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
