#!/usr/bin/env bash
# Branch fp8-instr on the GPU for the first time: the decode family's GPU tests (keys in M and the
# page offsets are in every paged decode launch they make), then probe l2's A/B of both changes
# against the current kernel (fp8 rows, then bf16 rows). One call, no carry.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-decode ${TESTS_S:-170} tests/ops/decode tests/ops/common
echo "tests: $(( $(date +%s) - t0 )) s"
bash lab/probes/h200_round_l2.sh
echo "done: $(( $(date +%s) - t0 )) s"
