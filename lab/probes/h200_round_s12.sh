#!/usr/bin/env bash
# Probes s1 (decode lanes merged by the combine launch; the MHA rows at 3 stages) and s2 (the
# balanced MLA combine in 1-2 warps) in one call: the two patches touch different files and each
# arm names its own config field, so the other patch's presence leaves an arm's launches as they
# are. Their outputs are packed into one tar (the device returns at most 8 files). No carry (~470 s).
set -uo pipefail
FINAL=${OUT:-out}
mkdir -p "$FINAL"
export OUT=/tmp/s12out
bash lab/probes/h200_round_s1.sh
bash lab/probes/h200_round_s2.sh
tar cf "$FINAL/s12.tar" -C "$OUT" .
