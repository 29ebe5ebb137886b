#!/usr/bin/env bash
# The closing floors of issues 40 and 41 on the final tree, and the MLA and single-decode grids
# beside FlashInfer (MLA: fa3 MLA; single decode: FlashInfer's single decode and cuDNN / flash
# SDPA). Carry [".peers"]. One call, ~200 s on a fresh machine (FlashInfer compiles its kernels first).
#   1. the MLA grid (22 rows) beside FlashInfer's fa3 MLA
#   2. MLA at 16 heads, 128 x 8192: bf16 and fp8 under the seesaw's floors (no copies, no P.V,
#      no score products, no value conversion): what stops fp8 short of 1.7x bf16
#   3. decode floors on the current split kernel (no K/V loads, no merge) on the fp8 grid rows,
#      fp8 sw36, and sw12 (the sweep's worst decode row)
#   4. the single-decode grid beside FlashInfer and SDPA (cuDNN, flash)
set -uo pipefail
source lab/probes/device_env.sh
( source .peers/flashinfer/activate.sh
  export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
  timeout ${MLA_S:-190} python3 benchmarks/run.py --suite mla --graph-only --fi-prebuild --no-flex --sdpa-backends "" \
    --out "$OUT/mla-grid.json" --md "$OUT/mla-grid.md" --time-budget $(( ${MLA_S:-190} - 30 )) 2> "$OUT/mla-grid.err"
  xz -9 "$OUT/mla-grid.err" 2>/dev/null )
tail -n 28 "$OUT/mla-grid.md" | cut -c1-200
echo "mla grid: $(( $(date +%s) - t0 )) s"
timeout ${MLAF_S:-70} python3 benchmarks/tune_mla.py --filter "Hq16 128x8192" \
  --variants default,ws_nocopies,ws_nopv,ws_noscores,ws_noconvert > "$OUT/mla-floors.txt" 2>&1
tail -n 14 "$OUT/mla-floors.txt" | cut -c1-200
echo "mla floors: $(( $(date +%s) - t0 )) s"
timeout ${DF_S:-60} python3 benchmarks/tune_decode.py --filter "fp8 64x8192 p16,fp8 256x1024 p16,bf16 64x8192 p16 NHD" \
  --variants default,floor_noloads,floor_nomerge > "$OUT/decode-floors.txt" 2>&1
timeout ${DFS_S:-50} python3 benchmarks/tune_decode.py --sweep --filter "sw12 ,sw36 " \
  --variants default,floor_noloads,floor_nomerge >> "$OUT/decode-floors.txt" 2>&1
grep -v "^\s*$" "$OUT/decode-floors.txt" | tail -n 24 | cut -c1-200
echo "decode floors: $(( $(date +%s) - t0 )) s"
( source .peers/flashinfer/activate.sh
  export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
  timeout ${SD_S:-70} python3 benchmarks/run.py --suite single_decode --graph-only --fi-prebuild --no-flex --sdpa-backends "cudnn,flash" \
    --out "$OUT/single-grid.json" --md "$OUT/single-grid.md" --time-budget $(( ${SD_S:-70} - 20 )) 2> "$OUT/single-grid.err"
  xz -9 "$OUT/single-grid.err" 2>/dev/null )
grep "^| " "$OUT/single-grid.md" | grep -v "^|---" | tail -n 8 | cut -c1-220
echo "done: $(( $(date +%s) - t0 )) s"
