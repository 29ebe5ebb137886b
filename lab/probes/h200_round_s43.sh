#!/usr/bin/env bash
# Probes s3 (FlashInfer's fa3 MLA against kvattn per kernel; carry [".peers"]) and s4 (fp8 decode
# at 64-key tiles and three programs an SM) in one call, outputs packed into one tar (~420 s).
set -uo pipefail
FINAL=${OUT:-out}
mkdir -p "$FINAL"
export OUT=/tmp/s43out
bash lab/probes/h200_round_s4.sh
bash lab/probes/h200_round_s3.sh
tar cf "$FINAL/s43.tar" -C "$OUT" .
