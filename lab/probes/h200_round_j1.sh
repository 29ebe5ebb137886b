#!/usr/bin/env bash
# Issue 39's same-run A/B (H200): main before the runtime move (e5f67df) against the new tree, the
# quick grid (decode, prefill, MLA), kvattn only, CUDA-graph replay, old then new (ROUNDS=2
# alternates them twice where the call has the time); then the new tree's forms table (host time of every call form against the call with `out`), and
# in the new tree MLA's splits of one tile pair on the seesaw (`kvattn`) against min_chunk 256
# (`kvattn-mc256`, the previous plan exactly) over the 38 MLA rows (lab/notes/mla-ragged.md "MLA:
# splits of one tile pair on the seesaw"), after sw77's and sw70's no-copies floors.
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev"]):
#   rm -rf .dev && mkdir -p .dev/old .dev/new
#   git archive e5f67df src benchmarks | tar -x -C .dev/old
#   git archive main src benchmarks | tar -x -C .dev/new     # (or candidate-j before its merge)
set -uo pipefail
source lab/probes/device_env.sh
RUN_ARGS="--quick --graph-only" SKIP_HOST=1 OUT="$OUT/old-new" timeout ${AB_S:-300} \
  bash benchmarks/compare_trees.sh .dev/old .dev/new ${ROUNDS:-1}
python3 benchmarks/compare_runs.py "$OUT/old-new" old new > "$OUT/old-new.md" 2>&1; cat "$OUT/old-new.md"
echo "A/B: $(( $(date +%s) - t0 )) s"
(cd .dev/new && PYTHONPATH=src timeout 60 python3 benchmarks/host_time.py \
  --forms-only --json "$OUT/host-forms.json") > "$OUT/host-forms.txt" 2>&1; cat "$OUT/host-forms.txt"
# sw77 (128 heads, pages of 16) and sw70 (32 heads, pages of 32) beside their no-copies floors:
# whether the copies over small pages are the 6-12 us the MLA launch model does not place.
for row in sw77 sw70; do (cd .dev/new && PYTHONPATH=src timeout 45 python3 benchmarks/tune_mla.py --sweep \
  --filter "$row " --variants default,ws_nocopies); done > "$OUT/mla-floors.txt" 2>&1; cat "$OUT/mla-floors.txt"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
(cd .dev/new && PYTHONPATH=src timeout $left python3 benchmarks/run.py --suite sweep,mla --filter mla --no-peers \
  --graph-only --warmup 10 --rep 30 --ab mc256:mla:min_chunk=256 --out "$OUT/ab-mc.json" --md "$OUT/ab-mc.md" \
  --time-budget $(( left - 30 )) 2> "$OUT/ab-mc.err"); tail -n 45 "$OUT/ab-mc.md"; xz -9 "$OUT/ab-mc.err"
(cd "$OUT" && tar -cJf old-new.tar.xz old-new 2>/dev/null && rm -rf old-new)
echo "done: $(( $(date +%s) - t0 )) s"
