#!/usr/bin/env bash
# Branch fp8-instr on the GPU for the first time: the decode family's GPU tests (keys in M and the
# page offsets are in every paged decode launch they make), then probe l2's A/B of both changes
# against the current kernel (fp8 rows, then bf16 rows). One call, no carry.
set -uo pipefail
source lab/probes/device_env.sh
export PYTHONPATH=src:${PYTHONPATH:-}
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-170} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests/ops/decode tests/ops/common > "$OUT/pytest-decode.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest-decode.txt" | tail -n 30
echo "tests: $(( $(date +%s) - t0 )) s"
xz -9 "$OUT/pytest-decode.txt" 2>/dev/null
bash lab/probes/h200_round_l2.sh
echo "done: $(( $(date +%s) - t0 )) s"
