#!/usr/bin/env bash
# The MLA floor without the combine launch (lab/probes/mla_no_combine_floor.patch: config
# floor_no_combine, a plan field, so the padded programs and the seesaw's plan stay; the split
# launch alone, its partials left unmerged: the arm's check column is meaningless). Per kernel the
# split kernel runs within 0-4 % of FlashInfer's whole fa3 MLA kernel (lab/notes/mla-ragged.md
# "Where FlashInfer's lead is"); this is the graph-replay time a merge inside the split launch
# could reach at best (its own merge cost on top), against FlashInfer's 98.6 / 93.5 / 91.7 us at
# 64 x 4096, 64 / 32 / 16 heads (session o). Arm `nocomb` on the rows with a combine. No carry (~90 s).
set -uo pipefail
patch -p1 --forward < lab/probes/mla_no_combine_floor.patch || exit 1
source lab/probes/device_env.sh
mla_rows ab-nocombine ${AB_S:-90} "64x4096,32x16384,sw66 ,sw70 ,sw74 ,sw77 ,sw69 " \
  --ab nocomb:mla:floor_no_combine=true
echo "done: $(( $(date +%s) - t0 )) s"
