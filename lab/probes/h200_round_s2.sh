#!/usr/bin/env bash
# The balanced MLA combine in 1 or 2 warps a program (lab/probes/mla_combine_warps.patch: config
# combine_warps, 4 in the table, an override that keeps the padded programs and the seesaw's plan).
# Its per-program plan (request_units over the [64] lengths: a cumsum and reductions) crosses the
# 4 warps through shared memory: 13 barriers in 608 SASS instructions; in one warp 0 barriers in 808
# (local sm_90a compile, 69 registers), in two 15 in 688. The balanced combine costs 8.6 us at 64 x
# 4096, 64 heads against the uniform combine's ~4.9 (session r call 5; session o). Arms `w1` /
# `w2` on the balanced MLA rows, kvattn only, graph replay; then the balanced combine's GPU tests
# under `combine_warps=1` are not needed (the warps do not change the arithmetic's order: the
# merge is per row) but the MLA combine tests run anyway. No carry (~150 s).
set -uo pipefail
patch -p1 --forward < lab/probes/mla_combine_warps.patch || exit 1
source lab/probes/device_env.sh
mla_rows ab-combine-warps ${AB_S:-100} "64x4096,32x16384,sw66 ,sw70 ,sw74 ,sw77 ,sw69 " \
  --ab w1:mla:combine_warps=1 --ab w2:mla:combine_warps=2
echo "ab: $(( $(date +%s) - t0 )) s"
gpu_tests pytest-mla-combine ${TEST_S:-60} tests/ops/mla/test_balanced.py tests/ops/mla/test_combine_launch.py
echo "done: $(( $(date +%s) - t0 )) s"
