#!/usr/bin/env bash
# Second device call of the round (H200): the whole GPU suite (16 workers, oracles on the GPU), a
# one-minute fuzz probe of the rate with 12 workers, then the closing benchmark beside FlashInfer
# (compiled in the background while the tests run): MLA 16 heads with the Triton kernel's 16-row
# programs as the A/B (`tri16`), MLA 32/64 heads and MTP, padded and ragged drafts, causal and
# bidirectional prefill, and the decode grid.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
source .peers/flashinfer/activate.sh
export PYTHONPATH=src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; git log -1 --format=%H 2>/dev/null; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
NOPEERS=(--graph-only --no-flex --sdpa-backends "")
SEL_1=(--suite mla --filter "Hq16")
SEL_2=(--suite mla,spec_decode,prefill --filter "Hq32,Hq64,q4 bf16,q8 bf16,ragged-drafts,4x2048x2048 p64,4x512x16384 p64")
SEL_3=(--suite decode --filter NHD)
(timeout 400 python3 benchmarks/run.py --suite mla,spec_decode,prefill,decode --filter "Hq16,Hq32,Hq64,q4 bf16,q8 bf16,4x2048x2048 p64,4x512x16384 p64,decode" --fi-prebuild-only > "$OUT/prebuild.txt" 2>&1) &
t0=$(date +%s)
OMP_NUM_THREADS=1 timeout -s INT ${TEST_TIMEOUT:-330} python3 -m pytest -q -rfE -p no:cacheprovider -n 16 \
  --junitxml="$OUT/junit.xml" tests > "$OUT/pytest.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.txt" | tail -n 30
echo "tests: $(( $(date +%s) - t0 )) s"
timeout 90 python3 -m kvattn fuzz --device cuda --seconds 55 --jobs 12 --json "$OUT/fuzz_probe.json" > "$OUT/fuzz_probe.txt" 2>&1
tail -n 4 "$OUT/fuzz_probe.txt"
python3 -c "import json; d=json.load(open('$OUT/fuzz_probe.json')); print({k: d.get(k) for k in ('calls','mismatches','errors','seconds')}, d.get('timing', {}).get('calls_per_second'))"
echo "fuzz probe: $(( $(date +%s) - t0 )) s"
wait
tail -n 2 "$OUT/prebuild.txt"
run() {  # label, seconds, run.py args
  local label=$1 secs=$2; shift 2
  local left=$(( 565 - $(date +%s) + t0 ))
  [ $left -lt 20 ] && { echo "skip $label"; return; }
  [ $secs -gt $left ] && secs=$left
  timeout $secs python3 benchmarks/run.py "$@" "${NOPEERS[@]}" --out "$OUT/bench_$label.json" --md "$OUT/bench_$label.md" 2> "$OUT/bench_$label.err"
  tail -n 2 "$OUT/bench_$label.err"; echo "bench $label: $(( $(date +%s) - t0 )) s"
}
run mla16 70 "${SEL_1[@]}" --ab tri16:mla:block_h=16
run rows 80 "${SEL_2[@]}"
run decode 200 "${SEL_3[@]}"
echo "done: $(( $(date +%s) - t0 )) s"
