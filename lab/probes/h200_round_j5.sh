#!/usr/bin/env bash
# The 40 bf16 D128 decode rows of the sweep and grid whose launches take the long (128 keys, 8 warps,
# 3 stages) or streaming (128, 8, 1) tiles, kvattn only, CUDA-graph replay, one call: `w4` those
# tiles as 64-key 4-warp ones (same stages), `m` as the main table's (64, 4, 4). j4 found w4 faster
# on seven of the nine worst rows (sw51 229 -> 175 us, sw52 60.3 -> 37.9) and slower on sw12.
set -uo pipefail
source lab/probes/device_env.sh
timeout ${AB_S:-200} python3 benchmarks/run.py --suite decode,sweep \
  --filter "sw01 ,sw03 ,sw05 ,sw06 ,sw07 ,sw08 ,sw10 ,sw12 ,sw16 ,sw26 ,sw27 ,sw28 ,sw33 ,sw34 ,sw35 ,sw38 ,sw40 ,sw43 ,sw46 ,sw51 ,sw52 ,sw54 ,sw55 ,sw57 ,sw59 ,bf16 1x32768 p16,bf16 16x4096 p16,bf16 1x32768 p64,bf16 16x4096 p64,bf16 64x8192 p64,bf16 128x2048 p64,bf16 ragged128x[1,8192] p64,bf16 64x8192 p16 NHD h8/1" \
  --graph-only --warmup 10 --rep 30 --no-peers \
  --ab w4:decode:block_n=64,num_warps=4 --ab m:decode:block_n=64,num_warps=4,num_stages=4 \
  --out "$OUT/ab-tiles.json" --md "$OUT/ab-tiles.md" --time-budget $(( ${AB_S:-200} - 15 )) 2> "$OUT/ab-tiles.err"
grep "^| " "$OUT/ab-tiles.md" | grep -v "^| class\|^|---" | cut -c1-230
xz -9 "$OUT/ab-tiles.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
