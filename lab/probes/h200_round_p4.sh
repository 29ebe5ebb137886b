#!/usr/bin/env bash
# The whole GPU suite (Triton 3.6) on the tree whose fp8 launches of <= 8 rows a KV head run 8 rows
# a program in either form and whose short-request tiles keep fp8's rows in M. No carry, one call.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest ${SUITE_S:-520} tests
echo "done: $(( $(date +%s) - t0 )) s"
