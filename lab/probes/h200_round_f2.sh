#!/usr/bin/env bash
# Second device call of round f (H200): branch ragged-deal (a balanced grid of one wave of
# resident programs, last-wave split counts, every batch's units dealt over exactly that wave)
# against main, same run, alternated (benchmarks/compare_trees.sh), on the sweep rows it should
# change (lab/notes/decode-ragged-batches.md).
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev"]):
#   mkdir -p .dev/main .dev/deal
#   git archive main src benchmarks | tar -x -C .dev/main
#   git archive ragged-deal src benchmarks | tar -x -C .dev/deal
set -uo pipefail
source lab/probes/device_env.sh
RUN_ARGS="--suite sweep --filter sw07 --filter sw12 --filter sw09 --filter sw13 --filter sw04 --filter sw03 --graph-only --warmup 10 --rep 30" \
  SKIP_HOST=1 OUT="$OUT/sweep-deal" timeout ${TOTAL:-200} bash benchmarks/compare_trees.sh .dev/main .dev/deal 2
tar -cJf "$OUT/ab.tar.xz" -C "$OUT" sweep-deal 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
