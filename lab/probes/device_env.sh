# Sourced by the device scripts of lab/probes: $OUT made (default ./out), Python unbuffered, and
# $OUT/env.txt naming the GPU, its driver and memory, torch, Triton and the checkout's commit.
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  git log --oneline -1 2>/dev/null; } > "$OUT/env.txt" 2>&1
