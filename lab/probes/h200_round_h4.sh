#!/usr/bin/env bash
# The last device call of round h (H200), on the final tree: issue 43's differential fuzz run
# (12 workers, ~225 s: >= 20,000 calls at the ~110 calls/s of round f) while FlashInfer compiles
# the sweep's variants in the background; the two GPU tests the whole-suite call failed, after
# their fixes; then the sweep beside FlashInfer, the MLA rows first (never measured beside it),
# then the decode rows in what time is left. Carry [".peers"]. ~570 s.
set -uo pipefail
source lab/probes/device_env.sh
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=8
(timeout 330 python3 benchmarks/run.py --suite sweep --fi-prebuild-only > "$OUT/prebuild.txt" 2>&1) &
KVATTN_FUZZ_COMPILE_LOG="$OUT/compiles.jsonl" timeout ${FUZZ_S:-250} python3 -m kvattn fuzz --device cuda \
  --seconds $(( ${FUZZ_S:-250} - 25 )) --jobs 12 --shared-classes --json "$OUT/fuzz.json" > "$OUT/fuzz.txt" 2>&1
echo "fuzz rc $? at $(( $(date +%s) - t0 )) s"; tail -n 25 "$OUT/fuzz.txt"
OMP_NUM_THREADS=1 timeout -s INT 70 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 tests/ops/mla/test_balanced.py \
  tests/test_benchmarks_ptx_snapshot.py tests/runtime/test_call_cache_forms.py > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 10
wait; tail -n 3 "$OUT/prebuild.txt"; echo "prebuilt at $(( $(date +%s) - t0 )) s"
timeout 150 python3 benchmarks/run.py --suite sweep --filter " mla " --out "$OUT/sweep-mla.json" --md "$OUT/sweep-mla.md" \
  --time-budget 100 2> "$OUT/sweep-mla.err"; tail -n 3 "$OUT/sweep-mla.err"
left=$(( ${TOTAL:-570} - $(date +%s) + t0 ))
echo "decode rows: $left s"
[ $left -gt 40 ] && timeout $left python3 benchmarks/run.py --suite sweep --filter decode --out "$OUT/sweep-decode.json" \
  --md "$OUT/sweep-decode.md" --time-budget $(( left - 75 )) 2> "$OUT/sweep-decode.err"; tail -n 3 "$OUT/sweep-decode.err"
(cd "$OUT" && xz -9 compiles.jsonl pytest.txt prebuild.txt sweep-mla.err sweep-decode.err 2>/dev/null
 tar -cf logs.tar *.xz 2>/dev/null && rm -f *.xz)
echo "done: $(( $(date +%s) - t0 )) s"
