#!/usr/bin/env bash
# p1's fp8 256 x 1024 p16 ran its merge-less floor at 162.7 us against the kernel's 170.3 with
# nothing to merge (one split): every decode floor is the rows-in-M kernel at the plan's BLOCK_M,
# 8 on a keys-in-M launch. This call times that form as an arm (floor_rowsin: nothing taken out)
# beside the kernel (keys in M) and the config's rows in M at 16 rows (rows16), on the grid's and
# the sweep's fp8 rows; then sw12's pages read bare (p1's output lost it); then the MLA grid's
# 64 x 4096 at 16-64 heads on the other MLA kernels. No carry, ~200 s. (After it the plan runs every
# such launch at 8 rows, so keys_in_m=False is floor_rowsin's form; tune_decode's arm is "rows" and
# decode_floors has no rowsin: run this script on the commit that added it.)
set -uo pipefail
source lab/probes/device_env.sh
timeout 80 python3 benchmarks/tune_decode.py --filter "fp8 256x1024" --filter "fp8 64x8192" \
  --variants default,rows16,floor_rowsin,floor_nomerge --out "$OUT/fp8-grid.json" > "$OUT/tune.txt" 2>&1
tail -n 4 "$OUT/tune.txt" | cut -c1-200
echo "fp8 grid: $(( $(date +%s) - t0 )) s"
timeout 110 python3 benchmarks/tune_decode.py --sweep --filter "sw49 ,sw45 ,sw53 ,sw48 ,sw60 ,sw36 ,sw13 ,sw63 " \
  --variants default,rows16,floor_rowsin --out "$OUT/fp8-sweep.json" >> "$OUT/tune.txt" 2>&1
tail -n 10 "$OUT/tune.txt" | cut -c1-200
echo "fp8 sweep: $(( $(date +%s) - t0 )) s"
timeout 60 python3 lab/probes/paged_read_floor.py --filter "sw12 " --json "$OUT/paged-read.json" 2>&1 | grep -v Warn | tail -n 20
echo "read floor: $(( $(date +%s) - t0 )) s"
timeout 80 python3 benchmarks/tune_mla.py --filter "bf16 Hq16 64x4096" --filter "bf16 Hq64 64x4096" \
  --variants default,gluon,triton,hn16s2,hnsp16s2 > "$OUT/mla.txt" 2>&1
grep -v "^ *$" "$OUT/mla.txt" | tail -n 12 | cut -c1-200
xz -9 "$OUT/tune.txt" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
