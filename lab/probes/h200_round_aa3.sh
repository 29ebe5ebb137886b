#!/usr/bin/env bash
# The tile sum (landed in c6caf66) under Triton 3.7.1: arms new / old / new, the old arm the landed
# change reversed on the device's copy (lab/probes/decode_tile_sum_landed.patch). The second of two
# back-to-back calls (device_env.sh triton_371; the first, carry [".t371/a"]:
# mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/), this one carry [".t371/b"].
set -uo pipefail
source lab/probes/device_env.sh
triton_371 || exit 1
ROWS="fp8 64x8192,fp8 256x1024,sw36 ,sw58 ,bf16 1x32768 p64 NHD,bf16 64x8192 p64 HND,bf16 16x4096 p64 NHD,sw12 "
patch_arms tile-sum-371 lab/probes/decode_tile_sum_landed.patch ${ARM_S:-50} "$ROWS" kv_rows
echo "done: $(( $(date +%s) - t0 )) s"
