#!/usr/bin/env bash
# fp8 decode at three programs an SM. The fp8 key loop is latency-bound, not issue-bound: sw36
# (24 x 48740, 64/8 heads) issues ~192M warp-instructions over 132 SMs in ~700 us, about one a
# clock an SM with 8 warps resident (2 programs of 4). With the keys in M, 64-key tiles compile to
# 150 registers and 51 KB of shared memory (128-key tiles: 194 and 100 KB), so three programs (12
# warps) fit an SM where two do now; earlier 64-key trials (247 registers before the keys went
# into M) ran two. Arms, kvattn only, graph replay: `n64m3` (64-key tiles, 3 stages, 3 an SM),
# `n64s4m3` (4 stages), `n64m2` (64-key tiles at 2 an SM: the tile's own cost apart from the
# occupancy). The plan's occupancy estimate says 4 for these tiles: `max_per_sm=3` sets the grid to
# what fits (local sm_90a compile). The 64-key loop issues 431 SASS instructions a tile, 862 a 128
# keys against the 128-key tile's 557 (`benchmarks/decode_sass_counts.py --fmt fp8 --set
# BLOCK_N=64`): 55 % more a key, so three an SM wins only if 12 warps issue ~1.5x what 8 do.
# Predicted: n64m2 5-10 % slower than the table; n64m3 level to 10 % faster. `n64`: the plan's
# own estimate (4 an SM), which the rows-in-M launches (sw60, sw63: 99 registers, 52 KB at 64-key
# tiles) do fit, the keys-in-M ones not (their grid then runs a partial second wave, dealt). No
# carry (~210 s).
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-fp8-n64 ${AB_S:-200} \
  "sw36 ,sw19 ,sw23 ,sw48 ,sw58 ,sw45 ,sw49 ,sw60 ,sw63 ,fp8 64x8192 p16,fp8 ragged64x[1,12000] p16" \
  --ab n64m3:decode:block_n=64,max_per_sm=3 \
  --ab n64s4m3:decode:block_n=64,num_stages=4,max_per_sm=3 \
  --ab n64m2:decode:block_n=64,max_per_sm=2 \
  --ab n64:decode:block_n=64
echo "done: $(( $(date +%s) - t0 )) s"
