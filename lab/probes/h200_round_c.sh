#!/usr/bin/env bash
# Third device call of the round (H200): the second call's failed tests after their fixes, the fuzz's
# prefill compile error replayed, `kvattn fuzz` on the GPU, and the decode rows beside FlashInfer.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$OUT/env.txt" 2>&1
SEL=(--suite decode --filter "64x8192 p16 NHD,128x2048 p16 NHD,256x1024 p16 NHD,ragged128x[1,8192] p16 NHD,ragged64x")
(timeout 200 python3 benchmarks/run.py "${SEL[@]}" --fi-prebuild-only > "$OUT/prebuild.txt" 2>&1) &
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout -s INT 150 python3 -m pytest -q -rfE -p no:cacheprovider -n 8 --junitxml="$OUT/junit.xml" \
  tests/ops/decode/test_single_draft_mask.py "tests/ops/mla/test_mtp.py::test_mla_mtp_heads_as_n" \
  "tests/runtime/test_call_cache_gpu.py::test_the_forms_table_runs" tests/ops/decode/test_decode.py -k "not interp" \
  > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 15
echo "tests: $(( $(date +%s) - t0 )) s"
timeout 60 python3 - > "$OUT/replay.txt" 2>&1 <<'PY'
import json, traceback
from kvattn.fuzz import replay
spec = json.load(open("lab/results/h200/2026-11-29/b-call2-fuzz_probe.json"))["failures"][0]["spec"]
for mode in ("plain", "graph"):
    try:
        replay(spec, mode=mode, device="cuda", mode_seed=1060411765)
    except BaseException:
        traceback.print_exc()
PY
tail -n 30 "$OUT/replay.txt"
echo "replay: $(( $(date +%s) - t0 )) s"
timeout 300 python3 -m kvattn fuzz --device cuda --seconds ${FUZZ_SECONDS:-190} --jobs 14 --shared-classes \
  --json "$OUT/fuzz.json" > "$OUT/fuzz.txt" 2>&1
tail -n 12 "$OUT/fuzz.txt"
echo "fuzz: $(( $(date +%s) - t0 )) s"
wait
left=$(( 462 - $(date +%s) + t0 ))
[ $left -gt 20 ] && timeout $left python3 benchmarks/run.py "${SEL[@]}" --graph-only --no-flex --sdpa-backends "" \
  --out "$OUT/bench_decode.json" --md "$OUT/bench_decode.md" 2> "$OUT/bench_decode.err"
tail -n 3 "$OUT/bench_decode.err"
echo "done: $(( $(date +%s) - t0 )) s"
