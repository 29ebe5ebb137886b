#!/usr/bin/env bash
# Page runs against the token offsets (`--ab runs0:decode:page_runs=0`) again, twice, on the sweep's
# bf16 rows on pages of 32 (two runs a 64-key tile): sw06 ran 395.2 -> 400.1 us in call 4 (the only
# row slower of 34), sw41 281.6 -> 278.8. No carry, ~120 s.
set -uo pipefail
source lab/probes/device_env.sh
ROWS="sw06 ,sw41 ,sw14 ,sw34 ,sw38 ,sw43 ,sw55 ,sw57 ,sw27 "
kv_rows ab-runs-p32-1 ${AB_S:-70} "$ROWS" --ab runs0:decode:page_runs=0
kv_rows ab-runs-p32-2 ${AB_S:-70} "$ROWS" --ab runs0:decode:page_runs=0
echo "done: $(( $(date +%s) - t0 )) s"
