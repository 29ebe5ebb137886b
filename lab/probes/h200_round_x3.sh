#!/usr/bin/env bash
# The MLA grid plan's fitted chunk (lab/probes/grid_chunk_fitted.patch: common.balance.grid_chunk, its
# Gluon port in common.gluon_balance, the tests and probes of the rule; `git apply` it first, as on
# the tree session v call 10 ran; this script reverses it for the rows before): a
# ragged batch's units take the shortest of 16 whole-tile chunks whose units fit the grid, not the
# bound total / (grid - batch) that leaves up to `batch` of its units idle. Predicted from the
# launches (lab/probes/mla_launches.py): longest program sw66 69 -> 59 tiles, sw77 9 -> 8, sw70
# 19 -> 18, sw67 6 -> 5, sw68 7 -> 6, so those rows' split launches 5-14 % shorter; sw69 / sw74 /
# sw78 and the equal rows unchanged. The MLA and common GPU tests on the tree, the rows (kvattn
# only, graph replay), the patch reversed, the same rows. No carry (~225 s).
set -uo pipefail
source lab/probes/device_env.sh
ROWS="sw66 ,sw67 ,sw68 ,sw69 ,sw70 ,sw74 ,sw77 ,sw78 ,bf16 Hq64 64x4096,bf16 Hq16 32x16384"
gpu_tests pytest-mla ${TEST_S:-150} tests/ops/mla tests/ops/common
echo "tests: $(( $(date +%s) - t0 )) s"
mla_rows mla-fitted ${AB_S:-60} "$ROWS"
patch -R -p1 < lab/probes/grid_chunk_fitted.patch || exit 1
mla_rows mla-bound ${AB_S:-60} "$ROWS"
echo "done: $(( $(date +%s) - t0 )) s"
