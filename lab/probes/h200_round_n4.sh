#!/usr/bin/env bash
# Second of two back-to-back calls: the Triton 3.7.1 wheel cut under the carry limit
# (benchmarks/triton_wheel.sh slim, here) travels in two parts; the first call, carry [".t371/a"]:
#   mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/
# this one, carry [".t371/b"] (its sha256 beside it): the parts joined and checked, then the whole GPU
# suite under 3.7.1 (h200_round_g3.sh), stopped with its summary after TOTAL seconds.
set -uo pipefail
mkdir -p .t371slim
cat /tmp/slimparts/slimpart.aa .t371/b/slimpart.ab > .t371slim/triton-3.7.1-slim.tar.xz
echo "$(cat .t371/b/sha)  .t371slim/triton-3.7.1-slim.tar.xz" | sha256sum -c - || exit 1
TOTAL=${TOTAL:-300} bash lab/probes/h200_round_g3.sh
