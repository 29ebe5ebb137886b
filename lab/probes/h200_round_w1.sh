#!/usr/bin/env bash
# Two ready probes in one call (carry [".peers"], ~370 s): (1) lab/probes/mla_program_cost.py, the
# fixed cost of one MLA program against its per-tile cost, kvattn beside FlashInfer's fa3 MLA; (2) the
# grid plan's gated fitted chunk (lab/probes/grid_chunk_fitted_gated.patch) applied, then
# h200_round_x3.sh's tests and rows, the patch reversed, the same rows.
set -uo pipefail
source lab/probes/device_env.sh
( source .peers/flashinfer/activate.sh
  export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
  timeout ${COST_S:-150} python3 lab/probes/mla_program_cost.py --json "$OUT/program-cost.json" \
    2> "$OUT/program-cost.err" | tee "$OUT/program-cost.txt" )
xz -9 "$OUT/program-cost.err" 2>/dev/null
echo "program cost: $(( $(date +%s) - t0 )) s"
PATCH=lab/probes/grid_chunk_fitted_gated.patch
patch -p1 < "$PATCH" > /dev/null || exit 1
PATCH=$PATCH bash lab/probes/h200_round_x3.sh
