#!/usr/bin/env bash
# Third device call of round e (H200): the few-item balanced launch against main, same run,
# alternated (benchmarks/compare_trees.sh): branch ragged-grid (a grid of at least one wave, the
# last-wave split counts, 32 units a request) and branch ragged-deal (the same, every batch's units
# dealt over exactly one wave), on the sweep rows they change or might
# (lab/notes/decode-ragged-batches.md) and the decode grid's ragged rows; then the deal branch's
# GPU tests while time remains.
# Before the call, here:
#   mkdir -p .dev/main .dev/ragged .dev/deal   (.dev/ in .git/info/exclude; carry [".dev"])
#   git archive main src benchmarks | tar -x -C .dev/main
#   git archive ragged-grid src benchmarks | tar -x -C .dev/ragged
#   git archive ragged-deal src benchmarks tests pyproject.toml | tar -x -C .dev/deal
set -uo pipefail
source lab/probes/device_env.sh
t0=$(date +%s)
ROWS="--filter sw07 --filter sw12 --filter sw09 --filter sw13 --filter sw04 --filter sw34 --filter sw52 --filter sw40 --filter sw16 --filter sw03"
for b in ragged deal; do
  RUN_ARGS="--suite sweep $ROWS --graph-only --warmup 10 --rep 30" SKIP_HOST=1 OUT="$OUT/sweep-$b" \
    bash benchmarks/compare_trees.sh .dev/main .dev/$b 2
  echo "sweep A/B $b: $(( $(date +%s) - t0 )) s"
done
RUN_ARGS="--suite decode --filter ragged --graph-only --warmup 10 --rep 30" SKIP_HOST=1 OUT="$OUT/grid-deal" \
  bash benchmarks/compare_trees.sh .dev/main .dev/deal 1
echo "grid A/B: $(( $(date +%s) - t0 )) s"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
[ $left -gt 30 ] && (cd .dev/deal && PYTHONPATH=src OMP_NUM_THREADS=1 timeout -s INT $left python3 -m pytest -q -rfE \
  -p no:cacheprovider -n 16 -m "not codegen" tests/ops/decode tests/ops/common tests/test_fuzz_classes.py \
  tests/runtime/test_fast_launch.py) > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 20
tar -cJf "$OUT/ab.tar.xz" -C "$OUT" sweep-ragged sweep-deal grid-deal 2>/dev/null && rm -rf "$OUT"/sweep-* "$OUT/grid-deal"
echo "done: $(( $(date +%s) - t0 )) s"
