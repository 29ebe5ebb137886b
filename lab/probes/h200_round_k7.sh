#!/usr/bin/env bash
# Issue 40's and 41's grids beside FlashInfer after candidate-k (one run: the decode and
# single-decode grids and the MLA grid, graph replay, FlashInfer's modules prebuilt), then the
# decode kernel's timing floors on the worst sweep rows (benchmarks/decode_floors.py through
# tune_decode.py: the same kernel without the fp8 conversion, without the in-kernel merge).
# Carry [".peers"] (FlashInfer 0.7.2.post1 staged by ../shared/peers/flashinfer/stage.sh).
set -uo pipefail
source lab/probes/device_env.sh
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
timeout ${GRID_S:-260} python3 benchmarks/run.py --suite decode,single_decode,mla --graph-only --fi-prebuild \
  --out "$OUT/grids.json" --md "$OUT/grids.md" --time-budget $(( ${GRID_S:-260} - 20 )) 2> "$OUT/grids.err"
tail -n 40 "$OUT/grids.md" | cut -c1-220
echo "grids: $(( $(date +%s) - t0 )) s"
timeout ${FLOORS_S:-150} python3 benchmarks/tune_decode.py --sweep --filter "sw36 ,sw49 ,sw07 ,sw54 " \
  --variants default,floor_rows64,floor_fp8mma_k,floor_fp8mma,floor_nomerge,floor_noloads \
  --out "$OUT/floors.json" > "$OUT/floors.txt" 2>&1
tail -n 40 "$OUT/floors.txt" | cut -c1-220
xz -9 "$OUT/grids.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
