#!/usr/bin/env bash
# sw12's lanes combine launch with a uniform batch's combine started early: the lanes combine
# patch (applied in the tree), plus the split kernel of a batch found uniform triggering its
# dependents at the start (gdc_launch_dependents) and the combine's programs waiting only where
# they merge (and program (0, 0), so the launch still ends after the split). aa4 measured the
# combine launch's empty programs after the split at +2.2 us on the equal 64 x 8192 p16 8/1 row
# (83.8 -> 86.0) while sw12 gained 55.3 -> 53.6. Predicted: sw12 as aa4 (53-54), the equal row
# within ~0.5 us of the table. Lanes GPU tests, then table / lc1 twice. No carry, ~150 s.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-lanes ${TEST_S:-90} tests/ops/decode/test_decode.py tests/ops/common -k "lanes or balanced or combine"
ROWS="sw12 ,64x8192 p16 NHD h8/1,sw07 ,sw01 ,ragged64x[1,12000] p16,sw54 ,sw30 "
kv_rows ab-lanes-early-1 ${AB_S:-50} "$ROWS" --ab lc1:decode:balance_combine_units=1,balance_lanes_cap=64
kv_rows ab-lanes-early-2 ${AB_S:-50} "$ROWS" --ab lc1:decode:balance_combine_units=1,balance_lanes_cap=64
echo "done: $(( $(date +%s) - t0 )) s"
