#!/usr/bin/env bash
set -u
F=(--filter "decode bf16 1x32768" --filter "decode bf16 4x8192 p16" --filter "decode bf16 8x8192 p16" --filter "single_decode" --filter "nvfp4 1x32768 p16 NHD D64")
PYTHONPATH=src timeout 200 python3 benchmarks/tune_decode.py --variants default,combine "${F[@]}" --rep 60 --out $OUT/tune.json 2>&1 >/dev/null | grep " us "
PYTHONPATH=src timeout 150 python3 benchmarks/timeline.py --filter "1x32768" --filter "L4096" --filter "L32768" --variants combine --no-readers --reps 15 --out $OUT/timeline.json 2>&1 | grep programs
