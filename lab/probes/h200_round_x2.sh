#!/usr/bin/env bash
# The balanced MLA combine by column blocks on launches of few programs (the working tree:
# plan._FEW_PROGRAMS_COLS; lab/probes/combine_by_columns.patch is that change, reversed here for the
# rows before): a request's units, up to the unit cap, merged in one round of [BLOCK_S, 128] loads by
# four programs a (request, head) instead of two or three rounds of [16, 512] by one. Predicted:
# sw70 / sw74 / sw77 1-2 us faster (their long requests' 2-3 dependent rounds become one), the
# controls (sw66, 64 x 4096 at 16-64 heads: whole rows) level. The combine's and the balanced
# split's GPU tests on the tree, the rows (kvattn only, graph replay), the patch reversed, the
# same rows. No carry (~200 s).
set -uo pipefail
source lab/probes/device_env.sh
ROWS="sw66 ,sw67 ,sw68 ,sw69 ,sw70 ,sw74 ,sw75 ,sw77 ,sw78 ,bf16 Hq16 32x16384,fp8 Hq16 32x16384,bf16 Hq64 64x4096,bf16 Hq32 64x4096,bf16 Hq16 64x4096"
gpu_tests pytest-combine ${TEST_S:-100} tests/ops/mla/test_balanced.py tests/ops/mla/test_combine_launch.py \
  tests/ops/mla/test_mtp.py tests/ops/common
echo "tests: $(( $(date +%s) - t0 )) s"
mla_rows mla-cols ${AB_S:-80} "$ROWS"
patch -R -p1 < lab/probes/combine_by_columns.patch || exit 1
mla_rows mla-rows ${AB_S:-80} "$ROWS"
echo "done: $(( $(date +%s) - t0 )) s"
