#!/usr/bin/env bash
# The device call on round f's final tree (H200): the tests that failed or were added after the
# round-e GPU suite (the 300-request ragged decode case with its oracle by length groups, the
# two-worker GPU fuzz, the graph mode's capture after running out of memory), then issue 43's
# differential fuzz run of the five functions in every mode, twelve workers sharing their classes.
set -uo pipefail
source lab/probes/device_env.sh
OMP_NUM_THREADS=1 timeout -s INT 150 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 \
  "tests/ops/decode/test_decode.py::test_batch_decode_matches_oracles[bf16-ragged-300-requests-lognormal]" \
  tests/ops/decode/test_decode.py::test_oracle_by_length_groups_equals_the_oracle_at_once \
  tests/test_fuzz_jobs.py::test_two_workers_on_the_gpu \
  tests/test_fuzz.py::test_graph_mode_capture_out_of_memory_hands_the_cache_back_and_captures_again \
  > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 20
echo "tests: $(( $(date +%s) - t0 )) s"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
KVATTN_FUZZ_COMPILE_LOG="$OUT/compiles.jsonl" timeout $left python3 -m kvattn fuzz --device cuda \
  --seconds $(( left - 50 )) --jobs 12 --shared-classes --json "$OUT/fuzz.json" > "$OUT/fuzz.txt" 2>&1
echo "fuzz rc $?"; grep -v "UserWarning\|capture_end()" "$OUT/fuzz.txt" | tail -n 30
xz -9 "$OUT/compiles.jsonl" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
