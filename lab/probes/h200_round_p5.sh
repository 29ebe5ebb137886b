#!/usr/bin/env bash
# The decode grid and the whole sweep beside FlashInfer 0.7.2.post1 (prebuilt), graph replay, on
# the tree of h200_round_p4.sh. Carry [".peers"]. One call (~450 s).
set -uo pipefail
source lab/probes/device_env.sh
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
timeout ${GRID_S:-150} python3 benchmarks/run.py --suite decode --graph-only --fi-prebuild --no-flex --sdpa-backends "" \
  --out "$OUT/decode-grid.json" --md "$OUT/decode-grid.md" --time-budget $(( ${GRID_S:-150} - 30 )) 2> "$OUT/grid.err"
grep "^| " "$OUT/decode-grid.md" | grep -v "^|---" | tail -n 12 | cut -c1-200
echo "grid: $(( $(date +%s) - t0 )) s"
timeout ${SWEEP_S:-300} python3 benchmarks/run.py --suite sweep --fi-prebuild --graph-only --no-flex --sdpa-backends "" \
  --out "$OUT/sweep.json" --md "$OUT/sweep.md" --time-budget $(( ${SWEEP_S:-300} - 50 )) 2> "$OUT/sweep.err"
grep "^| " "$OUT/sweep.md" | grep -v "^|---" | tail -n 14 | cut -c1-200
xz -9 "$OUT/grid.err" "$OUT/sweep.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
