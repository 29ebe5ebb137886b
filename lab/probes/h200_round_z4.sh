#!/usr/bin/env bash
# The first of two back-to-back calls (carry [".t371/a"]: the first part of the slim Triton 3.7.1
# wheel to /tmp for h200_round_z5.sh), and meanwhile page runs against the token offsets
# (`--ab runs0:decode:page_runs=0`) on the sweep rows that ran 1-3 % slower beside FlashInfer than
# in the last sweep before the runs (sw06 394 / 384 us, sw30, sw28, sw24, sw46, sw15), sw04 as the
# control (D 64 keeps its 128-key tiles: no runs, the same kernel), and sw41 / sw52 / sw00. ~150 s.
set -uo pipefail
source lab/probes/device_env.sh
mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/
kv_rows ab-runs-sweep ${AB_S:-140} "sw06 ,sw30 ,sw28 ,sw24 ,sw46 ,sw15 ,sw04 ,sw41 ,sw52 ,sw00 " --ab runs0:decode:page_runs=0
echo "done: $(( $(date +%s) - t0 )) s"
