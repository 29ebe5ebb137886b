#!/usr/bin/env bash
# RoPE single decode at 64-key tiles on an H200 (lab/probes/rope_wide_tiles.patch: config
# rope_wide_block_n, configs._SM90_ROPE_WIDE, plan._Plan.__init__; the launches probe l4's `n64` arm
# timed, the same grid and splits, on the faked H200 plan; an H100's unchanged). Applied on the
# device's copy: the single-decode and graph GPU tests (RoPE at 64 keys, its TMA streaming launch
# at 4096 included), then the single-decode grid beside FlashInfer (prebuilt), graph replay.
# Predicted from l4 (same run, kvattn only): 4096 / 32768 / 131072 RoPE 32.2 / 176 / 669 -> 29.0 /
# 151 / 553 us; FlashInfer with RoPE in its kernel 154.4 / 556.9 (2026-11-29). Carry
# [".peers"] (~250 s). If it holds: land the patch, then the whole GPU suite (p4).
set -uo pipefail
patch -p1 --forward < lab/probes/rope_wide_tiles.patch || exit 1
source lab/probes/device_env.sh
gpu_tests pytest-single ${TEST_S:-120} tests/ops/decode/test_single_decode.py tests/ops/decode/test_graphs.py \
  tests/ops/decode/test_rope_wide_tiles.py
echo "tests: $(( $(date +%s) - t0 )) s"
peer_rows single-grid ${GRID_S:-130} single_decode
echo "done: $(( $(date +%s) - t0 )) s"
