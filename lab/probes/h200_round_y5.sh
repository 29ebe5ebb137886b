#!/usr/bin/env bash
# The MLA grid and the sweep's MLA rows beside FlashInfer's fa3 MLA kernel (same run), on the tree
# with the balanced plan in one warp and bfloat16 partials for programs of 64 head rows.

# Carry [".peers"] (~240 s).
set -uo pipefail
source lab/probes/device_env.sh

peer_rows mla-peers ${PEER_S:-240} mla,sweep --filter mla
echo "done: $(( $(date +%s) - t0 )) s"
