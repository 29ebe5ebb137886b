#!/bin/bash
# One device call on two GPUs (kind nvidia-h100-x2): the context-parallel benchmark, then the NCCL
# tests; NVLink multicast stays off. Usage: bash lab/probes/distributed_gpu.sh [SECONDS] [bench-only]
TOTAL=${1:-200}
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $OUT/gpus.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())" 2>&1 | tee $OUT/env.txt
echo "== benchmark"
BENCH=$((TOTAL * 55 / 100)); [ "$2" = "bench-only" ] && BENCH=$TOTAL
timeout $BENCH python3 benchmarks/distributed_decode.py --reps 20 --out $OUT/distributed_decode.json > $OUT/bench.log 2>&1; echo "bench rc $? ($(($(date +%s)-T0)) s)"
grep -v Warning $OUT/bench.log | tail -14
echo "== nccl tests"
LEFT=$((TOTAL - ($(date +%s)-T0)))
[ "$2" = "bench-only" ] && exit 0
timeout $LEFT python3 -m pytest -q -x tests/test_distributed.py -s -k "nccl or kernel_matches" -p no:cacheprovider > $OUT/test_nccl.log 2>&1; echo "nccl rc $? ($(($(date +%s)-T0)) s)"
grep -E "passed|failed|Error|error:|case |rank " $OUT/test_nccl.log | head -20
