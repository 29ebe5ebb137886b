#!/usr/bin/env bash
# Why FlashInfer's fa2 tensor-core decode reads ~2-3 % faster than kvattn on large equal bf16
# batches: Nsight Compute per kernel (lab/probes/ncu_decode_compare.py running ncu on
# benchmarks/ncu_decode.py) for kvattn's decode launches (split, and combine where there is one),
# FlashInfer's tensor-core decode (fi-fa2-tc: the prefill kernel and its merge) and XQA (fi-xqa)
# on 64 x 8192 p64 HND / NHD, 128 x 2048 p64 HND and 16 x 4096 p64 NHD: time, DRAM bytes and
# GB/s, DRAM % of peak, L2 hit rate, achieved occupancy, grid, registers, shared memory,
# instructions, global load sectors and the warp stall reasons; L2 flushed before every profiled
# kernel (ncu's --cache-control all), clocks locked to base (--clock-control base), so compare the
# implementations with each other, not with the benchmark's microseconds.
# FlashInfer's two modules (fa2 prefill primary D128, XQA p64 group 4) are compiled first (~60-90 s,
# MAX_JOBS=16); then a preflight (one tiny kernel: drops metric names this ncu lacks, stops early if
# ncu cannot read the counters), then 12 ncu runs of ~12-20 s (the first ~30-40 s: Triton compiles
# kvattn's kernels), shape by shape; the driver's budget (BUDGET_S, 290 s, the prebuild included)
# stops it before a run that would not fit, skipped runs listed in the JSON's not_run.
# Carry [".peers"] (~300 s). Files: env.txt, ncu-decode.json, ncu-decode.txt (the table),
# ncu-decode.err.xz (progress, prebuild log).
set -uo pipefail
source lab/probes/device_env.sh
{ command -v ncu && ncu --version | tail -n 1; } >> "$OUT/env.txt" 2>&1
BUDGET_S=${BUDGET_S:-290}
( source .peers/flashinfer/activate.sh
  export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
  timeout -k 15 $(( BUDGET_S + 45 )) python3 lab/probes/ncu_decode_compare.py --prebuild --budget "$BUDGET_S" \
    --json "$OUT/ncu-decode.json" ) 2> "$OUT/ncu-decode.err" | tee "$OUT/ncu-decode.txt"
tail -n 16 "$OUT/ncu-decode.err"
xz -9 "$OUT/ncu-decode.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
