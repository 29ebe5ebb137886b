#!/usr/bin/env bash
# Two-level merges of a balanced launch (kernel MERGE_GROUP, config balance_merge_group 8, the
# lanes' request cap 64 with them) against one level (balance_merge_group=0: the cap 32 as before)
# and against the groups at the old cap (balance_lanes_cap=32), kvattn only, graph replay, on every
# sweep row whose plan cuts a request into more than 8 units and the grid's ragged rows; then the
# grid's equal bf16 rows. No carry, ~150 s. (Run twice: the first form of the merge, with a call site a
# level, took a D 64 kernel from 168 registers to 214 and sw15 85 -> 98 us. Neither form is on main:
# lab/notes/decode-ragged-batches.md "Two-level merges".)
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-groups 230 "sw03 ,sw04 ,sw07 ,sw09 ,sw10 ,sw12 ,sw15 ,sw23 ,sw28 ,sw30 ,sw32 ,sw45 ,sw50 ,sw54 ,sw58 ,ragged64x,ragged128x[1,8192] p16 NHD,bf16 64x8192 p16 NHD,bf16 16x4096 p64 NHD,bf16 128x2048 p16 NHD" \
  --ab one:decode:balance_merge_group=0 --ab cap32:decode:balance_lanes_cap=32
echo "done: $(( $(date +%s) - t0 )) s"
