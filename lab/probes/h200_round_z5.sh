#!/usr/bin/env bash
# The second of two back-to-back calls (device_env.sh triton_371; the first is h200_round_z4.sh),
# carry [".t371/b"]: under Triton 3.7.1, the decode GPU tests (page runs included) and the device
# clamps. ~150 s.
set -uo pipefail
source lab/probes/device_env.sh
triton_371 || exit 1
gpu_tests pytest-decode-371 ${TEST_S:-200} tests/ops/decode tests/ops/test_device_clamps.py
echo "done: $(( $(date +%s) - t0 )) s"
