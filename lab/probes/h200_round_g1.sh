#!/usr/bin/env bash
# First device call of round g (H200): branch ragged-deal2 (the deal over one wave of resident
# programs, except where configs.balance_min_span keeps the uniform launch: one wave of pieces no
# longer than the balanced plan's shortest unit) against main, same run, alternated
# (benchmarks/compare_trees.sh, 2 rounds), on the six rows of round f's A/B (sw03 sw04 sw07 sw09
# sw12 sw13) and six rows the rule sends back to a uniform launch (lab/notes/decode-ragged-batches.md
# "Small batches under the deal"): sw08 (bf16 5 ragged to 612, p16, streaming tiles), sw22 (fp8
# 2 x 1338, p64), sw26 (bf16 2 ragged to 1443, p16), sw34 (bf16 18 x 4281, p32, 8/1: main's launch
# exactly), sw35 (bf16 47 x 1156, p16 HND, 8/1), sw55 (bf16 4 log-normal to 3061, p32); then the
# branch's GPU tests while time remains (TOTAL, default 560 s).
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev"]):
#   mkdir -p .dev/main .dev/deal2
#   git archive main src benchmarks | tar -x -C .dev/main
#   git archive ragged-deal2 src benchmarks tests pyproject.toml | tar -x -C .dev/deal2
set -uo pipefail
source lab/probes/device_env.sh
ROWS="--filter sw03 --filter sw04 --filter sw07 --filter sw09 --filter sw12 --filter sw13"
ROWS="$ROWS --filter sw08 --filter sw22 --filter sw26 --filter sw34 --filter sw35 --filter sw55"
RUN_ARGS="--suite sweep $ROWS --graph-only --warmup 10 --rep 30" SKIP_HOST=1 OUT="$OUT/sweep-deal2" \
  timeout ${AB_SECONDS:-330} bash benchmarks/compare_trees.sh .dev/main .dev/deal2 2
echo "sweep A/B: $(( $(date +%s) - t0 )) s"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
[ $left -gt 30 ] && (cd .dev/deal2 && PYTHONPATH=src OMP_NUM_THREADS=1 timeout -s INT $left python3 -m pytest -q -rfE \
  -p no:cacheprovider -n 16 -m "not codegen" tests/ops/decode tests/ops/common tests/test_fuzz_classes.py \
  tests/runtime/test_fast_launch.py) > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 20
cp "$OUT/sweep-deal2/compare.md" "$OUT/ab-deal2.md" 2>/dev/null
tar -cJf "$OUT/ab.tar.xz" -C "$OUT" sweep-deal2 2>/dev/null && rm -rf "$OUT/sweep-deal2"
echo "done: $(( $(date +%s) - t0 )) s"
