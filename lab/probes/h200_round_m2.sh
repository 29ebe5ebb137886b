#!/usr/bin/env bash
# The whole GPU suite under Triton 3.6 on main with keys in M and the page offsets merged, then
# probe l1's timelines of sw07 / sw12 / sw54 / sw57 (the first GPU run of benchmarks/timeline.py).
# One call, no carry.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest ${TESTS_S:-380} tests
echo "tests: $(( $(date +%s) - t0 )) s"
bash lab/probes/h200_round_l1.sh
echo "done: $(( $(date +%s) - t0 )) s"
