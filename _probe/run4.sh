#!/usr/bin/env bash
set -u
F=(--filter "decode bf16 1x32768" --filter "decode bf16 4x8192 p16" --filter "single_decode" --filter "nvfp4 1x32768 p16 NHD D64" --filter "spec_decode q4")
PYTHONPATH=src timeout 200 python3 benchmarks/tune_decode.py --variants default,combine "${F[@]}" --rep 60 --out $OUT/tune.json 2>&1 >/dev/null | grep " us "
rm -rf _probe/bs16; mkdir -p _probe/bs16; cp -r src _probe/bs16/src
sed -i 's/max(1, 512 \* cfg.num_warps \/\/ (merge_rows \* plan.head_dim))/max(1, 1024 * cfg.num_warps \/\/ (merge_rows * plan.head_dim))/' _probe/bs16/src/kvattn/ops/decode_launch.py
diff -r src/kvattn _probe/bs16/src/kvattn | grep -c "^[<>]"
echo "== bs16"
PYTHONPATH=_probe/bs16/src:. timeout 100 python3 -m benchmarks.tune_decode --variants default --filter "decode bf16 1x32768" --filter "L4096" --filter "L32768" --rep 60 2>&1 >/dev/null | grep " us "
PYTHONPATH=src timeout 150 python3 benchmarks/timeline.py --filter "1x32768" --filter "L4096 NONE" --filter "L32768" --no-readers --reps 15 --out $OUT/timeline.json 2>&1 | grep programs
