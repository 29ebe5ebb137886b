#!/usr/bin/env bash
# Where an MLA program's time goes (lab/probes/mla_phase_times.py, the MLA analogue of
# benchmarks/timeline.py's decode timelines): the warp-specialised kernel's 16-bit form with
# %globaltimer / %clock64 stamps at its phases (entry, unit planned, copy warp start, first page
# ids, query staged, first score tile, loop end, rows stored, exit), on one-wave one-split batches
# at 16 / 64 / 128 heads and two split launches, beside the library kernel's graph time and with
# its output compared bitwise. No carry (~120-200 s: a compile per kernel form and head layout).
set -uo pipefail
source lab/probes/device_env.sh
timeout ${PROBE_S:-200} python3 lab/probes/mla_phase_times.py --json "$OUT/phase-times.json" \
  2> "$OUT/phase-times.err" | tee "$OUT/phase-times.txt"
tail -n 20 "$OUT/phase-times.err"
echo "done: $(( $(date +%s) - t0 )) s"
