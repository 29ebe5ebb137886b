#!/usr/bin/env bash
# One device call (H200) for the three branches prepared without a GPU: the MLA GPU tests of
# mla-balance (its balanced Gluon kernels never ran on a GPU), then a same-run A/B of main,
# ragged-deal2 and mla-balance (benchmarks/compare_trees.sh, three trees alternated, 2 rounds) on
# the decode sweep rows the deal and its small-batch rule change (lab/probes/h200_round_g1.sh's
# twelve) and the sweep's MLA rows sw64-sw79, the MLA grid's equal rows main against mla-balance,
# then the host-forms table of main and of host-speed (each tree's own host_time.py, forms in turn);
# ~560 s. ragged-deal2's GPU tests run in the next call, the merged tree's whole suite.
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev"]):
#   rm -rf .dev && mkdir -p .dev/main .dev/deal2 .dev/mlabal .dev/hostspeed
#   git archive main src benchmarks | tar -x -C .dev/main
#   git archive ragged-deal2 src benchmarks tests pyproject.toml | tar -x -C .dev/deal2
#   git archive mla-balance src benchmarks tests pyproject.toml | tar -x -C .dev/mlabal
#   git archive host-speed src benchmarks | tar -x -C .dev/hostspeed
set -uo pipefail
source lab/probes/device_env.sh
(cd .dev/mlabal && PYTHONPATH=src OMP_NUM_THREADS=1 timeout -s INT ${MLA_TESTS_S:-130} python3 -m pytest -q -rfE \
  -p no:cacheprovider -n 16 -m "not codegen" tests/ops/mla) > "$OUT/pytest-mla.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-mla.txt" | tail -n 20
echo "MLA tests: $(( $(date +%s) - t0 )) s"
DECODE=sw03,sw04,sw07,sw08,sw09,sw12,sw13,sw22,sw26,sw34,sw35,sw55
MLA=sw64,sw65,sw66,sw67,sw68,sw69,sw7
RUN_ARGS="--suite sweep --filter $DECODE,$MLA --graph-only --warmup 10 --rep 30" SKIP_HOST=1 OUT="$OUT/ab-sweep" \
  timeout ${AB_S:-230} bash benchmarks/compare_trees.sh .dev/main .dev/deal2 .dev/mlabal 2
echo "sweep A/B: $(( $(date +%s) - t0 )) s"
RUN_ARGS="--suite mla --filter 64x4096,128x8192 --graph-only --warmup 10 --rep 30" SKIP_HOST=1 OUT="$OUT/ab-mla-grid" \
  timeout ${GRID_S:-80} bash benchmarks/compare_trees.sh .dev/main .dev/mlabal 2
echo "MLA grid A/B: $(( $(date +%s) - t0 )) s"
for tree in main hostspeed; do  # (main's first: it compiles the forms' kernels, which host-speed shares)
  secs=$([ $tree = main ] && echo 100 || echo 60)
  (cd .dev/$tree && PYTHONPATH=src timeout $secs python3 benchmarks/host_time.py --forms-only --json "$OUT/forms-$tree.json") \
    > "$OUT/forms-$tree.txt" 2>&1
  tail -n 24 "$OUT/forms-$tree.txt"
done
# (the tables again from whatever rounds finished: a timeout ends compare_trees before its table)
python3 benchmarks/compare_runs.py "$OUT/ab-sweep" main deal2 mlabal > "$OUT/ab-sweep.md" 2>&1
python3 benchmarks/compare_runs.py "$OUT/ab-mla-grid" main mlabal > "$OUT/ab-mla-grid.md" 2>&1
cat "$OUT/ab-sweep.md" "$OUT/ab-mla-grid.md"
# (at most 8 files come back: the tables and forms as text, the rest in one archive)
(cd "$OUT" && tar -cJf ab.tar.xz $(ls -d ab-sweep ab-mla-grid forms-*.json pytest-*.txt 2>/dev/null) \
  && rm -rf ab-sweep ab-mla-grid forms-*.json pytest-*.txt)
echo "done: $(( $(date +%s) - t0 )) s"
