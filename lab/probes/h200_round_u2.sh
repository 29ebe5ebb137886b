#!/usr/bin/env bash
# The lanes combine at one KV head only (lab/probes/lanes_combine.patch, now gated in
# plan._combine_units: a lanes launch of one program a unit leaves requests of more than
# balance_combine_units units to the combine launch; launches of more KV heads merge in the kernel
# whatever the config says). Session s measured it ungated: sw12 59.0 -> 54.8 us (`lc1`), sw07
# level, every multi-head lanes row +1-3 % (lab/notes/decode-ragged-batches.md "Next for sw12: the
# lanes merged by the combine launch"). Here: its lanes GPU tests, then `lc1` and `cap64` on the two
# one-KV-head lanes rows, the grid's equal 64 x 8192 p16 at 8/1 heads (an empty combine launch:
# does it cost?), and two multi-head controls that must not move. No carry (~200 s).
set -uo pipefail
patch -p1 --forward < lab/probes/lanes_combine.patch || exit 1
source lab/probes/device_env.sh
gpu_tests pytest-lanes ${TEST_S:-80} tests/ops/decode/test_decode.py -k "lanes or balanced"
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-lanes-kv1 ${AB_S:-110} \
  "sw12 ,sw07 ,64x8192 p16 NHD h8/1,sw54 ,ragged64x[1,12000] p16" \
  --ab cap64:decode:balance_lanes_cap=64 \
  --ab lc1:decode:balance_combine_units=1,balance_lanes_cap=64
echo "done: $(( $(date +%s) - t0 )) s"
