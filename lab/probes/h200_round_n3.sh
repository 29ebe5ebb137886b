#!/usr/bin/env bash
# The whole GPU suite under Triton 3.6 on the lanes plan, then the streaming tiles against the main
# tiles (`--ab nostream:decode:stream_tiles=false`: the plan keeps launches of few items on the main
# table, where a ragged batch takes the lanes) on the sweep rows whose launch that changes (faked
# H200 plan), and two spec-decode rows. No carry, one call (~420 s).
set -uo pipefail
source lab/probes/device_env.sh
t0=$(date +%s)
export PYTHONPATH=src:${PYTHONPATH:-}
gpu_tests pytest ${TESTS_S:-340} tests
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-stream ${AB_S:-150} "sw01 ,sw08 ,sw26 ,sw33 ,sw34 ,sw35 ,sw38 ,sw52 ,sw54 ,sw55 ,sw57 ,sw43 ,sw31 " \
  --suite sweep --ab nostream:decode:stream_tiles=false
echo "done: $(( $(date +%s) - t0 )) s"
