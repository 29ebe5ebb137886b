#!/usr/bin/env bash
# Two rows left behind FlashInfer on an H200 after session u's single-decode rules:
# 1. RoPE single decode 131072 (555-590 us against FlashInfer's 544-547: 1.02-1.08): the NONE rows'
#    one-row tiles gained 4-5 % from one copy in flight (2 stages) on the H200; RoPE runs 64-key
#    tiles at 3 stages. Arms `st2` (2 stages), `st4` (4) on the three RoPE rows.
# 2. fp8 256 x 1024 p16 (162 us against XQA's 153-154, 1.056): the short-request table (64, 4, 3),
#    four programs an SM, chosen on an H100 (lab/notes/decode.md). Arms `st4` (4 stages), `n128`
#    (128-key tiles), `w8` (8 warps) on it, its bf16 forms and the ragged fp8 64 x [1, 12000] p16
#    (1.023; the short table does not take it, so it is the control that must not move).
# kvattn only, graph replay. No carry (~120 s).
set -uo pipefail
source lab/probes/device_env.sh
timeout ${ROPE_S:-50} python3 benchmarks/run.py --suite single_decode --filter ROPE \
  --graph-only --warmup 10 --rep 30 --no-peers \
  --ab st2:decode:num_stages=2 --ab st4:decode:num_stages=4 \
  --out "$OUT/ab-rope-stages.json" --md "$OUT/ab-rope-stages.md" --time-budget $(( ${ROPE_S:-50} - 10 )) 2> "$OUT/ab-rope-stages.err"
grep "^| " "$OUT/ab-rope-stages.md" | grep -v "^| class\|^|---" | cut -c1-260
xz -9 "$OUT/ab-rope-stages.err" 2>/dev/null
kv_rows ab-short ${AB_S:-80} "256x1024 p16 NHD,fp8 ragged64x[1,12000]" \
  --ab st4:decode:num_stages=4 --ab n128:decode:block_n=128 --ab w8:decode:num_warps=8
echo "done: $(( $(date +%s) - t0 )) s"
