#!/usr/bin/env bash
# h200_round_w6.sh without its GPU tests (the patch's MLA and common GPU tests passed in session w
# call 1): the gated fitted chunk (lab/probes/grid_chunk_fitted_gated.patch) against the bound, arms
# in the mirrored order fitted, bound, bound, fitted, so a linear drift (a GPU warming through the
# call) cancels in the pair means. No carry (~240 s).
set -uo pipefail
source lab/probes/device_env.sh
PATCH=lab/probes/grid_chunk_fitted_gated.patch
ROWS="sw66 ,sw67 ,sw68 ,sw69 ,sw70 ,sw74 ,sw75 ,sw77 ,sw78 ,bf16 Hq64 64x4096,bf16 Hq16 32x16384"
patch -p1 < "$PATCH" > /dev/null || exit 1
mla_rows mla-fitted-1 ${AB_S:-55} "$ROWS"
patch -R -p1 < "$PATCH" > /dev/null || exit 1
mla_rows mla-bound-1 ${AB_S:-55} "$ROWS"
mla_rows mla-bound-2 ${AB_S:-55} "$ROWS"
patch -p1 < "$PATCH" > /dev/null || exit 1
mla_rows mla-fitted-2 ${AB_S:-55} "$ROWS"
echo "done: $(( $(date +%s) - t0 )) s"
