#!/usr/bin/env bash
# The Gluon MLA kernels' balanced plan in one warp's registers (common/gluon_balance.py: the
# lengths vector replicated over the partition's warps, so its sums, maximum and scan are warp
# shuffles; the request's length taken from that vector instead of a second load): against the
# plan before (lab/probes/mla_plan_one_warp.patch reversed on the device's copy), arms new / old /
# new on the split and ragged MLA rows, kvattn only, graph replay; then the phase probe
# (lab/probes/mla_phase_times.py, with the `synced` stamp) on the new plan.
# sm_90a before / after (Triton 3.6, 64 x 4096-like balanced launch, BLOCK_B 64): the default
# partition's prologue 343 -> 329 instructions, 19 -> 0 BAR.SYNC, 11 -> 0 STS / LDS pairs.
# Predicted: `planned` of the split launches 1.31 -> ~0.5 us (the one-wave uniform plan's 0.45),
# graph time -0.5 to -1 us on the balanced rows, nothing on one-split rows. No carry (~300 s).
set -uo pipefail
source lab/probes/device_env.sh
ROWS="bf16 Hq16 64x4096,bf16 Hq32 64x4096,bf16 Hq64 64x4096,bf16 Hq128 32x16384,fp8 Hq16 64x4096,sw66 ,sw69 ,sw70 ,sw74 ,sw77 "
patch_arms mla lab/probes/mla_plan_one_warp.patch ${ARM_S:-95} "$ROWS" mla_rows || exit 1
echo "arms: $(( $(date +%s) - t0 )) s"
timeout ${PROBE_S:-60} python3 lab/probes/mla_phase_times.py --json "$OUT/phase-times.json" \
  2> "$OUT/phase-times.err" | tee "$OUT/phase-times.txt"
tail -n 5 "$OUT/phase-times.err"
rm -f "$OUT"/*.err.xz "$OUT"/mla-*.md
echo "done: $(( $(date +%s) - t0 )) s"
