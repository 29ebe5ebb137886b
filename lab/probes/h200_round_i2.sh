#!/usr/bin/env bash
# Second device call of round i (H200): the candidate branch (candidate-i: the Gluon MLA kernels
# over pages of 16 and 32, the MLA combine as a dependent launch, and whatever else it holds) on
# the GPU (and decode-hnd: launches of one program an SM take the last-wave split count): its MLA
# GPU tests, the suites whose MLA calls now take the Gluon kernels and the split rule's; a same-run
# A/B against main, one round, kvattn only (the sweep's MLA rows, the MLA grid's quick rows and
# the decode rows on HND pages; DECODE_TESTS="tests/ops/decode" where the candidate changes decode);
# then the candidate's MLA sweep rows beside FlashInfer's fa3 MLA.
# Before the call, here (.dev/ in .git/info/exclude; carry [".dev", ".peers"]):
#   rm -rf .dev && mkdir -p .dev/main .dev/cand
#   git archive main src benchmarks | tar -x -C .dev/main
#   git archive candidate-i | tar -x -C .dev/cand
set -uo pipefail
source lab/probes/device_env.sh
(cd .dev/cand && PYTHONPATH=src OMP_NUM_THREADS=1 timeout -s INT ${TESTS_S:-170} python3 -m pytest -q -rfE \
  -p no:cacheprovider -n 16 -m "not codegen" tests/ops/mla tests/test_return_lse.py tests/test_edge_calls.py \
  tests/runtime/test_call_cache_gpu.py ${DECODE_TESTS:-tests/ops/decode/test_hnd_plan.py tests/ops/decode/test_configs.py \
  tests/ops/decode/test_decode.py::test_few_long_requests_fill_the_last_wave}) > "$OUT/pytest-cand.txt" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest-cand.txt" | tail -n 20
echo "tests: $(( $(date +%s) - t0 )) s"
ROWS="mla,sw03,sw05,sw06,sw10,sw14,sw16"  # (mla: the sweep's MLA rows and the grid's quick ones)
RUN_ARGS="--suite sweep,mla --quick --filter $ROWS --graph-only --warmup 10 --rep 30" SKIP_HOST=1 OUT="$OUT/ab" \
  timeout ${AB_S:-170} bash benchmarks/compare_trees.sh .dev/main .dev/cand 1
python3 benchmarks/compare_runs.py "$OUT/ab" main cand > "$OUT/ab.md" 2>&1; cat "$OUT/ab.md"
echo "A/B: $(( $(date +%s) - t0 )) s"
left=$(( ${TOTAL:-560} - $(date +%s) + t0 ))
(cd .dev/cand && source ../../.peers/flashinfer/activate.sh && export PYTHONPATH=src:$PYTHONPATH MAX_JOBS=16 \
  && timeout $left python3 benchmarks/run.py --suite sweep --filter " mla " --fi-prebuild --out "$OUT/sweep-mla.json" \
  --md "$OUT/sweep-mla.md" --time-budget $(( left - 70 )) 2> "$OUT/sweep-mla.err"); tail -n 12 "$OUT/sweep-mla.err"
(cd "$OUT" && xz -9 pytest-cand.txt sweep-mla.err 2>/dev/null; tar -cJf ab.tar.xz ab pytest-cand.txt.xz sweep-mla.err.xz 2>/dev/null && rm -rf ab pytest-cand.txt.xz sweep-mla.err.xz)
echo "done: $(( $(date +%s) - t0 )) s"
