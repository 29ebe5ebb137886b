#!/usr/bin/env bash
# The GQA rows nearest FlashInfer at three programs an SM. The grid's 16 x 4096 p64 (1.046 of
# FlashInfer, session s) reads its bytes bare in 78.8 us at two programs an SM and 76.4 at three
# (lab/notes/decode.md "Decode: the pages read bare"), but its balanced launch's 4 stages (104 KB) hold two;
# 3 stages (70 KB) hold three. The same arm slowed 10 x 49133 494 -> 513 (its splits long), so the
# question is whether short spans gain: arm `s3` (num_stages=3) on the grid's 16 x 4096 and
# 128 x 2048 rows, sw10, sw16, sw03, sw05 (the other GQA rows at 1.02-1.05). kvattn only, graph
# replay. No carry (~100 s).
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-gqa-s3 ${AB_S:-100} "bf16 16x4096,bf16 128x2048,sw10 ,sw16 ,sw03 ,sw05 " --ab s3:decode:num_stages=3
echo "done: $(( $(date +%s) - t0 )) s"
