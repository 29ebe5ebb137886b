#!/usr/bin/env bash
# First device call of round e (H200): the whole GPU suite on the tree that fixed round d's
# failures (test switches kept, GPU memory handed back, the snapshot's TRITON_INTERPRET), changed
# files first, the sm_90a compile-only tests (marker codegen) left to CI; then the host-time forms table (issue 39).
set -uo pipefail
source lab/probes/device_env.sh
OMP_NUM_THREADS=1 timeout -s INT $(( ${TOTAL:-545} - 45 )) python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  --junitxml="$OUT/junit.xml" -m "not codegen" \
  tests/ops/decode/test_decode.py tests/ops/prefill/test_prefill.py tests/test_fuzz.py tests/test_fuzz_corpus.py \
  tests/integrations tests/runtime tests/ops tests/benchmarking tests/reference tests > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 40
echo "tests: $(( $(date +%s) - t0 )) s"
left=$(( ${TOTAL:-545} - $(date +%s) + t0 ))
[ $left -gt 15 ] && timeout $left python3 benchmarks/host_time.py --forms-only --json "$OUT/host_forms.json" > "$OUT/host.txt" 2>&1
tail -n 25 "$OUT/host.txt" 2>/dev/null
xz -9 "$OUT/pytest.txt" "$OUT/junit.xml" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
