#!/usr/bin/env bash
# Issue 39's same-run A/B (H200): main before the runtime move and the family reshaping (e5f67df)
# against main now, the quick decode / MLA / prefill grid, alternated twice
# (benchmarks/compare_trees.sh, kvattn only, CUDA-graph replay), then each tree's eager host time.
# The PTX of every production kernel configuration was compared on the CPU (lab/results/ptx/).
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev"]):
#   rm -rf .dev && mkdir -p .dev/old .dev/new
#   git archive e5f67df src benchmarks | tar -x -C .dev/old
#   git archive main src benchmarks | tar -x -C .dev/new
set -uo pipefail
source lab/probes/device_env.sh
RUN_ARGS="--quick --graph-only" OUT="$OUT/old-new" timeout ${TOTAL:-540} bash benchmarks/compare_trees.sh .dev/old .dev/new 2
tar -cJf "$OUT/old-new.tar.xz" -C "$OUT" old-new 2>/dev/null && rm -rf "$OUT/old-new/"*.log
echo "done: $(( $(date +%s) - t0 )) s"
