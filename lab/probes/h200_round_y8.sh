#!/usr/bin/env bash
# Page runs in the decode loop (lab/probes/decode_page_runs.patch, applied on the device's copy;
# lab/notes/formats.md "Candidate (c): page runs"): a tile's rows grouped by page, one page id and
# one 64-bit multiply a run instead of a row, bf16 loop 533 -> 340 SASS instructions a 64-key tile
# on pages of 64 (542 -> 387 on pages of 16), outputs bit-identical in the interpreter. Here: the
# decode GPU tests on it, then arms default / `runs0` (page_runs=0: the token offsets of before) on
# the bf16 grid rows and the sweep's paged bf16 / fp8 rows, kvattn only, graph replay; then Nsight
# Compute on two rows (kvattn). Predicted: 64 x 8192 p64 and 128 x 2048 p64 level with FlashInfer's
# fa2 (1.02-1.03 now), instructions 142 M -> ~88 M under ncu. No carry (~420 s).
set -uo pipefail
source lab/probes/device_env.sh
patch -p1 < lab/probes/decode_page_runs.patch > /dev/null || exit 1
gpu_tests pytest-decode ${TEST_S:-200} tests/ops/decode tests/ops/test_device_clamps.py
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-page-runs ${AB_S:-150} "bf16 64x8192,bf16 128x2048,bf16 16x4096,bf16 256x1024,fp8 64x8192,fp8 256x1024,sw07 ,sw10 ,sw12 ,sw16 ,sw36 " --ab runs0:decode:page_runs=0
timeout 60 python3 lab/probes/ncu_decode_compare.py --impls kvattn --shape "decode bf16 64x8192 p64 HND" \
  --shape "decode bf16 128x2048 p64 HND" --budget 50 --json "$OUT/ncu-runs.json" 2> "$OUT/ncu-runs.err" | tail -n 6
echo "done: $(( $(date +%s) - t0 )) s"
