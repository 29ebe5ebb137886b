#!/usr/bin/env bash
# Second of two back-to-back calls (the first, carry [".t371/a"]:
#   mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/
# this one carry [".t371/b"]): Triton 3.7.1 joined, checked and unpacked, then on the tree of the
# one-tile splits (configs.tile_splits) the decode GPU tests and the 8 sweep rows whose launch the
# rule changes, with 3 it keeps (sw22, sw02, sw01), kvattn only (~170 s).
set -uo pipefail
source lab/probes/device_env.sh
triton_371 || exit 1
gpu_tests pytest-t371-decode ${DEC_S:-120} tests/ops/decode
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows t371-rows ${ROWS_S:-60} "sw08 ,sw21 ,sw26 ,sw31 ,sw42 ,sw44 ,sw53 ,sw61 ,sw22 ,sw02 ,sw01 "
echo "done: $(( $(date +%s) - t0 )) s"
