#!/usr/bin/env bash
# RoPE single decode on the H200: is the one-row RoPE loop instruction-bound or latency-bound?
# (lab/notes/single-decode.md "Single decode: where the RoPE key loop's instructions go", compile-only:
# 502 SASS instructions a 32-key tile against 280 for the same launch without RoPE; issue floor
# ~65 us at 32768 against 176 us measured.) Same run, kvattn only, graph replay, the three RoPE
# rows under: 64-key tiles (+13 % instructions a key: slower if instruction-bound), and 3 / 4
# programs an SM instead of 2 (more warps to hide latency: faster if latency-bound).
set -uo pipefail
source lab/probes/device_env.sh
timeout ${AB_S:-90} python3 benchmarks/run.py --suite single_decode --filter ROPE \
  --graph-only --warmup 10 --rep 30 --no-peers \
  --ab n64:decode:block_n=64 --ab k3:decode:max_per_sm=3 --ab k4:decode:max_per_sm=4 \
  --out "$OUT/ab-rope.json" --md "$OUT/ab-rope.md" --time-budget $(( ${AB_S:-90} - 10 )) 2> "$OUT/ab-rope.err"
grep "^| " "$OUT/ab-rope.md" | grep -v "^| class\|^|---" | cut -c1-260
xz -9 "$OUT/ab-rope.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
