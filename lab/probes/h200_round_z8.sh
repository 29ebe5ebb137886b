#!/usr/bin/env bash
# MLA split counts of two and three waves (`waves=2`, `waves=3`) against one (the table's) on the
# 16-64-head rows still behind FlashInfer: one wave's programs of equal work end 5 us apart (the SMs'
# bandwidth shares; lab/notes/mla-program-ends.md "The phases of a program, timed"), and shorter
# splits should shrink that spread, at 18 KB more query a program at 16 heads. Session-era data on
# waves was 128 heads only (72 KB of query a program). No carry, ~120 s.
set -uo pipefail
source lab/probes/device_env.sh
mla_rows ab-mla-waves ${AB_S:-130} "mla bf16 Hq16 64x4096,mla bf16 Hq16 32x16384,mla bf16 Hq16 64x16384,mla bf16 Hq16 128x8192,mla bf16 Hq32 64x4096,mla bf16 Hq64 64x4096,sw66 ,sw70 ,sw74 ,sw77 " --ab w2:mla:waves=2 --ab w3:mla:waves=3
echo "done: $(( $(date +%s) - t0 )) s"
