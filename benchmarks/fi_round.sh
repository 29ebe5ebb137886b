#!/usr/bin/env bash
# One device call of a measuring round beside FlashInfer: the staged FlashInfer (carry [".peers"])
# compiles the variants a selection needs in the background while the GPU tests run, then the
# benchmark runs with FlashInfer as a peer. Every stage is optional, by variable:
#   PREBUILD="--suite ... [--filter ...]"   run.py selection whose FlashInfer variants to compile (shell words:
#                                           quote a filter with spaces inside the variable)
#   TESTS="tests/... -k ..."                pytest arguments (NPROC xdist workers, default 8)
#   BENCH="--suite ... [run.py args]"       the benchmark ($OUT/bench.json, $OUT/bench.md)
# Logs go to $OUT (or ./out). The machine keeps FlashInfer's and Triton's caches while it stays
# warm, so a second call right after the first compiles nothing again.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source .peers/flashinfer/activate.sh
export PYTHONPATH=${TRITON_SITE:+$TRITON_SITE:}src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
status=0
if [ -n "${PREBUILD:-}" ]; then
  (eval timeout "${PREBUILD_TIMEOUT:-360}" python3 benchmarks/run.py "$PREBUILD" --fi-prebuild-only > "$OUT/prebuild.txt" 2>&1) &
fi
if [ -n "${TESTS:-}" ]; then
  OMP_NUM_THREADS=1 timeout -s INT "${TEST_TIMEOUT:-300}" python3 -m pytest -q -rfE -p no:cacheprovider \
    -n "${NPROC:-8}" $TESTS > "$OUT/pytest.txt" 2>&1 || status=1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 25
fi
wait
[ -f "$OUT/prebuild.txt" ] && tail -n 3 "$OUT/prebuild.txt"
if [ -n "${BENCH:-}" ]; then
  eval timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/run.py "$BENCH" --out "$OUT/bench.json" --md "$OUT/bench.md" \
    2> "$OUT/bench.err" || status=1
  tail -n 5 "$OUT/bench.err"
fi
exit $status
