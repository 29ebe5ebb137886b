#!/usr/bin/env bash
# The balanced MLA combine's plan cut short for an equal batch (lab/probes/combine_equal_plan.patch:
# common.balance.request_units stops after the sum and the max that say the batch is equal, whose
# plan is the uniform split, and a ragged batch sums the units before its request instead of
# scanning them; sm_90a PTX of the other 63 production configurations unchanged; predicted 0.5-2 us
# on the equal 64 x 4096 rows at 16-64 heads, ragged rows level). Every program of
# the combine (1024-4096 at 16-64 heads) derives the plan, and the balanced combine ran 2-4 us
# slower than the uniform one on the same 2 splits (lab/notes/mla-ragged.md "The balanced
# combine's registers"): 64 x 4096 at 64 / 32 / 16 heads 106.8 / 101.6 / 99.0 us against 102.9 /
# 98.7 / 97.3 uniform. The rows on the tree as it is, then the patch, its GPU tests and the same
# rows (kvattn only, graph replay, one process each). No carry (~200 s).
set -uo pipefail
source lab/probes/device_env.sh
ROWS="bf16 Hq64 64x4096,bf16 Hq32 64x4096,bf16 Hq16 64x4096,fp8 Hq16 64x4096,sw65 ,sw66 ,sw70 ,sw74 ,sw77 "
mla_rows mla-before ${AB_S:-70} "$ROWS"
patch -p1 --forward < lab/probes/combine_equal_plan.patch || exit 1
gpu_tests pytest-combine ${TEST_S:-90} tests/ops/mla/test_balanced.py tests/ops/mla/test_combine_launch.py tests/ops/common
echo "tests: $(( $(date +%s) - t0 )) s"
mla_rows mla-after ${AB_S:-70} "$ROWS"
echo "done: $(( $(date +%s) - t0 )) s"
