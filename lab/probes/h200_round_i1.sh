#!/usr/bin/env bash
# First device call of round i (H200): issue 43's differential fuzz run on the final tree, alone on
# the machine (12 workers, 290 s: ~32,000 calls at round f's 110 calls a second; round h's run
# beside a FlashInfer compile made 18,640 in 225 s), then issue 39's same-run A/B, one round:
# main before the runtime move (e5f67df) against main now, the quick grid (decode, prefill, MLA:
# its equal 64 x 4096 rows also check the balanced combine's narrow tile), kvattn only.
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev"]):
#   rm -rf .dev && mkdir -p .dev/old .dev/new
#   git archive e5f67df src benchmarks | tar -x -C .dev/old
#   git archive main src benchmarks | tar -x -C .dev/new
set -uo pipefail
source lab/probes/device_env.sh
export PYTHONPATH=src:${PYTHONPATH:-}
t0=$(date +%s)
KVATTN_FUZZ_COMPILE_LOG="$OUT/compiles.jsonl" timeout ${FUZZ_S:-300} python3 -m kvattn fuzz --device cuda \
  --seconds $(( ${FUZZ_S:-300} - 10 )) --jobs 12 --shared-classes --json "$OUT/fuzz.json" 2>&1 \
  | grep -v "UserWarning\|capture_end()" > "$OUT/fuzz.txt"
echo "fuzz at $(( $(date +%s) - t0 )) s"; tail -n 20 "$OUT/fuzz.txt"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
RUN_ARGS="--quick --graph-only" SKIP_HOST=1 OUT="$OUT/old-new" timeout $left bash benchmarks/compare_trees.sh .dev/old .dev/new 1
python3 benchmarks/compare_runs.py "$OUT/old-new" old new > "$OUT/old-new.md" 2>&1; cat "$OUT/old-new.md"
(cd "$OUT" && xz -9 compiles.jsonl 2>/dev/null; tar -cJf old-new.tar.xz old-new compiles.jsonl.xz 2>/dev/null \
  && rm -rf old-new compiles.jsonl.xz)
echo "done: $(( $(date +%s) - t0 )) s"
