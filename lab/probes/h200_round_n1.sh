#!/usr/bin/env bash
# fp8 decode tiles again, now that keys in M, the page offsets and the lanes changed the kernel (the
# fp8 table's 128-key tiles on sw36's and sw19's launches: 194 registers, no stack, sm_90a, Triton
# 3.6). Before these changes every override lost (records 2026-11-29 k-call6). Same run, kvattn only,
# graph replay, every decode fp8 row of the grid and the sweep: the table against 64-key tiles at 4
# stages. No carry, ~110 s.
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-fp8-n64 ${AB_S:-110} "decode fp8" --ab n64s4:decode:block_n=64,num_stages=4
echo "done: $(( $(date +%s) - t0 )) s"
