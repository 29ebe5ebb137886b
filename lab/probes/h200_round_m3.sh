#!/usr/bin/env bash
# The whole GPU suite under Triton 3.6 with the lanes plan of ragged batches (branch lanes, rebuilt
# on main as common.balance.lane_span: every program group a fixed share of the batch's tiles, the
# default) and the PAGING tuple; then the
# lanes plan against the dynamic deal (`--ab deal:decode:balance_lanes=false`) on every sweep row the
# faked H200 plan sends to the balanced launch (27 rows), the grid's ragged rows and two spec-decode
# rows, kvattn only, graph replay. One call, no carry.
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest ${TESTS_S:-330} tests
echo "tests: $(( $(date +%s) - t0 )) s"
ROWS="sw00 ,sw03 ,sw04 ,sw05 ,sw06 ,sw07 ,sw09 ,sw10 ,sw11 ,sw12 ,sw14 ,sw15 ,sw16 ,sw19 ,sw23 ,sw24 ,sw28 ,sw30 ,sw32 ,sw36 ,sw40 ,sw41 ,sw45 ,sw48 ,sw49 ,sw58 ,sw59 ,sw43 ,sw52 ,ragged128x,ragged64x"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
kv_rows ab-lanes $left "$ROWS" --ab deal:decode:balance_lanes=false
echo "done: $(( $(date +%s) - t0 )) s"
