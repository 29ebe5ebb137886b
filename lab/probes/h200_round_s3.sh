#!/usr/bin/env bash
# Where FlashInfer's fa3 MLA beats kvattn at 64 x 4096, 16-64 heads (1.06-1.09; session r): the
# per-kernel times (torch.profiler, eager, L2 not flushed; lab/probes/kernel_times.py --fi) of both
# libraries' calls on the same inputs: kvattn's split kernel and balanced combine against FlashInfer's
# kernel(s) (its persistent kernel merges after a grid sync, or a merge of its own). If FlashInfer's
# main kernel alone beats kvattn's split kernel, the gap is the split kernel (the persistent seesaw);
# if not, it is the merge and the launches. Carry [".peers"] (~200 s: the module build first).
set -uo pipefail
source lab/probes/device_env.sh
( source .peers/flashinfer/activate.sh
  export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
  timeout ${KT_S:-240} python3 lab/probes/kernel_times.py --fi --label kvattn \
    --filter "mla bf16 Hq16 64x4096" --filter "mla bf16 Hq32 64x4096" --filter "mla bf16 Hq64 64x4096" \
    --filter "mla bf16 Hq16 128x8192" --filter "sw70 " --filter "sw74 " --filter "sw77 " \
    --json "$OUT/kt-fi-mla.json" 2> "$OUT/kt-fi-mla.err" )
tail -n 5 "$OUT/kt-fi-mla.err"
xz -9 "$OUT/kt-fi-mla.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
