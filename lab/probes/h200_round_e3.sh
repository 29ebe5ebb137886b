#!/usr/bin/env bash
# Third device call of round e (H200): the few-item balanced launch (branch ragged-grid: a grid of
# at least one wave of resident programs, the last-wave split counts, 32 units a request) against
# main, same run, alternated (benchmarks/compare_trees.sh), on the sweep rows it changes or might
# (lab/notes/decode-ragged-batches.md) and the decode grid's ragged rows; then its GPU tests.
# Before the call, here:  git archive main src benchmarks | tar -x -C .dev/main ;
#                         git archive ragged-grid src benchmarks tests | tar -x -C .dev/ragged
# (.dev/ in .git/info/exclude; carry [".dev"]).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
t0=$(date +%s)
ROWS="--filter sw07 --filter sw12 --filter sw09 --filter sw13 --filter sw57 --filter sw34 --filter sw52 --filter sw40 --filter sw16 --filter sw03"
RUN_ARGS="--suite sweep $ROWS --graph-only --warmup 10 --rep 30" SKIP_HOST=1 OUT="$OUT/sweep" \
  bash benchmarks/compare_trees.sh .dev/main .dev/ragged 2
echo "sweep A/B: $(( $(date +%s) - t0 )) s"
RUN_ARGS="--suite decode --filter ragged --graph-only --warmup 10 --rep 30" SKIP_HOST=1 OUT="$OUT/grid" \
  bash benchmarks/compare_trees.sh .dev/main .dev/ragged 2
echo "grid A/B: $(( $(date +%s) - t0 )) s"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
(cd .dev/ragged && PYTHONPATH=src OMP_NUM_THREADS=1 timeout -s INT $left python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  -m "not codegen" tests/ops/decode tests/ops/common tests/test_fuzz_classes.py tests/runtime/test_fast_launch.py) \
  > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 20
tar -cJf "$OUT/ab.tar.xz" -C "$OUT" sweep grid 2>/dev/null && rm -rf "$OUT/sweep" "$OUT/grid"
echo "done: $(( $(date +%s) - t0 )) s"
