#!/usr/bin/env bash
# The second of two back-to-back calls (device_env.sh triton_371; the first, carry [".t371/a"]:
# mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/), this one carry [".t371/b"]:
# under Triton 3.7.1, the single-decode GPU tests on the tree whose RoPE launches take 64-key tiles
# and whose one-row contiguous tiles run 2 stages on an H200, then the single-decode grid (kvattn
# only, graph replay). Outputs packed into one tar (~200 s).
set -uo pipefail
FINAL=${OUT:-out}
mkdir -p "$FINAL"
export OUT=/tmp/v2out
source lab/probes/device_env.sh
triton_371 || exit 1
gpu_tests pytest-single-371 ${TEST_S:-130} tests/ops/decode/test_single_decode.py tests/ops/decode/test_graphs.py \
  tests/ops/decode/test_rope_wide_tiles.py tests/ops/decode/test_one_row_stages.py
echo "tests: $(( $(date +%s) - t0 )) s"
timeout 60 python3 benchmarks/run.py --suite single_decode --graph-only --warmup 10 --rep 30 --no-peers \
  --out "$OUT/single-371.json" --md "$OUT/single-371.md" --time-budget 50 2> "$OUT/single-371.err"
grep "^| " "$OUT/single-371.md" | grep -v "^| class\|^|---" | cut -c1-200
tar cf "$FINAL/v2.tar" -C "$OUT" .
echo "done: $(( $(date +%s) - t0 )) s"
