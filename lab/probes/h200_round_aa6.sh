#!/usr/bin/env bash
# aa5 then aa4 in one call (one machine start): fp8 at three programs an SM on 128-key tiles (the
# register-cap GPU test, arm `s2r` on 14 fp8 rows), then sw12's lanes combine launch
# (lab/probes/lanes_combine_uniform.patch applied after the fp8 arms: the lanes GPU tests, the
# table / `cap64` / `lc1` arms). See the two scripts' headers. No carry, ~360 s.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-maxnreg ${TEST_S:-40} tests/ops/decode/test_decode.py -k "register_cap"
kv_rows ab-fp8-three ${AB_S:-110} "fp8 64x8192,fp8 ragged64x,fp8 256x1024,sw36 ,sw19 ,sw23 ,sw48 ,sw58 ,sw45 ,sw49 ,sw60 ,sw63 ,sw02 ,sw17 " \
  --ab s2r:decode:num_stages=2,maxnreg=168
echo "fp8: $(( $(date +%s) - t0 )) s"
patch -p1 < lab/probes/lanes_combine_uniform.patch > /dev/null || exit 1
gpu_tests pytest-lanes ${TEST_S:-90} tests/ops/decode/test_decode.py tests/ops/common -k "lanes or balanced or combine"
kv_rows ab-lanes-uniform ${AB_S:-110} "sw12 ,sw07 ,64x8192 p16 NHD h8/1,sw01 ,sw54 ,ragged64x[1,12000] p16,sw09 ,sw30 " \
  --ab cap64:decode:balance_lanes_cap=64 --ab lc1:decode:balance_combine_units=1,balance_lanes_cap=64
echo "done: $(( $(date +%s) - t0 )) s"
