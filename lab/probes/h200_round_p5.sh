#!/usr/bin/env bash
# The decode grid and the whole sweep beside FlashInfer 0.7.2.post1 (prebuilt), graph replay, on
# the tree of h200_round_p4.sh. Carry [".peers"]. One call (~450 s).
set -uo pipefail
source lab/probes/device_env.sh
peer_rows decode-grid ${GRID_S:-150} decode
echo "grid: $(( $(date +%s) - t0 )) s"
peer_rows sweep ${SWEEP_S:-300} sweep
echo "done: $(( $(date +%s) - t0 )) s"
