#!/usr/bin/env bash
# MLA split partials in bfloat16 for the warp-specialised launches with a bfloat16 output
# (lab/probes/mla_partials16.patch: store_rows stages them through the warpgroup's free buffer as
# the final rows, the plan views the partial buffer as bfloat16, the combines fold 16-bit partials
# split by split): every GPU test whose name holds "mla" on it, then arms new / old / new (the patch
# reversed on the device's copy) on the split and ragged MLA rows, kvattn only, graph replay.
# sm_90a: the 128 8-byte float32 partial stores a program go (the staged path's 32 16-byte stores
# serve both), registers and shared memory unchanged; the 16-bit combine folds (LDG.64, the plan's
# 8 STS / 11 BAR, no layout change through shared memory).
# Predicted (the phase probe: split programs end 1.6 / 3.5 us after their loop at 16 / 64 heads,
# 16.8 MB of float32 partials at 64 heads): 64 x 4096 at 64 / 32 / 16 heads -3 / -1.5 / -0.7 us,
# the ragged rows with combines (sw66, sw70, sw74, sw77) -1 to -3 us; one-split rows level.
# No carry (~300 s).
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-mla ${TEST_S:-170} tests -k mla
echo "tests: $(( $(date +%s) - t0 )) s"
ROWS="bf16 Hq16 64x4096,bf16 Hq32 64x4096,bf16 Hq64 64x4096,bf16 Hq128 32x16384,bf16 Hq64 32x16384,fp8 Hq128 32x16384,bf16 Hq16 128x8192,sw66 ,sw69 ,sw70 ,sw74 ,sw75 ,sw77 ,sw78 "
patch_arms mla lab/probes/mla_partials16.patch ${ARM_S:-90} "$ROWS" mla_rows || exit 1
rm -f "$OUT"/*.err.xz "$OUT"/mla-*.md
echo "done: $(( $(date +%s) - t0 )) s"
