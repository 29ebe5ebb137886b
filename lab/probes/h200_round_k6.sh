#!/usr/bin/env bash
# fp8 decode tiles on the H200: the fp8 main table (128 keys, 4 warps, 3 stages) was measured on an
# H100; the bf16 long tiles lost to more tiles in flight on the H200 (k1). Same run, kvattn only,
# graph replay, every decode fp8 row of the grid and the sweep under four arms: 4 stages (the bf16
# main table's bytes in flight), 8 warps, 64-key tiles at 4 stages, 256-key tiles at 8 warps.
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-fp8 ${AB_S:-230} "decode fp8" --ab s4:decode:num_stages=4 --ab w8:decode:num_warps=8 \
  --ab n64s4:decode:block_n=64,num_stages=4 --ab n256w8:decode:block_n=256,num_warps=8,num_stages=3
echo "done: $(( $(date +%s) - t0 )) s"
