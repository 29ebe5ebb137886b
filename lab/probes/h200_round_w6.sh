#!/usr/bin/env bash
# The MLA grid plan's gated fitted chunk (lab/probes/grid_chunk_fitted_gated.patch) against the
# bound, arms in the order fitted, bound, bound, fitted. Sessions v and w ran the two arms once each,
# fitted first and right after the GPU tests, and in session w the fitted arm was 2-3 us slower even
# on the equal rows the gated patch does not plan differently (64 x 4096 at 64 heads 106 / 104, 32 x
# 16384 at 16 heads 170 / 167): an order effect (a GPU still hot from the tests) or the patch's
# cost; the mirrored order takes a linear drift out of the pair means. The MLA and common GPU tests
# on the patch first. No carry (~350 s).
set -uo pipefail
source lab/probes/device_env.sh
PATCH=lab/probes/grid_chunk_fitted_gated.patch
ROWS="sw66 ,sw67 ,sw68 ,sw69 ,sw70 ,sw74 ,sw75 ,sw77 ,sw78 ,bf16 Hq64 64x4096,bf16 Hq16 32x16384"
patch -p1 < "$PATCH" > /dev/null || exit 1
if [ "${TEST_S:-130}" != 0 ]; then  # (TEST_S=0: the arms only)
  gpu_tests pytest-mla ${TEST_S:-130} tests/ops/mla tests/ops/common
  echo "tests: $(( $(date +%s) - t0 )) s"
fi
mla_rows mla-fitted-1 ${AB_S:-55} "$ROWS"
patch -R -p1 < "$PATCH" > /dev/null || exit 1
mla_rows mla-bound-1 ${AB_S:-55} "$ROWS"
mla_rows mla-bound-2 ${AB_S:-55} "$ROWS"
patch -p1 < "$PATCH" > /dev/null || exit 1
mla_rows mla-fitted-2 ${AB_S:-55} "$ROWS"
echo "done: $(( $(date +%s) - t0 )) s"
