#!/usr/bin/env bash
# The staged final rows (landed) with the plan's query-alignment rule (plan.tma_aligned: a query
# view the cp.async staging cannot take keeps the Triton kernel): every MLA-named GPU test and the
# two-worker fuzz job that found the odd-stride query, then the MLA grid and the sweep's MLA rows
# beside FlashInfer's fa3 MLA. Carry [".peers"] (~540 s).
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-mla ${TEST_S:-290} tests -k "mla or two_workers_on_the_gpu"
echo "tests: $(( $(date +%s) - t0 )) s"
peer_rows mla-peers ${PEER_S:-240} mla,sweep --filter mla
echo "done: $(( $(date +%s) - t0 )) s"
