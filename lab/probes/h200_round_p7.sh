#!/usr/bin/env bash
# Uniform launches merged by the combine launch at 3 stages where the main tiles replace the long
# ones (configs.combine_stages; probe p6's s3 arm found them): the rows whose launch it changes
# (sw33, sw43, sw51, sw57) and sw31 beside the previous launch (`c4`: combine_stages=0), kvattn only,
# graph replay; then the decode GPU tests on that tree, stopped with their summary after DEC_S
# seconds. No carry (~200 s). Not run: the session's device time ran out before a machine could
# start, and the rule was taken back out of the package (unmeasured on sw51, no GPU tests); its
# measurements and design are in lab/notes/decode-ragged-batches.md "Uniform launches at three
# programs an SM". The rule travels as lab/probes/combine_stages.patch, applied here to the device's
# copy of the tree (the package here stays as main has it).
set -uo pipefail
patch -p1 --forward < lab/probes/combine_stages.patch || exit 1
source lab/probes/device_env.sh
kv_rows ab-c4 60 "sw31 ,sw33 ,sw43 ,sw51 ,sw57 " --ab c4:decode:combine_stages=0
echo "ab: $(( $(date +%s) - t0 )) s"
gpu_tests pytest-decode ${DEC_S:-110} tests/ops/decode
echo "done: $(( $(date +%s) - t0 )) s"
