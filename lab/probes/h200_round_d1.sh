#!/usr/bin/env bash
# First device call of round d (H200): the missing benchmark rows beside FlashInfer (prefill causal
# against bidirectional, MLA 16/32/64 heads, fp8 and MTP), fp8 decode split A/Bs, the fuzz with a
# compile log (what makes a call cold), and the prefill graph-mode compile error probed.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
ROWS="prefill bf16 4x2048x2048 p64 HND,prefill bf16 4x512x16384 p64 HND,mla bf16 Hq16,mla fp8 Hq16,mla bf16 Hq32,mla bf16 Hq64,decode fp8"
(timeout 240 python3 benchmarks/run.py --suite decode,prefill,mla --filter "$ROWS" --fi-prebuild-only > "$OUT/prebuild.txt" 2>&1) &
t0=$(date +%s)
TRITON_REPRODUCER_PATH="$OUT/prefill_repro.mlir" timeout 90 python3 lab/probes/prefill_graph_compile.py \
  lab/results/h200/2026-11-29/b-call2-fuzz_probe.json > "$OUT/prefill_probe.txt" 2>&1
grep -E "FAILED|==|Error|ok" "$OUT/prefill_probe.txt" | head -n 20
echo "probe: $(( $(date +%s) - t0 )) s"
KVATTN_FUZZ_COMPILE_LOG="$OUT/compiles.jsonl" timeout 150 python3 -m kvattn fuzz --device cuda --seconds 90 --jobs 12 \
  --shared-classes --json "$OUT/fuzz.json" > "$OUT/fuzz.txt" 2>&1
tail -n 14 "$OUT/fuzz.txt"
echo "fuzz: $(( $(date +%s) - t0 )) s"
wait
tail -n 3 "$OUT/prebuild.txt"
left=$(( 540 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/run.py --suite decode,prefill,mla --filter "$ROWS" --graph-only --no-flex --sdpa-backends "" \
  --ab uniform:decode:balance_waves=0 --ab bw8:decode:balance_waves=8 --ab mc256:decode:balance_min_chunk=256 \
  --ab bn64:decode:block_n=64 \
  --out "$OUT/bench.json" --md "$OUT/bench.md" 2> "$OUT/bench.err"
tail -n 30 "$OUT/bench.err"
echo "done: $(( $(date +%s) - t0 )) s"
