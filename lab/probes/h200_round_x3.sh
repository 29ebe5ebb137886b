#!/usr/bin/env bash
# The MLA grid plan's fitted chunk: PATCH (default lab/probes/grid_chunk_fitted.patch, what session v
# call 10 ran; lab/probes/grid_chunk_fitted_gated.patch its form with the tries behind `lo < hi`),
# `git apply`-ed on the tree first, timed against itself reversed. common.balance.grid_chunk (and its
# Gluon port in common.gluon_balance): a ragged batch's units take the shortest of 16 whole-tile
# chunks whose units fit the grid, not the bound total / (grid - batch) that leaves up to `batch`
# of its units idle. Predicted from the launches (lab/probes/mla_launches.py): longest program sw66
# 69 -> 59 tiles, sw77 9 -> 8, sw70 19 -> 18, sw67 6 -> 5, sw68 7 -> 6; sw69 / sw74 / sw75 / sw78
# and the equal rows unchanged (the gated form: those without the tries' cost). The MLA and common
# GPU tests on the tree, the rows (kvattn only, graph replay), the patch reversed, the same rows.
# No carry (~225 s; call 10 ran these rows without sw75).
set -uo pipefail
PATCH=${PATCH:-lab/probes/grid_chunk_fitted.patch}
source lab/probes/device_env.sh
ROWS="sw66 ,sw67 ,sw68 ,sw69 ,sw70 ,sw74 ,sw75 ,sw77 ,sw78 ,bf16 Hq64 64x4096,bf16 Hq16 32x16384"
gpu_tests pytest-mla ${TEST_S:-150} tests/ops/mla tests/ops/common
echo "tests: $(( $(date +%s) - t0 )) s"
mla_rows mla-fitted ${AB_S:-60} "$ROWS"
patch -R -p1 < "$PATCH" || exit 1
mla_rows mla-bound ${AB_S:-60} "$ROWS"
echo "done: $(( $(date +%s) - t0 )) s"
