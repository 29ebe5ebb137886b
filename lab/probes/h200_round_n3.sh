#!/usr/bin/env bash
# The whole GPU suite under Triton 3.6 on the lanes plan, then the streaming tiles against the main
# tiles (the `nostream` arm: the plan keeps launches of few items on the main table, where a ragged
# batch takes the lanes; it ran as `stream_tiles=false`, a field `stream_split_keys=1` replaced) on
# the sweep rows whose launch that changes (faked H200 plan), and two spec-decode rows. No carry,
# one call (~420 s).
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest ${TESTS_S:-340} tests
echo "tests: $(( $(date +%s) - t0 )) s"
kv_rows ab-stream ${AB_S:-150} "sw01 ,sw08 ,sw26 ,sw33 ,sw34 ,sw35 ,sw38 ,sw52 ,sw54 ,sw55 ,sw57 ,sw43 ,sw31 " \
  --suite sweep --ab nostream:decode:stream_split_keys=1
echo "done: $(( $(date +%s) - t0 )) s"
