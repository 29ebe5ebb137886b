#!/usr/bin/env bash
# fp8 decode at three programs an SM on its own 128-key tiles: two stages (67.5 KB of shared memory
# a program) and ptxas capped at 168 registers (config fields num_stages / maxnreg; sm_90a, Triton
# 3.6: the keys-in-M loop 529 -> 516 SASS instructions a tile on sw36, 194 -> 168 registers, 72
# bytes of stack, no spill inside the loop; lab/notes/formats.md "fp8 at three programs an SM on
# 128-key tiles"). The loop is bound by its dependency chain at two programs (8 warps) an SM; 12
# warps hide more of it, where the earlier three-an-SM try (64-key tiles) paid 55 % more
# instructions a key. The register-cap test on the GPU, then the arm `s2r` against the table on the
# fp8 rows of the grid and the sweep, kvattn only, graph replay. Predicted: long fp8 rows 0.85 ->
# ~0.90 of copy if 12 warps hide the chain; short ones level or slower (two stages). No carry, ~150 s.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-maxnreg ${TEST_S:-40} tests/ops/decode/test_decode.py -k "register_cap"
kv_rows ab-fp8-three ${AB_S:-110} "fp8 64x8192,fp8 ragged64x,fp8 256x1024,sw36 ,sw19 ,sw23 ,sw48 ,sw58 ,sw45 ,sw49 ,sw60 ,sw63 ,sw02 ,sw17 " \
  --ab s2r:decode:num_stages=2,maxnreg=168
echo "done: $(( $(date +%s) - t0 )) s"
