#!/usr/bin/env bash
# The sweep's worst decode rows and the grid's, beside FlashInfer once more (a second same-run
# sample of the ratios at the 1.05 / 1.00 bounds after the lanes combine launch landed): sw12, sw06,
# sw16, sw36, sw48, bf16 16 x 4096 p64 (both layouts), the equal 64 x 8192 p16 8/1. Carry .peers,
# ~300 s with FlashInfer's compiles.
set -uo pipefail
source lab/probes/device_env.sh
peer_rows edge-rows ${PEER_S:-280} decode,sweep --filter "sw12 ,sw06 ,sw16 ,sw36 ,sw48 ,16x4096 p64,64x8192 p16 NHD h8/1"
echo "done: $(( $(date +%s) - t0 )) s"
