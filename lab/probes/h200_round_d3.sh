#!/usr/bin/env bash
# Third device call of round d (H200): the tail-filling split count (decode configs.tail_fit) A/B'd
# beside the shipped rule and FlashInfer, on the sweep's worst decode rows, its unmeasured rows
# (sw48-sw79, MLA included) and the decode grid.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
ROWS=$(cat lab/probes/round_d3_rows.txt)
t0=$(date +%s)
timeout 150 python3 benchmarks/run.py --suite sweep,decode,single_decode --filter "$ROWS" --fi-prebuild-only > "$OUT/prebuild.txt" 2>&1
tail -n 3 "$OUT/prebuild.txt"
left=$(( 320 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/run.py --suite sweep,decode,single_decode --filter "$ROWS" --graph-only --no-flex \
  --sdpa-backends "" --warmup 10 --rep 30 --ab tail:decode:tail_splits=16 \
  --out "$OUT/bench.json" --md "$OUT/bench.md" 2> "$OUT/bench.err"
tail -n 75 "$OUT/bench.err" | cut -c1-230
echo "done: $(( $(date +%s) - t0 )) s"
