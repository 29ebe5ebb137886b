#!/usr/bin/env bash
# The whole sweep beside FlashInfer (H200), one call: FlashInfer's modules for every sweep row
# prebuilt in their own build folders, then every row timed, kvattn and FlashInfer's kernels in
# the same run (why the prebuild: lab/notes/method.md "Method: FlashInfer's prebuild and the timed phase's compiles"); the
# report's per-class geometric means and worst ratios are issue 40's and 41's figures.
# Carry [".peers"] (FlashInfer 0.7.2.post1 staged by ../shared/peers/flashinfer/stage.sh).
# SEL narrows the rows (run.py --filter words, e.g. SEL="sw0,sw1,sw2") where one call does not hold them all.
set -uo pipefail
source lab/probes/device_env.sh
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
left=$(( ${TOTAL:-570} - $(date +%s) + t0 ))
timeout $left python3 benchmarks/run.py --suite sweep ${SEL:+--filter $SEL} --fi-prebuild --out "$OUT/sweep.json" \
  --md "$OUT/sweep.md" --time-budget $(( left - 100 )) 2> "$OUT/sweep.err"
tail -n 30 "$OUT/sweep.md"; grep -c "time budget spent" "$OUT/sweep.md"
xz -9 "$OUT/sweep.err"
echo "done: $(( $(date +%s) - t0 )) s"
