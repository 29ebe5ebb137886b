#!/usr/bin/env bash
# The second of two back-to-back calls (device_env.sh triton_371; the first, carry [".t371/a"]:
# mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/), this one carry [".t371/b"]:
# under Triton 3.7.1, every GPU test whose name holds "mla" (the warp-specialised kernel with its
# staged final rows and bfloat16 partials, the one-warp balanced plan, the folding combines) and
# the decode combine tests. ~200 s.
set -uo pipefail
source lab/probes/device_env.sh
triton_371 || exit 1
gpu_tests pytest-mla-371 ${TEST_S:-170} tests -k "mla or combine"
echo "done: $(( $(date +%s) - t0 )) s"
