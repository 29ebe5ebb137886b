#!/usr/bin/env bash
# Same-run comparison of two source trees (e.g. a commit and its parent, exported with
# `git archive <commit> src benchmarks | tar -x -C .dev/<name>`): each tree's own benchmarks/run.py
# (kvattn only, CUDA-graph replay; RUN_ARGS, default the quick grid), alternated A B A B .. so drift
# shows as the spread between a tree's rounds, then (unless SKIP_HOST=1) each tree's eager host
# time (benchmarks/profile_host.py); benchmarks/compare_runs.py prints the table.
#   [RUN_ARGS="--suite prefill --filter p16"] bash benchmarks/compare_trees.sh TREE_A TREE_B [TREE_C ...] [ROUNDS]
# (more than two trees: each against the first, all in the same rounds)
# (RUN_ARGS is split on spaces: a filter holding a space needs its own loop, as in RESULTS.md.)
# Outputs under $OUT (or ./out): <tree name>-r<round>.json, <tree name>-host.txt, compare.md
# (a tree's name: its folder's name).
set -uo pipefail
TREES=()
ROUNDS=2
for arg in "$@"; do
  if [[ $arg =~ ^[0-9]+$ ]]; then ROUNDS=$arg; else TREES+=("$arg"); fi
done
[ ${#TREES[@]} -ge 2 ] || { echo "compare_trees.sh: two trees or more" >&2; exit 2; }
OUT=${OUT:-out}
OUT=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
mkdir -p "$OUT"
HERE=$(pwd)
for r in $(seq 1 "$ROUNDS"); do
  for tree in "${TREES[@]}"; do
    name=$(basename "$(cd "$tree" && pwd)")
    # shellcheck disable=SC2086
    (cd "$tree" && PYTHONPATH=src PYTHONUNBUFFERED=1 timeout -s INT 240 python3 benchmarks/run.py ${RUN_ARGS:---quick} \
      --no-peers --no-check --out "$OUT/$name-r$r.json") > "$OUT/$name-r$r.log" 2>&1
    echo "$name round $r: rc $? ($(tail -n 1 "$OUT/$name-r$r.log"))"
  done
done
for tree in "${TREES[@]}"; do
  [ -n "${SKIP_HOST:-}" ] && break
  name=$(basename "$(cd "$tree" && pwd)")
  (cd "$tree" && PYTHONPATH=src timeout -s INT 120 python3 benchmarks/profile_host.py --calls 2000) > "$OUT/$name-host.txt" 2>&1
  echo "$name host time: rc $?"
done
names=()
for tree in "${TREES[@]}"; do names+=("$(basename "$(cd "$tree" && pwd)")"); done
python3 "$HERE/benchmarks/compare_runs.py" "$OUT" "${names[@]}" | tee "$OUT/compare.md"
