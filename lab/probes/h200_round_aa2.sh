#!/usr/bin/env bash
# Equal batches whose one wave of split programs leaves slots idle (sw16: 80 items x 3 splits on 264
# two-an-SM slots, 0.91 full; sw06: 114 x 2, 0.86): more splits through `waves` (4: sw16 13 splits,
# sw06 9, both then merged by the combine launch; 2: 6 and 4, balanced, the same fill), against the
# table, kvattn only, graph replay; controls whose split count the arms also move. No carry, ~120 s.
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-waves ${AB_S:-110} "sw16 ,sw06 ,sw10 ,sw03 ,sw36 ,bf16 16x4096 p64 NHD,bf16 64x8192 p16 NHD h8/1,sw19 " --ab w4:decode:waves=4 --ab w2:decode:waves=2
echo "done: $(( $(date +%s) - t0 )) s"
