#!/usr/bin/env bash
# Floors and arms of the rows still behind FlashInfer (no carry, one call, ~250 s):
# 1. the pages of sw12, sw07 and the grid's 16 x 4096 p64 read bare at 1-4 programs an SM
#    (paged_read_floor.py, probe o5);
# 2. the grid's fp8 256 x 1024 p16 (the short fp8 tiles, 1.108 of XQA): other tiles, and the kernel
#    without its K/V loads (tune_decode.py);
# 3. the sweep's small rows sw53 / sw31 / sw43 / sw59 at split caps 1-4 and with the combine launch;
# 4. the MLA grid's 64 x 4096 at 16 / 32 / 64 heads: the seesaw without its copies, its P.V, its
#    score products (tune_mla.py's ws_* floors).
set -uo pipefail
source lab/probes/device_env.sh
timeout 100 python3 lab/probes/paged_read_floor.py --filter "sw12 " --filter "sw07 " --filter "bf16 16x4096 p64 NHD" \
  --json "$OUT/paged-read.json" 2>&1 | grep -v Warn | tail -n 40
echo "read floor: $(( $(date +%s) - t0 )) s"
timeout 90 python3 benchmarks/tune_decode.py --filter "fp8 256x1024" \
  --variants default,t128_4_3,t64_4_4,t64_4_2,t32_4_4,t64_8_4,t128_8_3,cap3,floor_noloads,floor_nomerge \
  --out "$OUT/fp8-short.json" > "$OUT/tune.txt" 2>&1
tail -n 14 "$OUT/tune.txt" | cut -c1-200
echo "fp8 short: $(( $(date +%s) - t0 )) s"
timeout 70 python3 benchmarks/tune_decode.py --sweep --filter "sw53 ,sw31 ,sw43 ,sw59 " \
  --variants default,split1,split2,split4,combine --out "$OUT/small.json" >> "$OUT/tune.txt" 2>&1
tail -n 22 "$OUT/tune.txt" | cut -c1-200
echo "small rows: $(( $(date +%s) - t0 )) s"
timeout 90 python3 benchmarks/tune_mla.py --filter "Hq16 64x4096" --filter "Hq32 64x4096" --filter "Hq64 64x4096" \
  --variants default,ws_nocopies,ws_nopv,ws_noscores > "$OUT/mla.txt" 2>&1
tail -n 16 "$OUT/mla.txt" | cut -c1-200
xz -9 "$OUT/tune.txt" "$OUT/mla.txt" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
