#!/usr/bin/env bash
# (Ran in session ab call 1; its patch then landed with the early start for uniform batches, and
# the patch file left the tree: git history holds it. lab/notes/decode-sw12.md.)
# sw12 (45 log-normal requests to 51550 keys, 8/1 heads, p64; 1.075 of FlashInfer, the sweep's worst
# decode row): the lanes combine launch again (lab/probes/lanes_combine_uniform.patch, applied on the
# device's copy; lab/notes/decode-sw12.md), now with a batch found uniform
# merged in the split kernel, so the combine launch of an equal batch reads the lengths and exits
# (session u's gated form merged it there: the grid's equal 64 x 8192 p16 8/1 row +4.7 %). The lanes
# GPU tests, then the table / `cap64` / `lc1` (requests of 2+ units by the combine launch, 64 lanes
# a request) on the one-KV-head lanes rows and controls. Predicted: sw12 ~51 us (lc1 took 59.0 ->
# 54.7 before the tile sum), 64 x 8192 p16 8/1 +1-2 us (an empty PDL launch), the rest level
# (two KV heads or more: no combine). No carry, ~200 s.
set -uo pipefail
source lab/probes/device_env.sh
patch -p1 < lab/probes/lanes_combine_uniform.patch > /dev/null || exit 1
gpu_tests pytest-lanes ${TEST_S:-90} tests/ops/decode/test_decode.py tests/ops/common -k "lanes or balanced or combine"
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-lanes-uniform ${AB_S:-110} "sw12 ,sw07 ,64x8192 p16 NHD h8/1,sw01 ,sw54 ,ragged64x[1,12000] p16,sw09 ,sw30 " \
  --ab cap64:decode:balance_lanes_cap=64 --ab lc1:decode:balance_combine_units=1,balance_lanes_cap=64
echo "done: $(( $(date +%s) - t0 )) s"
