#!/usr/bin/env bash
# A key part a warp with its own softmax state in the decode loop (lab/probes/decode_warp_keys.patch,
# applied on the device's copy; lab/notes/formats.md "Candidate (d)" fp8 keys in M, "Candidate (e)"
# bf16 rows in M): a tile's max and sum cross no warp (sm_90a: fp8 12 -> 4 barriers, 557 -> 520
# instructions a 128-key tile on sw36, 194 -> 255 registers with spills outside the loop; bf16 9 ->
# 3 barriers, 340-387 -> 353-396 a 64-key tile, 250-254 registers). Here: the decode GPU tests on
# it, then arms default (the parts) / `wk0` (warp_keys=false: the loop of before) on fp8 and bf16
# rows of the grid and the sweep, kvattn only, graph replay. Predicted: sw36 692 -> ~640-660 us if
# the chain binds; bf16 level at the DRAM roof, 1-3 % faster on 16 x 4096 / 128 x 2048 / sw12.
# No carry, ~330 s.
set -uo pipefail
source lab/probes/device_env.sh
patch -p1 < lab/probes/decode_warp_keys.patch > /dev/null || exit 1
gpu_tests pytest-decode ${TEST_S:-200} tests/ops/decode tests/ops/test_device_clamps.py
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-warp-keys-fp8 ${AB_S:-110} "fp8 64x8192,fp8 ragged64x,fp8 256x1024,sw36 ,sw19 ,sw23 ,sw48 ,sw58 ,sw45 ,sw49 ,sw60 ,sw63 " --ab wk0:decode:warp_keys=false
kv_rows ab-warp-keys-bf16 ${AB_S:-110} "bf16 16x4096 p64 NHD,bf16 16x4096 p16 NHD,bf16 64x8192 p64 HND,bf16 128x2048 p64 HND,bf16 128x2048 p16 NHD,bf16 256x1024 p16 NHD,sw06 ,sw07 ,sw10 ,sw12 ,sw16 ,sw41 " --ab wk0:decode:warp_keys=false
echo "done: $(( $(date +%s) - t0 )) s"
