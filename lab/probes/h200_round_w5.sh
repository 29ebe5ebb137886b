#!/usr/bin/env bash
# The MLA warp-specialised kernel's final rows through a free buffer of each warpgroup
# (lab/probes/mla_final_rows_staged.patch, applied on the device's copy first): every GPU test whose
# name holds "mla" on the patch, then lab/probes/mla_query_staging.py with the library (staged final
# rows) against ws_syncstore (the stores before) and the no-store floor (on the split rows too:
# what their partials' stores cost), interleaved per shape.
# Predicted: one-split launches (the one-wave batches, 128 x 8192 at 16 / 64 / 128 heads, sw64,
# sw65, sw72, sw73) faster by up to the floor's 9 us a program at 64 / 128 heads; split launches
# unchanged (their partials keep the accumulator's stores). No carry (~380 s).
set -uo pipefail
source lab/probes/device_env.sh
patch -p1 < lab/probes/mla_final_rows_staged.patch > /dev/null || exit 1
gpu_tests pytest-mla ${TEST_S:-140} tests -k mla
echo "tests: $(( $(date +%s) - t0 )) s"
timeout ${AB_S:-230} python3 lab/probes/mla_query_staging.py --rep 40 --cost default,ws_syncstore,ws_nostore \
  --rows default,ws_syncstore,ws_nostore 2> "$OUT/final-rows.err" | tee "$OUT/final-rows.txt"
xz -9 "$OUT/final-rows.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
