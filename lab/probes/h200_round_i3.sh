#!/usr/bin/env bash
# Third device call of round i (H200, Triton 3.6): main after candidate-i's merge (Gluon MLA over
# pages of 16/32, the MLA combine as a dependent launch, decode's last-wave split rule): the suites
# its changes reach (MLA, decode, return_lse, edge calls, the call cache on the GPU), then issue 43's
# differential fuzz run alone on the machine (12 workers). The whole suite under Triton 3.7.1 is
# h200_round_g3.sh. No carry.
set -uo pipefail
source lab/probes/device_env.sh
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-300} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests/ops/mla tests/ops/decode tests/test_return_lse.py tests/test_edge_calls.py \
  tests/runtime/test_call_cache_gpu.py > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest.txt" | tail -n 30 | tee "$OUT/pytest-summary.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
fz=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
KVATTN_FUZZ_COMPILE_LOG="$OUT/compiles.jsonl" timeout $fz python3 -m kvattn fuzz --device cuda \
  --seconds $(( fz - 12 )) --jobs 12 --shared-classes --json "$OUT/fuzz.json" 2>&1 \
  | grep -v "UserWarning\|capture_end()" > "$OUT/fuzz.txt"
echo "fuzz at $(( $(date +%s) - t0 )) s"; tail -n 20 "$OUT/fuzz.txt"
xz -9 "$OUT/pytest.txt" "$OUT/compiles.jsonl" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
