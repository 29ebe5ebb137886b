#!/bin/bash
# The e4m3 seesaw kernel's device run (lab/notes/mla.md "MLA: fp8 on the seesaw"): the MLA GPU
# tests, then an A/B of fp8 Hq 128 (the new kernel vs the Triton fp8-score kernel, timing floors
# without copies / without the value conversion, the stagger off), bf16 Hq 128 for reference, fp8
# Hq 32 / 64 (the dispatch from 17 heads up), beside the bf16 / fp8 matmul ceilings of the same run.
# Run from the repository root (or a copy of src/, tests/, benchmarks/, lab/probes/) on one Hopper GPU:
#   OUT=/some/dir bash lab/probes/mla_fp8_gpu.sh        (~4 min; logs under $OUT)
set -u
OUT=${OUT:-$(mktemp -d)}
export PYTHONPATH=src PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } \
  > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

# 1. Tests: the MLA folder (both Gluon kernels, the Triton kernel, the sm_90a pins) and the
#    batch-invariance / clamp tests of the MLA kernels. One CPU thread a worker for the oracles.
OMP_NUM_THREADS=1 timeout -s INT "${TEST_TIMEOUT:-170}" python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  --junitxml="$OUT/junit_mla.xml" tests/ops/mla tests/ops/test_guards_gpu.py -k "not decode_64 and not single_decode" \
  > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$?"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 30

# 2. Timing (CUDA-graph replay, do_bench median, L2 flushed; benchmarks/tune_mla.py).
timeout -s INT "${TIME_TIMEOUT:-200}" python3 - > "$OUT/timing.txt" 2>&1 <<'PY'
import torch
from benchmarks import ceilings, tune_mla
from benchmarks.shapes import Shape

dev = torch.device("cuda")
for fp8 in (False, True):
    try:
        print(f"matmul {'fp8' if fp8 else 'bf16'} 8192^3: {ceilings._matmul_tflops(dev, 8192, 0.5, fp8=fp8):.1f} TFLOP/s",
              flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"matmul fp8={fp8} failed: {exc}", flush=True)
    torch.cuda.empty_cache()
# default = the e4m3 seesaw kernel; gluon = KVATTN_GLUON_WS=0 (the Triton fp8-score kernel for fp8)
tune_mla.main(["--filter", "mla fp8 Hq128", "--variants", "default,gluon,ws_nocopies,ws_noconvert,ws_nostagger"])
tune_mla.main(["--filter", "mla bf16 Hq128", "--variants", "default"])
extra = [Shape("mla", 64, 4096, num_qo_heads=h, num_kv_heads=1, head_dim=576, page_size=64, kv_dtype="fp8",
               q_dtype="fp8", peers=False) for h in (32, 64)]
tune_mla.main(["--variants", "default,gluon"], grid=extra)
PY
echo "timing rc=$?"
cat "$OUT/timing.txt"
