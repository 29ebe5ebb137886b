#!/usr/bin/env bash
# The second of two back-to-back calls (device_env.sh triton_371; the first, carry [".t371/a"]:
# mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/), this one carry [".t371/b"]:
# page runs against the token offsets (`--ab runs0:decode:page_runs=0`) under Triton 3.7.1, the
# Triton torch 2.13 pins (the runs are not version-gated: is the loop as light there?). ~100 s.
set -uo pipefail
source lab/probes/device_env.sh
triton_371 || exit 1
kv_rows ab-runs-371 ${AB_S:-90} "bf16 128x2048 p64 HND,bf16 256x1024 p16 NHD,bf16 64x8192 p64 HND,bf16 16x4096 p64 NHD,fp8 256x1024,sw10 ,sw12 ,sw06 ,sw41 "  --ab runs0:decode:page_runs=0
echo "done: $(( $(date +%s) - t0 )) s"
