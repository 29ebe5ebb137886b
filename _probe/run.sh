#!/usr/bin/env bash
set -u
mk() { rm -rf _probe/$1; cp -r src _probe/$1; }
mk nomerge; sed -i 's/        if arrived == num_splits - 1:/        if arrived == num_splits + 1000000:/' _probe/nomerge/kvattn/ops/decode_kernels.py
diff -r src/kvattn _probe/nomerge/kvattn | grep -c "^[<>]"
F=(--filter "decode bf16 1x32768 p16" --filter "decode bf16 4x8192 p16" --filter "L4096 NONE")
for v in nomerge; do
  echo "== $v"
  PYTHONPATH=_probe/$v:. timeout 100 python3 -m benchmarks.tune_decode --variants default,combine "${F[@]}" --rep 50 2>&1 >/dev/null | grep " us "
done
