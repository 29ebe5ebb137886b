#!/usr/bin/env bash
# The GPU proof in one device call: the whole test suite with CUDA, `kvattn check`, then the
# benchmark of the suites given (default decode,single_decode). Logs go to $OUT (or ./out).
#   bash benchmarks/device_check.sh [SUITES] [BENCH_ARGS...]
# Stages can be skipped with SKIP_TESTS=1 / SKIP_CHECK=1 / SKIP_BENCH=1; TESTS="paths" narrows the
# test stage (default: the whole suite), PYTEST_ARGS replaces the default "-x".
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
suites=${1:-decode,single_decode}
shift || true
status=0
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } 2>&1 | tee "$OUT/env.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS--x} ${TESTS:-tests} 2>&1 | tee "$OUT/pytest.txt" | tail -n 15
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ -z "${SKIP_CHECK:-}" ]; then
  python3 -m kvattn.cli check 2>&1 | tee "$OUT/check.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  python3 benchmarks/run.py --suite "$suites" --out "$OUT/results.json" --md "$OUT/results.md" "$@" 2>"$OUT/bench.err"
  [ $? = 0 ] || status=1
  tail -n 5 "$OUT/bench.err"
fi
exit $status
