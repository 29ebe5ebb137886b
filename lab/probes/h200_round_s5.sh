#!/usr/bin/env bash
# The second of two back-to-back calls (device_env.sh triton_371; the first, carry [".t371/a"]:
# mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/), this one carry [".t371/b"]:
# the decode GPU tests under Triton 3.7.1 on the tree whose paged MHA launches that split run 3
# stages (configs._SM90_ONE_ROW_STAGES), then probe l4 (RoPE single decode at 64-key tiles and 3-4
# programs an SM) under 3.7.1. Outputs packed into one tar (~250 s).
set -uo pipefail
FINAL=${OUT:-out}
mkdir -p "$FINAL"
export OUT=/tmp/s5out
source lab/probes/device_env.sh
triton_371 || exit 1
gpu_tests pytest-decode-371 ${TEST_S:-150} tests/ops/decode
echo "tests: $(( $(date +%s) - t0 )) s"
bash lab/probes/h200_round_l4.sh
tar cf "$FINAL/s5.tar" -C "$OUT" .
