#!/usr/bin/env bash
# The streaming tiles keep the uniform split (plan change): the decode GPU tests, then the four sweep
# rows whose launch it changes (sw43, sw52, sw54, sw57) and two it must not (sw33, sw35), the
# previous plan as an arm (no override restores it: the arm is j4's `nobal` inverted, so this
# times the new tree alone; j4's same-run figures are the A/B).
set -uo pipefail
source lab/probes/device_env.sh
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-150} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests/ops/decode > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest.txt" | tail -n 20 | tee "$OUT/pytest-summary.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
timeout ${AB_S:-60} python3 benchmarks/run.py --suite sweep --filter "sw43 ,sw52 ,sw54 ,sw57 ,sw33 ,sw35 " \
  --graph-only --warmup 10 --rep 30 --no-peers --out "$OUT/rows.json" --md "$OUT/rows.md" \
  --time-budget $(( ${AB_S:-60} - 10 )) 2> "$OUT/rows.err"; grep "^| sw" "$OUT/rows.md" | cut -c1-160
xz -9 "$OUT/pytest.txt" "$OUT/rows.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
