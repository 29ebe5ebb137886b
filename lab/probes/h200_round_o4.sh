#!/usr/bin/env bash
# Session o, call 4: the MLA grid (16 / 32 / 64 / 128 heads, bf16 and fp8, Q 1 / 2 / 4) and the
# sweep's MLA rows beside FlashInfer 0.7.2.post1's fa3 MLA (prebuilt), graph replay, after the fp8
# 16-head rule by span and the balanced combine's narrow rounds. Carry [".peers"]. One call (~300 s).
set -uo pipefail
source lab/probes/device_env.sh
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
timeout ${MLA_S:-300} python3 benchmarks/run.py --suite mla,sweep --filter "mla " --graph-only --fi-prebuild --no-flex \
  --sdpa-backends "" --out "$OUT/mla.json" --md "$OUT/mla.md" --time-budget $(( ${MLA_S:-300} - 40 )) 2> "$OUT/mla.err"
grep "^| " "$OUT/mla.md" | grep -v "^|---" | cut -c1-230
xz -9 "$OUT/mla.err"
echo "done: $(( $(date +%s) - t0 )) s"
