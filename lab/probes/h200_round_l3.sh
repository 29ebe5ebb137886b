#!/usr/bin/env bash
# Issue 41's MLA grid beside FlashInfer's fa3 MLA (a run with the decode grids ran out of time before it):
# the 22 rows of `--suite mla` (16 / 32 / 64 / 128 heads, bf16 and fp8, Q 1 / 2 / 4), graph
# replay, FlashInfer's two MLA modules prebuilt, no other peer (no SDPA, no flex), one call; then
# the fp8 16-head row under tune_mla.py's fp8ws / fp8ws_noconvert arms.
# Carry [".peers"] (FlashInfer 0.7.2.post1 staged by ../shared/peers/flashinfer/stage.sh).
set -uo pipefail
source lab/probes/device_env.sh
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
timeout ${MLA_S:-200} python3 benchmarks/run.py --suite mla --graph-only --fi-prebuild --no-flex --sdpa-backends "" \
  --out "$OUT/mla-grid.json" --md "$OUT/mla-grid.md" --time-budget $(( ${MLA_S:-200} - 30 )) 2> "$OUT/mla-grid.err"
tail -n 30 "$OUT/mla-grid.md" | cut -c1-220
# fp8 at 16 heads (issue 41: 1.7x bf16's speed): the table's heads-in-N kernel, the warp-specialised
# kernel's e4m3 form in its place, and that form without its value conversion (a floor)
timeout ${FP8_S:-80} python3 benchmarks/tune_mla.py --filter "fp8 Hq16 128x8192" \
  --variants default,fp8ws,fp8ws_noconvert > "$OUT/mla-fp8-16.txt" 2>&1
tail -n 12 "$OUT/mla-fp8-16.txt" | cut -c1-200
xz -9 "$OUT/mla-grid.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
