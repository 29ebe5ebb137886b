#!/usr/bin/env bash
# Single decode without RoPE past the streaming spans on an H200 (one query row a head, contiguous
# cache: the one-row table (64, 4, 1), 16 splits a head, 4 programs an SM, chosen on an H100:
# lab/notes/single-decode.md "Single decode: balancing the programs of 32768"). On the H200 it runs
# 142.8 / 518.5 us at 32768 / 131072 against cuDNN's 137.6 / 493.2 and FlashInfer's 138.2 / 495.1
# (2026-11-29, k-call7). The RoPE rows there were latency-bound at 32-key tiles (64 keys -14 / -17 %,
# "Single decode: RoPE's 64-key tiles on an H200"); whether the one-row tiles are too: arms
# `n128` (128-key tiles), `n32`, `w8` (8 warps), `st2` (2 stages: pipelined, the hint gone), kvattn
# only, graph replay; 4096 (the streaming tiles) as a control the arms also change. No carry (~80 s).
set -uo pipefail
source lab/probes/device_env.sh
timeout ${AB_S:-90} python3 benchmarks/run.py --suite single_decode --filter NONE \
  --graph-only --warmup 10 --rep 30 --no-peers \
  --ab n128:decode:block_n=128 --ab n32:decode:block_n=32 --ab w8:decode:num_warps=8 --ab st2:decode:num_stages=2 \
  --out "$OUT/ab-none.json" --md "$OUT/ab-none.md" --time-budget $(( ${AB_S:-90} - 10 )) 2> "$OUT/ab-none.err"
grep "^| " "$OUT/ab-none.md" | grep -v "^| class\|^|---" | cut -c1-260
xz -9 "$OUT/ab-none.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
