#!/usr/bin/env bash
# A key partition a warp in the fp8 keys-in-M decode loop (lab/probes/decode_fp8_warp_keys.patch,
# applied on the device's copy; lab/notes/formats.md "Candidate (d)"): each warp keeps its own
# softmax state and accumulator over its quarter of a tile's keys, merged after the loop, so a
# tile's max and sum cross no warp (sm_90a: 12 -> 4 barriers, 557 -> 520 instructions a 128-key
# tile on sw36, but 194 -> 255 registers with spills outside the loop). Here: the decode GPU tests
# on it, then arms default (warp keys) / `wk0` (warp_keys=false: the loop of before) on the fp8 rows
# of the grid and the sweep, kvattn only, graph replay. Predicted: sw36 692 -> ~640-660 us if the
# chain binds; the registers may cost it all. No carry, ~300 s.
set -uo pipefail
source lab/probes/device_env.sh
patch -p1 < lab/probes/decode_fp8_warp_keys.patch > /dev/null || exit 1
gpu_tests pytest-decode ${TEST_S:-200} tests/ops/decode tests/ops/test_device_clamps.py
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-warp-keys ${AB_S:-150} "fp8 64x8192,fp8 ragged64x,fp8 256x1024,sw36 ,sw19 ,sw23 ,sw48 ,sw58 ,sw45 ,sw49 ,sw60 ,sw63 ,sw02 " --ab wk0:decode:warp_keys=false
echo "done: $(( $(date +%s) - t0 )) s"
