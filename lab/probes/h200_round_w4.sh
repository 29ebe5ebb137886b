#!/usr/bin/env bash
# The tree with the MLA query staged by cp.async (the stores' staging reverted): every GPU test whose
# name holds "mla", then the MLA grid and the sweep's MLA rows beside FlashInfer's fa3 MLA
# (carry [".peers"], ~380 s).
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-mla ${TEST_S:-140} tests -k mla
echo "tests: $(( $(date +%s) - t0 )) s"
peer_rows mla-peers ${PEER_S:-190} mla,sweep --filter mla
echo "done: $(( $(date +%s) - t0 )) s"
