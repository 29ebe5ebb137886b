#!/usr/bin/env bash
# Under Triton 3.7.1 (the second of two back-to-back calls, as h200_round_aa3.sh; carry
# [".t371/b"]): the tile sum's arms new / old / new (aa3, not run in session aa; the old arm
# lab/probes/decode_tile_sum_landed.patch reversed: TILE_SUM off, the RoPE launches' loop) and the
# landed lanes combine launch against `balance_combine_units=0` (the in-kernel merge) on the
# one-KV-head lanes rows and the equal 8/1 row.
set -uo pipefail
source lab/probes/device_env.sh
triton_371 || exit 1
ROWS="fp8 64x8192,fp8 256x1024,sw36 ,sw58 ,bf16 1x32768 p64 NHD,bf16 64x8192 p64 HND,bf16 16x4096 p64 NHD,sw12 "
patch_arms tile-sum-371 lab/probes/decode_tile_sum_landed.patch ${ARM_S:-50} "$ROWS" kv_rows
kv_rows lanes-combine-371 ${AB_S:-50} "sw12 ,64x8192 p16 NHD h8/1,sw07 ,sw48 ,sw01 " \
  --ab lc0:decode:balance_combine_units=0
echo "done: $(( $(date +%s) - t0 )) s"
