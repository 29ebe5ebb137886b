#!/usr/bin/env bash
# Issue 39's same-run A/B (H200): main before the runtime move (e5f67df) against main now, the
# quick grid (decode, prefill, MLA), kvattn only, CUDA-graph replay, alternated old new old new;
# then the forms table of main now (host time of every call form against the call with `out`).
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev"]):
#   rm -rf .dev && mkdir -p .dev/old .dev/new
#   git archive e5f67df src benchmarks | tar -x -C .dev/old
#   git archive main src benchmarks | tar -x -C .dev/new
set -uo pipefail
source lab/probes/device_env.sh
t0=$(date +%s)
RUN_ARGS="--quick --graph-only" SKIP_HOST=1 OUT="$OUT/old-new" timeout ${AB_S:-440} \
  bash benchmarks/compare_trees.sh .dev/old .dev/new ${ROUNDS:-2}
python3 benchmarks/compare_runs.py "$OUT/old-new" old new > "$OUT/old-new.md" 2>&1; cat "$OUT/old-new.md"
echo "A/B: $(( $(date +%s) - t0 )) s"
(cd .dev/new && PYTHONPATH=src timeout $(( ${TOTAL:-560} - $(date +%s) + t0 )) python3 benchmarks/host_time.py \
  --forms-only --json "$OUT/host-forms.json") > "$OUT/host-forms.txt" 2>&1; cat "$OUT/host-forms.txt"
(cd "$OUT" && tar -cJf old-new.tar.xz old-new 2>/dev/null && rm -rf old-new)
echo "done: $(( $(date +%s) - t0 )) s"
