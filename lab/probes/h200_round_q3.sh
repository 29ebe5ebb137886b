#!/usr/bin/env bash
# The balanced MLA combine over several heads a program (lab/probes/combine_heads.patch, applied here
# to the device's copy: configs.MLAConfig.combine_heads, the kernel's BLOCK_HEADS; the plan keeps the
# narrow tile's partials x heads within 16 rows and narrows the wide tile to match): every balanced
# MLA row whose combine it changes on the faked H200 plan (`lab/probes/mla_launches.py --diff
# combine_heads=4` with the patch: the grid's equal balanced rows and sw66), kvattn only, graph
# replay, one head a program against 2 / 4 / 8 (`ch2`, `ch4`, `ch8`); then the balanced combine's GPU
# tests (several heads included). lab/notes/mla-ragged.md "The balanced combine's registers". No
# carry (~220 s).
set -uo pipefail
patch -p1 --forward < lab/probes/combine_heads.patch || exit 1
source lab/probes/device_env.sh
mla_rows ab-combine-heads ${AB_S:-130} "64x4096,32x16384,64x16384,sw66 " \
  --ab ch2:mla:combine_heads=2 --ab ch4:mla:combine_heads=4 --ab ch8:mla:combine_heads=8
echo "ab: $(( $(date +%s) - t0 )) s"
gpu_tests pytest-mla-combine ${TEST_S:-90} tests/ops/mla/test_balanced.py tests/ops/mla/test_combine_launch.py
echo "done: $(( $(date +%s) - t0 )) s"
