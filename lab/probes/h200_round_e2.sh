#!/usr/bin/env bash
# Second device call of round e (H200): issue 43's ten-minute differential fuzz run of the five
# public functions in every mode, workers sharing their kernel classes, with the compile log.
set -uo pipefail
source lab/probes/device_env.sh
KVATTN_FUZZ_COMPILE_LOG="$OUT/compiles.jsonl" timeout ${TOTAL:-570} python3 -m kvattn fuzz --device cuda \
  --seconds $(( ${TOTAL:-570} - 50 )) --jobs 12 --shared-classes --json "$OUT/fuzz.json" > "$OUT/fuzz.txt" 2>&1
echo "rc $?"; tail -n 30 "$OUT/fuzz.txt"
xz -9 "$OUT/compiles.jsonl" 2>/dev/null
