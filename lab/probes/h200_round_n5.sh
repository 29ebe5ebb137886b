#!/usr/bin/env bash
# After the lanes plan and the streaming tiles' split bound (configs.stream_split_limit): the whole
# sweep beside FlashInfer 0.7.2.post1 (Triton 3.6, graph replay), then the decode grid's rows whose
# launch the bound changes (1 x 32768) and the sweep's (sw33 / sw54 / sw57 / sw43) against the
# previous rule as an arm (`--ab stream:decode:stream_split_keys=0`). Carry [".peers"]. One call.
set -uo pipefail
source lab/probes/device_env.sh
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
timeout ${SWEEP_S:-300} python3 benchmarks/run.py --suite sweep --fi-prebuild \
  --out "$OUT/sweep.json" --md "$OUT/sweep.md" --time-budget $(( ${SWEEP_S:-300} - 60 )) 2> "$OUT/sweep.err"
grep "^| " "$OUT/sweep.md" | grep -v "^|---" | cut -c1-250
xz -9 "$OUT/sweep.err"
echo "sweep: $(( $(date +%s) - t0 )) s"
kv_rows ab-split-bound ${AB_S:-70} "1x32768 ,sw33 ,sw54 ,sw57 ,sw43 " --ab stream:decode:stream_split_keys=0
echo "done: $(( $(date +%s) - t0 )) s"
