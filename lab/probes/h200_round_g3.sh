#!/usr/bin/env bash
# The whole GPU suite under Triton 3.7.1 (issue 39: "green under Triton 3.6 and 3.7.1") in one
# device call: the wheel cut under the carry limit (benchmarks/triton_wheel.sh slim, here; carry
# [".t371slim"]), unpacked before the machine's Triton 3.6, then the suite as h200_round_e1.sh runs it.
set -uo pipefail
source lab/probes/device_env.sh
bash benchmarks/triton_wheel.sh unpack > "$OUT/unpack.txt" 2>&1 || { cat "$OUT/unpack.txt"; exit 1; }
cat "$OUT/unpack.txt"
export PYTHONPATH=/tmp/triton-site:src
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/env.txt"
OMP_NUM_THREADS=1 timeout -s INT $(( ${TOTAL:-560} - $(date +%s) + t0 - 20 )) python3 -m pytest -q -rfE -p no:cacheprovider \
  -n 16 --junitxml="$OUT/junit.xml" -m "not codegen" tests > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 40
xz -9 "$OUT/pytest.txt" "$OUT/junit.xml" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
