#!/usr/bin/env bash
# Third device call of the round (H200): `kvattn fuzz` on the GPU for 8 minutes, workers and draw
# options from the second call's probe (FUZZ_ARGS).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
timeout 580 python3 -m kvattn fuzz --device cuda --seconds ${FUZZ_SECONDS:-470} ${FUZZ_ARGS:---jobs 12} --json "$OUT/fuzz.json" > "$OUT/fuzz.txt" 2>&1
echo "rc $?"
tail -n 20 "$OUT/fuzz.txt"
