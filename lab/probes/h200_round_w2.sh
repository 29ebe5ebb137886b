#!/usr/bin/env bash
# The MLA query staged by one cp.async group (kernels_gluon.stage_query): the MLA GPU tests, then
# lab/probes/mla_query_staging.py (the library against the staging before, ws_syncquery, and the
# no-store floor). No carry (~330 s). ws_syncquery, the staging before, was removed once this
# measured it: to run this again, check out 9ad49b8.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-mla ${TEST_S:-150} tests/ops/mla
echo "tests: $(( $(date +%s) - t0 )) s"
timeout ${AB_S:-300} python3 lab/probes/mla_query_staging.py 2> "$OUT/staging.err" | tee "$OUT/staging.txt"
xz -9 "$OUT/staging.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
