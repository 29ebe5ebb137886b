#!/usr/bin/env bash
# The whole GPU suite under Triton 3.6 on main with keys in M and the page offsets merged, then
# probe l1's timelines of sw07 / sw12 / sw54 / sw57 (the first GPU run of benchmarks/timeline.py).
# One call, no carry.
set -uo pipefail
source lab/probes/device_env.sh
export PYTHONPATH=src:${PYTHONPATH:-}
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-380} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest.txt" | tail -n 30 | tee "$OUT/pytest-summary.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
xz -9 "$OUT/pytest.txt" 2>/dev/null
bash lab/probes/h200_round_l1.sh
echo "done: $(( $(date +%s) - t0 )) s"
