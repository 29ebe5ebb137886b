#!/usr/bin/env bash
# Where sw07's time goes (and sw12's, sw54's, sw57's: the bf16 sweep rows still furthest behind
# FlashInfer): per-program and per-unit timelines of their decode launches from the instrumented
# copy of the decode kernels (benchmarks/timeline.py; %globaltimer / %smid stamps: each program's
# start, end and SM, each dealt unit's request, chunk, claim and store, each request's in-kernel
# merge). kvattn only, no peers, CUDA-graph replay with L2 flushed, 20 replays a row; each row's
# graph time with the library's kernel and with the instrumented one beside (what the stamps cost).
# Planned on the CPU (lab/notes/decode-ragged-batches.md "Timelines of the balanced rows: the plan
# on the CPU"): sw07 392 units of <= 2688 keys over 264 programs, sw12 166 units over 264; sw54 and
# sw57 keep the uniform split (streaming tiles). Budget: < 90 s on an H200 (4 rows, ~6 compiles).
set -uo pipefail
source lab/probes/device_env.sh
timeout ${TL_S:-80} python3 benchmarks/timeline.py --sweep --filter "sw07 ,sw12 ,sw54 ,sw57 " --no-readers \
  --reps 20 --rep-ms 30 --out "$OUT/timeline.json" > "$OUT/timeline.txt" 2> "$OUT/timeline.err"
echo "timeline rc $?: $(( $(date +%s) - t0 )) s"
cut -c1-400 "$OUT/timeline.txt"
tail -n 5 "$OUT/timeline.err" | cut -c1-300
echo "done: $(( $(date +%s) - t0 )) s"
