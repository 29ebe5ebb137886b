#!/usr/bin/env bash
# The seesaw's in-kernel merge (mla/kernels_gluon_ws.py MERGE: the last split of a request's head
# block and half to finish merges the partials, no combine launch; configs.MLAConfig.ws_merge), for
# uniform and balanced launches (a balanced one counts each request's units on the device), applied
# here to the device's copy of the tree from lab/probes/mla_ws_merge.patch. The rows it is for, 64 x
# 4096 at 16-64 heads (lab/notes/mla.md "MLA: 64 x 4096 at 16-64 heads, the seesaw's floors and the
# other kernels"), take the balanced split. First the merge's own GPU tests (test_gluon_ws.py, -k
# merge: uniform and balanced, bf16 and e4m3, graph replays leaving the counters at zero); then four
# arms, kvattn only, graph replay: `kvattn` (the patch's launches: merged in the kernel), `bcomb`
# (ws_merge=0: main's launches, the balanced or uniform combine), `umerge` (balance=0: the uniform
# launch, merged) and `ucomb` (balance=0, ws_merge=0); Hq128 64x4096 is one split (a control); then
# the rest of the MLA GPU tests. No carry (~330 s).
set -uo pipefail
patch -p1 --forward < lab/probes/mla_ws_merge.patch || exit 1
source lab/probes/device_env.sh
gpu_tests pytest-merge ${MERGE_S:-100} tests/ops/mla/test_gluon_ws.py -k merge
echo "merge tests: $(( $(date +%s) - t0 )) s"
secs=${AB_S:-120}
timeout "$secs" python3 benchmarks/run.py --suite mla,sweep \
  --filter "64x4096,sw65 ,sw66 ,sw70 ,sw74 ,sw77 " --graph-only --warmup 10 --rep 30 --no-peers \
  --ab bcomb:mla:ws_merge=0 --ab umerge:mla:balance=0 --ab ucomb:mla:balance=0,ws_merge=0 \
  --out "$OUT/ab-wsmerge.json" --md "$OUT/ab-wsmerge.md" --time-budget $(( secs - 12 )) 2> "$OUT/ab-wsmerge.err"
grep "^| " "$OUT/ab-wsmerge.md" | grep -v "^| class\|^|---" | cut -c1-260
xz -9 "$OUT/ab-wsmerge.err" 2>/dev/null
echo "ab: $(( $(date +%s) - t0 )) s"
gpu_tests pytest-mla ${MLA_S:-110} tests/ops/mla
echo "done: $(( $(date +%s) - t0 )) s"
