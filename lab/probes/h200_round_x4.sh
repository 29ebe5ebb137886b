#!/usr/bin/env bash
# The MLA grid plan's fitted chunk, gated (lab/probes/grid_chunk_fitted_gated.patch: grid_chunk_fitted.patch
# whose 16 tries run only where the shortest length tried is below the bound, a scalar branch, so a
# batch whose floors decide the chunk (sw69, sw74, sw75, sw78) pays nothing; `git apply` it first:
# this script reverses it for the rows before). Session v call 10 measured the ungated form: sw66
# 160 -> 151 us, sw67 / sw68 -1 us, but sw74 +3.0, sw69 +1.7, sw78 +1.2 where the chunk does not
# change (lab/notes/mla-ragged.md "The grid plan's chunk, fitted"). Predicted: sw66 / sw67 / sw68
# as there, sw69 / sw74 / sw75 / sw78 level, sw70 / sw77 within 1 %. The MLA and common GPU tests
# on the tree, the rows (kvattn only, graph replay), the patch reversed, the same rows. No carry
# (~225 s).
set -uo pipefail
source lab/probes/device_env.sh
ROWS="sw66 ,sw67 ,sw68 ,sw69 ,sw70 ,sw74 ,sw75 ,sw77 ,sw78 ,bf16 Hq64 64x4096,bf16 Hq16 32x16384"
gpu_tests pytest-mla ${TEST_S:-150} tests/ops/mla tests/ops/common
echo "tests: $(( $(date +%s) - t0 )) s"
mla_rows mla-fitted ${AB_S:-60} "$ROWS"
patch -R -p1 < lab/probes/grid_chunk_fitted_gated.patch || exit 1
mla_rows mla-bound ${AB_S:-60} "$ROWS"
echo "done: $(( $(date +%s) - t0 )) s"
