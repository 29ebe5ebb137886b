#!/usr/bin/env bash
# The whole GPU suite (Triton 3.6) on the tree whose MLA warp-specialised kernel stages its query by
# cp.async and writes its rows through shared memory; then the stores' A/B
# (lab/probes/mla_query_staging.py: default against ws_syncstore, and the no-store floor on the
# one-wave batches). No carry (~520 s).
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest ${SUITE_S:-400} tests
echo "suite: $(( $(date +%s) - t0 )) s"
timeout ${AB_S:-170} python3 lab/probes/mla_query_staging.py --rep 40 --cost default,ws_syncstore,ws_nostore \
  --rows default,ws_syncstore 2> "$OUT/stores.err" | tee "$OUT/stores.txt"
xz -9 "$OUT/stores.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
