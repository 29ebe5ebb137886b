#!/usr/bin/env bash
# One device call (H200) for branch mla-balance (the balanced split of ragged MLA batches,
# lab/notes/mla-ragged.md "MLA: the balanced split (design)"): the MLA GPU tests, then a same-run
# A/B of main against the branch (benchmarks/compare_trees.sh, alternated) on the sweep's MLA rows
# sw64-sw79 (ragged: the ones the plan changes are those of 2+ splits) and the MLA grid's equal
# rows 64x4096 / 128x8192 (the plan's cost where it keeps the uniform split; the filter takes
# every head count of those two shapes, 16 and 128 among them).
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev"]):
#   mkdir -p .dev/main .dev/mlabal
#   git archive main src benchmarks | tar -x -C .dev/main
#   git archive mla-balance src benchmarks | tar -x -C .dev/mlabal
# PART=tests or PART=ab runs one half (two calls where one does not fit the 600 s of a call; the
# first A/B round of each tree compiles its kernels).
set -uo pipefail
source lab/probes/device_env.sh
PART=${PART:-all}
if [ "$PART" != ab ]; then
OMP_NUM_THREADS=1 PYTHONPATH=src timeout -s INT ${TESTS_S:-240} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests/ops/mla > "$OUT/pytest-mla.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-mla.txt" | tail -n 30
xz -9 "$OUT/pytest-mla.txt" 2>/dev/null
fi
if [ "$PART" != tests ]; then
RUN_ARGS="--suite sweep --filter sw64,sw65,sw66,sw67,sw68,sw69,sw7 --graph-only --warmup 10 --rep 30" \
  SKIP_HOST=1 OUT="$OUT/sweep-mla" timeout ${SWEEP_S:-200} bash benchmarks/compare_trees.sh .dev/main .dev/mlabal 2
RUN_ARGS="--suite mla --filter 64x4096,128x8192 --graph-only --warmup 10 --rep 30" \
  SKIP_HOST=1 OUT="$OUT/grid-mla" timeout ${GRID_S:-150} bash benchmarks/compare_trees.sh .dev/main .dev/mlabal 2
tar -cJf "$OUT/ab.tar.xz" -C "$OUT" sweep-mla grid-mla 2>/dev/null
fi
echo "done: $(( $(date +%s) - t0 )) s"
