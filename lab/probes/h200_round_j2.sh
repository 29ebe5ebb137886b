#!/usr/bin/env bash
# Candidate-j on the GPU (H200, Triton 3.6), one call, no carry: the whole GPU suite (its kernels'
# tuple parameters reach every decode and prefill launch), then a same-run A/B inside the one tree
# through `--ab` config overrides, kvattn only, CUDA-graph replay (the MLA one is in h200_round_j1.sh):
# - decode: the balanced launch's merge of 16 partials a round (`kvattn`) against 4 (`kvattn-m16`,
#   the previous launch exactly) and 1 (`kvattn-m4`, the cost of a merge round)
#   (lab/notes/decode-ragged-batches.md "One KV head: the merge rounds at the end of the deal").
set -uo pipefail
source lab/probes/device_env.sh
OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-390} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" ${TESTS:-tests} > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/pytest.txt" | tail -n 30 | tee "$OUT/pytest-summary.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
timeout ${AB_S:-150} python3 benchmarks/run.py --suite decode,sweep \
  --filter "sw07 ,sw12 ,sw06 ,sw16 ,sw51 ,16x4096 p16 NHD,16x4096 p64 NHD,64x8192 p16 NHD h8/1" \
  --graph-only --warmup 10 --rep 30 --no-peers --ab m16:decode:balance_merge_values=16 \
  --ab m4:decode:balance_merge_values=4 --out "$OUT/ab-merge.json" --md "$OUT/ab-merge.md" --time-budget $(( ${AB_S:-150} - 30 )) \
  2> "$OUT/ab-merge.err"; tail -n 25 "$OUT/ab-merge.md"
echo "decode A/B: $(( $(date +%s) - t0 )) s"
xz -9 "$OUT/pytest.txt" "$OUT/ab-merge.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
