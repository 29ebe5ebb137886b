#!/usr/bin/env bash
# The softmax denominator kept per logit and summed once after the loop
# (lab/probes/decode_tile_sum.patch, applied on the device's copy; lab/notes/decode-loop-reductions.md):
# no tile reduces its row sum across the warps that hold its keys (sm_90a: bf16 64-key tiles 9 -> 6
# barriers, 340-350 -> 322-324 instructions, 158-162 -> 168 registers; fp8 sw36 12 -> 9 barriers,
# 557 -> 529). Here: the decode GPU tests on it, then arms new / old (patch reversed) / new on bf16
# and fp8 rows of the grid and the sweep, kvattn only, graph replay. Predicted: level at the DRAM
# roof, 1-3 % faster where the loop's chain binds (16 x 4096, 128 x 2048, sw12, fp8). No carry, ~330 s.
set -uo pipefail
source lab/probes/device_env.sh
patch -p1 < lab/probes/decode_tile_sum.patch > /dev/null || exit 1
gpu_tests pytest-decode ${TEST_S:-200} tests/ops/decode tests/ops/test_device_clamps.py
echo "tests: $(( $(date +%s) - t0 )) s"
ROWS="bf16 16x4096 p64 NHD,bf16 64x8192 p64 HND,bf16 128x2048 p16 NHD,bf16 256x1024 p16 NHD,bf16 1x32768 p64 NHD,fp8 64x8192,fp8 256x1024,sw06 ,sw10 ,sw12 ,sw36 ,sw58 ,sw47 ,sw51 "
patch_arms tile-sum lab/probes/decode_tile_sum.patch ${AB_S:-60} "$ROWS" kv_rows
echo "done: $(( $(date +%s) - t0 )) s"
