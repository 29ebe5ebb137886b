#!/usr/bin/env bash
# Uniform launches merged by the combine launch at 3 stages where the main tiles replace the long
# ones (configs.combine_stages; probe p6's s3 arm found them): the rows whose launch it changes
# (sw33, sw43, sw51, sw57) and sw31 beside the previous launch (`c4`: combine_stages=0), kvattn only,
# graph replay; then the decode GPU tests on that tree, stopped with their summary after DEC_S
# seconds; between them the fp8 combine launches with the rows in M. No carry (~250 s).
# Not run: the session's device time ran out before a machine could start, and the rule was
# taken back out of the package (unmeasured on sw51, no GPU tests); its measurements and design:
# lab/notes/decode-combine-launches.md "Uniform launches at three programs an SM". The rule travels
# as lab/probes/combine_stages.patch, applied here to the device's copy of the tree (the package
# here stays as main has it).
set -uo pipefail
patch -p1 --forward < lab/probes/combine_stages.patch || exit 1
source lab/probes/device_env.sh
kv_rows ab-c4 60 "sw31 ,sw33 ,sw43 ,sw51 ,sw57 " --ab c4:decode:combine_stages=0
echo "ab: $(( $(date +%s) - t0 )) s"
# fp8 uniform launches merged by the combine launch with the rows in M at 8 rows (`rows`), the
# candidate rule of lab/notes/formats.md "Formats: rows in M at 8 rows for short requests" (sw60 /
# sw63 measured faster, sw13 level; sw02 / sw17 / sw42 / sw44 not timed yet)
kv_rows ab-fp8rows 50 "sw02 ,sw13 ,sw17 ,sw42 ,sw44 ,sw60 ,sw63 " --ab rows:decode:keys_in_m=false
gpu_tests pytest-decode ${DEC_S:-110} tests/ops/decode
echo "done: $(( $(date +%s) - t0 )) s"
