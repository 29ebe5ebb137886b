#!/usr/bin/env bash
# One device call (H200, 2026-11-29, second session): quick GPU checks of the session's test changes
# (float64 oracles on the GPU, the one-row ragged mask case), the host-time forms table, a short GPU
# fuzz for its rate, then two same-run benchmarks beside FlashInfer: MLA 16-64 heads with the
# 64-head warp-specialised programs as an A/B (`seesaw`), MTP, ragged drafts and causal=False rows;
# fp8 decode with 8 warps / 4 stages as A/Bs. Each stage has its own time limit so the call fits.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
SEL_A=(--suite mla,spec_decode,prefill --filter "Hq16,Hq32,Hq64,ragged-drafts,q4 bf16,q8 bf16,4x2048x2048 p64,4x512x16384 p64")
SEL_B=(--suite decode,sweep --filter "decode fp8")
(timeout 300 python3 benchmarks/run.py "${SEL_A[@]}" --fi-prebuild-only > "$OUT/prebuild_a.txt" 2>&1;
 timeout 200 python3 benchmarks/run.py "${SEL_B[@]}" --fi-prebuild-only > "$OUT/prebuild_b.txt" 2>&1) &
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout -s INT 130 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 --junitxml="$OUT/junit.xml" \
  tests/ops/decode/test_ragged_drafts.py "tests/ops/mla/test_mtp.py::test_mla_mtp_grid" -k "one-row or Hq128 or Q4" \
  > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 15
echo "tests: $(( $(date +%s) - t0 )) s"
timeout 100 python3 benchmarks/host_time.py --forms-only --json "$OUT/host_forms.json" > "$OUT/host_forms.txt" 2>&1
tail -n 40 "$OUT/host_forms.txt"
echo "host: $(( $(date +%s) - t0 )) s"
timeout 100 python3 -m kvattn fuzz --device cuda --seconds 75 --seed 1 --json "$OUT/fuzz.json" > "$OUT/fuzz.txt" 2>&1
tail -n 12 "$OUT/fuzz.txt"
echo "fuzz: $(( $(date +%s) - t0 )) s"
wait
tail -n 2 "$OUT/prebuild_a.txt" "$OUT/prebuild_b.txt"
timeout 170 python3 benchmarks/run.py "${SEL_A[@]}" --graph-only --ab seesaw:mla:block_h=64 \
  --out "$OUT/bench_a.json" --md "$OUT/bench_a.md" 2> "$OUT/bench_a.err"
tail -n 3 "$OUT/bench_a.err"
echo "bench a: $(( $(date +%s) - t0 )) s"
left=$(( 555 - $(date +%s) + t0 ))
[ $left -gt 40 ] && timeout $left python3 benchmarks/run.py "${SEL_B[@]}" --graph-only \
  --ab w8:decode:num_warps=8 --ab s4:decode:num_stages=4 --out "$OUT/bench_b.json" --md "$OUT/bench_b.md" 2> "$OUT/bench_b.err"
tail -n 3 "$OUT/bench_b.err"
echo "done: $(( $(date +%s) - t0 )) s"
