#!/usr/bin/env bash
# Kind nvidia-h200-x2: the distributed tests over NCCL on 2 GPUs (every function and scheme, MLA on
# the Gluon kernel, long requests: the kernels changed since they last ran there on 2026-11-26:
# MLA's balanced plan and bfloat16 partials, decode's page runs), then the context-parallel decode
# benchmark (1M-token single decode, 8 x 256k batch decode, 1 GPU against 2). NVLink multicast off
# everywhere (KINDS.md). No carry, ~250 s.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source lab/probes/device_env.sh
python3 -c 'import torch; print("GPUs", torch.cuda.device_count())' | tee -a "$OUT/env.txt"
gpu_tests pytest-distributed ${TEST_S:-150} tests/test_distributed.py
echo "tests: $(( $(date +%s) - t0 )) s"
timeout ${BENCH_S:-200} python3 benchmarks/distributed_decode.py --out "$OUT/distributed_decode.json" > "$OUT/bench.log" 2>&1
tail -n 20 "$OUT/bench.log"
echo "done: $(( $(date +%s) - t0 )) s"
