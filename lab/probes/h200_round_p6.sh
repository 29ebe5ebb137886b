#!/usr/bin/env bash
# The bare reads of probe p1 / p2 read 16 x 4096 p64 2 us faster at three programs an SM than at
# the kernel's two (its 4 stages: 104 KB of shared memory): the main tiles at 3 stages (70 KB,
# three an SM at the balanced kernel's 168 registers) as an arm (`s3`) on the decode grid's bf16 rows
# and the sweep's bf16 rows still behind FlashInfer, kvattn only, graph replay. No carry, ~150 s.
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-s3 150 "decode bf16 16x4096,decode bf16 128x2048,decode bf16 256x1024,decode bf16 64x8192 p64,sw03 ,sw06 ,sw07 ,sw10 ,sw12 ,sw16 ,sw33 ,sw43 ,sw54 ,sw57 ,sw59 " --ab s3:decode:num_stages=3
echo "done: $(( $(date +%s) - t0 )) s"
