#!/usr/bin/env bash
# Second device call of round d (H200): the prefill fix's GPU tests (a query with padded rows), then
# the sweep suite beside FlashInfer (issue 40's geometric mean and worst row, issue 41's MLA rows).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
(timeout 200 python3 benchmarks/run.py --suite sweep --fi-prebuild-only > "$OUT/prebuild.txt" 2>&1) &
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider -n 4 \
  "tests/ops/prefill/test_gluon_ws.py::test_other_launches_keep_the_triton_kernel" \
  "tests/ops/prefill/test_gluon_ws.py::test_query_rows_copy_in_whole_pieces" \
  tests/test_fuzz.py -k "reproducer or keep_the_triton or whole_pieces" > "$OUT/pytest.txt" 2>&1
tail -n 5 "$OUT/pytest.txt"
echo "tests: $(( $(date +%s) - t0 )) s"
wait
tail -n 2 "$OUT/prebuild.txt"
left=$(( 330 - $(date +%s) + t0 ))
timeout $left python3 benchmarks/run.py --suite sweep --graph-only --no-flex --sdpa-backends "" \
  --out "$OUT/sweep.json" --md "$OUT/sweep.md" 2> "$OUT/sweep.err"
tail -n 40 "$OUT/sweep.err" | cut -c1-220
echo "done: $(( $(date +%s) - t0 )) s"
