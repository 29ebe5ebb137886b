#!/usr/bin/env bash
# Next after session n (not run yet): the lanes' request cap at 64 (`--ab cap64:decode:balance_lanes_cap=64`)
# on the cap-bound sw12 and the other balanced rows, equal ones included (their deal is unchanged);
# then the MLA fp8 rows under the warp-specialised kernel's e4m3 form (`fp8ws`, 10 % faster than
# the table's heads-in-N kernel on fp8 16 heads 128 x 8192 in session n's call 1) as an arm. No
# carry, one call (~300 s); then probe n1's fp8 tiles (~110 s). First the decode tests of the lanes
# and the deal, the random ragged batches among them, on the GPU.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests lanes-random ${LANES_S:-60} tests/ops/decode/test_decode.py -k "lanes or deal"
kv_rows ab-cap64 ${CAP_S:-130} "sw12 ,sw07 ,sw30 ,sw09 ,sw59 ,sw28 ,sw41 ,sw10 ,sw19 ,sw24 ,sw45 " --suite sweep \
  --ab cap64:decode:balance_lanes_cap=64
timeout ${MLA_S:-150} python3 benchmarks/run.py --suite mla,sweep --filter "mla fp8" --graph-only --warmup 10 --rep 30 \
  --no-peers --ab fp8ws:mla:heads_as_n=false,block_h=64,block_n=64,num_warps=8,num_stages=3 \
  --out "$OUT/ab-fp8ws.json" --md "$OUT/ab-fp8ws.md" --time-budget $(( ${MLA_S:-150} - 15 )) 2> "$OUT/ab-fp8ws.err"
grep "^| " "$OUT/ab-fp8ws.md" | grep -v "^| class\|^|---" | cut -c1-240
xz -9 "$OUT/ab-fp8ws.err" 2>/dev/null
kv_rows ab-fp8-n64 ${N64_S:-110} "decode fp8" --ab n64s4:decode:block_n=64,num_stages=4  # (probe n1's run)
echo "done: $(( $(date +%s) - t0 )) s"
