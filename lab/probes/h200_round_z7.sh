#!/usr/bin/env bash
# Three programs an SM again, now on the page runs' lighter loop: arm `s3` (num_stages=3: 70 KB of
# shared memory, three 4-warp programs an SM, as FlashInfer's fa2 decode runs) against the table's
# (64, 4, 4) (two an SM), on the rows session u measured it on (none faster then: the loop was
# instruction-bound) plus the p64 grid rows. Nsight Compute read the runs' loop at 90.7 % of DRAM
# peak against FlashInfer's 93.0 % (z call 1). No carry, ~130 s.
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-s3 ${AB_S:-120} "bf16 16x4096 p16 NHD,bf16 16x4096 p64 NHD,bf16 64x8192 p64 HND,bf16 128x2048 p64 HND,bf16 128x2048 p16 NHD,bf16 256x1024 p64 NHD,sw03 ,sw05 ,sw10 ,sw16 ,sw06 ,sw41 " --ab s3:decode:num_stages=3
echo "done: $(( $(date +%s) - t0 )) s"
