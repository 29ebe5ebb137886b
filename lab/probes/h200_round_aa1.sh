#!/usr/bin/env bash
# Two decode-loop candidates in one call (lab/notes/decode-loop-reductions.md).
# (1) The tile sum (lab/probes/decode_tile_sum.patch): arms new / old / new on the 14 rows of
# h200_round_z13.sh, no tests (z13 ran them: 707 passed). (2) The warp key parts
# (lab/probes/decode_warp_keys.patch) on the tree without the tile sum: decode GPU tests, then
# the parts against `warp_keys=false` on the fp8 and bf16 rows of h200_round_z12.sh. No carry, ~500 s.
set -uo pipefail
source lab/probes/device_env.sh
patch -p1 < lab/probes/decode_tile_sum.patch > /dev/null || exit 1
ROWS="bf16 16x4096 p64 NHD,bf16 64x8192 p64 HND,bf16 128x2048 p16 NHD,bf16 256x1024 p16 NHD,bf16 1x32768 p64 NHD,fp8 64x8192,fp8 256x1024,sw06 ,sw10 ,sw12 ,sw36 ,sw58 ,sw47 ,sw51 "
patch_arms tile-sum lab/probes/decode_tile_sum.patch ${ARM_S:-55} "$ROWS" kv_rows
patch -R -p1 < lab/probes/decode_tile_sum.patch > /dev/null || exit 1
echo "tile sum: $(( $(date +%s) - t0 )) s"
patch -p1 < lab/probes/decode_warp_keys.patch > /dev/null || exit 1
gpu_tests pytest-warp-keys ${TEST_S:-130} tests/ops/decode tests/ops/test_device_clamps.py
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-warp-keys-fp8 ${AB_S:-95} "fp8 64x8192,fp8 ragged64x,fp8 256x1024,sw36 ,sw19 ,sw23 ,sw48 ,sw58 ,sw45 ,sw49 ,sw60 ,sw63 " --ab wk0:decode:warp_keys=false
kv_rows ab-warp-keys-bf16 ${AB_S:-95} "bf16 16x4096 p64 NHD,bf16 16x4096 p16 NHD,bf16 64x8192 p64 HND,bf16 128x2048 p64 HND,bf16 128x2048 p16 NHD,bf16 256x1024 p16 NHD,sw06 ,sw07 ,sw10 ,sw12 ,sw16 ,sw41 " --ab wk0:decode:warp_keys=false
echo "done: $(( $(date +%s) - t0 )) s"
