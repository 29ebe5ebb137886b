#!/usr/bin/env bash
# The lanes merged by the combine launch (lab/probes/lanes_combine.patch, applied here to the
# device's copy: config balance_combine_units, the split kernel's MERGE_UNITS, the combine kernel
# common.combine.lanes_combine_kernel; lab/notes/decode-ragged-batches.md "Next for sw12: the lanes
# merged by the combine launch"). sm_90a PTX of every existing configuration unchanged by the
# patch (ptx_snapshot: 64 of 64 identical). First its GPU tests (the lanes tests of test_decode.py,
# the new one included), then the lanes rows, kvattn only, graph replay: `cap64` (the in-kernel
# merge with the lanes cap 64, session o's arm), `lc1` (every request of 2+ units merged by the
# combine launch, cap 64), `lc8` (requests of 9+ units by the combine launch, cap 64), `lc8t`
# (the same at the table's cap). Predicted: sw12 58.5 -> ~53 us under lc1 / lc8; the other rows
# pay the second launch (~1-2 us) under lc1, less under lc8. Then the MHA rows at 3 stages (below).
# No carry (~320 s).
set -uo pipefail
patch -p1 --forward < lab/probes/lanes_combine.patch || exit 1
source lab/probes/device_env.sh
gpu_tests pytest-lanes ${TEST_S:-90} tests/ops/decode/test_decode.py -k "lanes or balanced"
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-lanes-combine ${AB_S:-150} \
  "sw12 ,sw07 ,sw54 ,sw59 ,sw14 ,sw09 ,sw30 ,sw23 ,ragged64x[1,12000] p16,ragged128x[1,8192] p64 NHD" \
  --ab cap64:decode:balance_lanes_cap=64 \
  --ab lc1:decode:balance_combine_units=1,balance_lanes_cap=64 \
  --ab lc8:decode:balance_combine_units=8,balance_lanes_cap=64 \
  --ab lc8t:decode:balance_combine_units=8
echo "done: $(( $(date +%s) - t0 )) s"
# The MHA rows (32 / 32 heads: 32 programs a lane, 8 lanes at two programs an SM) at three stages
# (three programs an SM, 12 lanes): session p's s3 arm took sw59 45.3 -> 43.3 us (FlashInfer 43.0);
# sw14, sw20, sw46 were not timed. Patch still applied (MERGE_UNITS 0: the package's kernels).
kv_rows ab-mha-s3 ${MHA_S:-60} "sw59 ,sw14 ,sw20 ,sw46 " --ab s3:decode:num_stages=3
echo "mha: $(( $(date +%s) - t0 )) s"
