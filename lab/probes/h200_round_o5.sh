#!/usr/bin/env bash
# Next (not run yet): the pages of sw12, sw07 and the grid's 16 x 4096 on pages of 64 read bare at 1-4
# programs an SM (lab/probes/paged_read_floor.py: the decode kernel's pipelined copies and products,
# no softmax, in equal shares), paged and contiguous: is ~26 GB/s an SM at two programs the loads'
# rate or the kernel's (lab/notes/decode-ragged-batches.md "sw12: the lanes' request cap measured,
# and where its time goes")? No carry, one call (~60 s).
set -uo pipefail
source lab/probes/device_env.sh
timeout 120 python3 lab/probes/paged_read_floor.py --filter "sw12 " --filter "sw07 " --filter "bf16 16x4096 p64 NHD" \
  --json "$OUT/paged-read.json" 2>&1 | grep -v Warn
echo "done: $(( $(date +%s) - t0 )) s"
