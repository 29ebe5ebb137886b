#!/usr/bin/env bash
# fp8 decode tiles again, now that keys in M and the page offsets changed the kernel: the fp8 table's
# 128-key tiles compile (sm_90a, Triton 3.6) to 253 registers unbalanced and 255 with a 56-byte stack
# balanced on sw36's launch; 64-key tiles at 4 stages to 227 / 247 and no stack. Before these changes
# every override lost (records 2026-11-29 k-call6). Same run, kvattn only, graph replay, every decode
# fp8 row of the grid and the sweep: the table against 64-key tiles at 4 stages. No carry, ~110 s.
set -uo pipefail
source lab/probes/device_env.sh
export PYTHONPATH=src:${PYTHONPATH:-}
t0=$(date +%s)
timeout ${AB_S:-110} python3 benchmarks/run.py --suite decode,sweep --filter "decode fp8" \
  --graph-only --warmup 10 --rep 30 --no-peers --ab n64s4:decode:block_n=64,num_stages=4 \
  --out "$OUT/ab-fp8-n64.json" --md "$OUT/ab-fp8-n64.md" --time-budget $(( ${AB_S:-110} - 12 )) \
  2> "$OUT/ab-fp8-n64.err"
grep "^| " "$OUT/ab-fp8-n64.md" | grep -v "^| class\|^|---" | cut -c1-220
xz -9 "$OUT/ab-fp8-n64.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
