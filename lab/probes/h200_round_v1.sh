#!/usr/bin/env bash
# Single decode on the tree whose RoPE launches take 64-key tiles and whose one-row contiguous tiles
# run 2 stages on an H200 (configs._SM90_ROPE_WIDE, configs._SM90_CONTIG_PIPELINED_STAGES): their
# GPU tests, then the single-decode grid beside FlashInfer (prebuilt), graph replay. Predicted from
# probe u3 (same run): NONE 32768 / 131072 142.9 / 519.8 -> 137.3 / 494.9 us; RoPE from u1 151 / 590
# (l4: 553). Carry [".peers"] (~120 s).
set -uo pipefail
source lab/probes/device_env.sh
gpu_tests pytest-single ${TEST_S:-120} tests/ops/decode/test_single_decode.py tests/ops/decode/test_graphs.py \
  tests/ops/decode/test_rope_wide_tiles.py tests/ops/decode/test_one_row_stages.py
echo "tests: $(( $(date +%s) - t0 )) s"
peer_rows single-grid ${GRID_S:-130} single_decode
echo "done: $(( $(date +%s) - t0 )) s"
