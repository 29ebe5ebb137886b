#!/usr/bin/env bash
# Second of two back-to-back calls (as h200_round_n4.sh: the first, carry [".t371/a"], is
#   mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/
# this one carry [".t371/b"]): the Triton 3.7.1 wheel joined, checked and unpacked, then only the GPU
# tests the 3.7.1 run on record (n-call4-junit.xml.xz, stopped by its time limit) never reached, and the
# ones added since (lab/probes/junit_remainder.py: this tree's ids less n-call4's JUnit cases; ~350 ids).
set -uo pipefail
source lab/probes/device_env.sh
triton_371 || exit 1
python3 lab/probes/junit_remainder.py lab/results/h200/2026-11-30/n-call4-junit.xml.xz --out "$OUT/ids.txt"
gpu_tests pytest-t371-rest ${REST_S:-400} @"$OUT/ids.txt"
echo "done: $(( $(date +%s) - t0 )) s"
