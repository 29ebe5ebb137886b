#!/usr/bin/env bash
# The whole GPU suite under Triton 3.6 (after candidate-k's merge, if k1 keeps it), then issue 39's
# forms table with every row's forms in one round and each row's bare launch beside it
# (benchmarks/host_time.py --breakdown, bounded by --seconds), one call, no carry.
set -uo pipefail
source lab/probes/device_env.sh
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-400} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest.txt" | tail -n 30 | tee "$OUT/pytest-summary.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
timeout ${HOST_S:-70} python3 benchmarks/host_time.py --breakdown --calls 300 --form-calls 300 --seconds 30 \
  --json "$OUT/host-forms.json" > "$OUT/host-forms.txt" 2>&1; cat "$OUT/host-forms.txt"
xz -9 "$OUT/pytest.txt" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
