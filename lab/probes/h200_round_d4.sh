#!/usr/bin/env bash
# Last device call of round d (H200): the tail-filling split count against the shipped tree's
# whole-wave rule in one run (no peers: FlashInfer's figures for these rows are calls 2 and 3's),
# then the GPU suite on the final tree (changed families first; the sm_90a codegen files, which
# compile on the CPU and run in CI, left out), then the host-time forms table while time remains.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
t0=$(date +%s)
ROWS="sw03 decode,sw10 decode,sw12 decode,sw16 decode,sw33 decode,sw40 decode,decode bf16 256x1024 p64 NHD,decode bf16 64x8192 p64 NHD"
timeout 100 python3 benchmarks/run.py --suite sweep,decode --filter "$ROWS" --graph-only --no-fi --no-flex \
  --sdpa-backends "" --no-peers --warmup 10 --rep 30 --ab old:decode:tail_splits=0 \
  --out "$OUT/bench.json" 2> "$OUT/bench.err"
grep -E "^\[" "$OUT/bench.err" | cut -c1-200
echo "bench: $(( $(date +%s) - t0 )) s"
left=$(( ${TOTAL:-545} - 30 - $(date +%s) + t0 ))
OMP_NUM_THREADS=1 timeout -s INT $left python3 -m pytest -q -rfE -p no:cacheprovider -n 16 --junitxml="$OUT/junit.xml" \
  --ignore=tests/ops/mla/test_codegen.py --ignore=tests/ops/decode/test_codegen.py \
  tests/test_fuzz_corpus.py tests/test_testing.py tests/test_entry_routing.py tests/test_fuzz.py tests/runtime \
  tests/ops/decode tests/ops/prefill tests/ops/mla tests/integrations tests/ops tests/benchmarking \
  tests/reference tests > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 30
echo "tests: $(( $(date +%s) - t0 )) s"
left=$(( ${TOTAL:-545} - $(date +%s) + t0 ))
[ $left -gt 15 ] && timeout $left python3 benchmarks/host_time.py --forms-only --json "$OUT/host_forms.json" > "$OUT/host.txt" 2>&1
tail -n 5 "$OUT/host.txt" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
