#!/usr/bin/env bash
# Two cheap levers, kvattn only, graph replay (~330 s, no carry):
# 1. decode's `min_chunk` (the fewest keys a uniform split takes, 256 in the sm90 tables) at 128 and
#    64 on the 14 sweep rows whose launch either changes on the faked H200 plan
#    (`lab/probes/decode_plan_rows.py --override min_chunk=128|64 --compare`): the latency-bound
#    small batches (sw31, sw53: 1-3 requests) where more, shorter splits put more SMs on the keys.
# 2. MLA's split partials in the output's 16-bit dtype (lab/probes/mla_16bit_partials.patch, applied
#    here after a baseline run): the partial round trip at 16-64 heads is 64 x 2 x Hq x 512 float32
#    at 64 x 4096 (16.8 MB at 64 heads, written at the split programs' ends and read by the combine);
#    FlashInfer's fa3 MLA keeps its partials in the output dtype. Then the MLA GPU tests under it
#    (their tolerances are the reference's own error, scaled).
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-minchunk ${MC_S:-110} "sw01 ,sw02 ,sw08 ,sw21 ,sw22 ,sw26 ,sw27 ,sw29 ,sw31 ,sw37 ,sw42 ,sw44 ,sw53 ,sw61 " \
  --ab mc128:decode:min_chunk=128 --ab mc64:decode:min_chunk=64
echo "min_chunk: $(( $(date +%s) - t0 )) s"
rows="64x4096,32x16384,128x8192,sw65 ,sw66 ,sw70 ,sw74 ,sw77 "
mla_rows mla-f32 ${MLA_AB_S:-75} "$rows"
echo "mla f32: $(( $(date +%s) - t0 )) s"
patch -p1 --forward < lab/probes/mla_16bit_partials.patch || exit 1
mla_rows mla-16bit ${MLA_AB_S:-75} "$rows"
echo "mla 16-bit: $(( $(date +%s) - t0 )) s"
gpu_tests pytest-mla16 ${MLA_S:-100} tests/ops/mla
echo "done: $(( $(date +%s) - t0 )) s"
