#!/usr/bin/env bash
# Where 16-bit MLA partials lost (session r call 2: 64 x 4096 at 64 heads 107 -> 130 us graph): the
# per-kernel times (torch.profiler, eager, lab/probes/kernel_times.py) of the split kernel and the
# combine on four rows, float32 partials first, then with lab/probes/mla_16bit_partials.patch
# applied. A local sm_90a compile shows the seesaw's partial stores as many 4-byte stores as the
# 8-byte ones before (no spill, 168 registers either way) and the balanced combine at 768 SASS
# instructions and 27 barriers against 608 and 13: which launch carries the ~23 us? No carry (~120 s).
set -uo pipefail
source lab/probes/device_env.sh
rows=(--filter "Hq64 64x4096" --filter "Hq16 64x4096" --filter "Hq128 32x16384" --filter "sw77 ")
timeout 100 python3 lab/probes/kernel_times.py "${rows[@]}" --label f32 --json "$OUT/kt-f32.json" 2> "$OUT/kt-f32.err"
echo "f32: $(( $(date +%s) - t0 )) s"
patch -p1 --forward < lab/probes/mla_16bit_partials.patch || exit 1
timeout 100 python3 lab/probes/kernel_times.py "${rows[@]}" --label p16 --json "$OUT/kt-16bit.json" 2> "$OUT/kt-16bit.err"
tail -n 3 "$OUT/kt-f32.err" "$OUT/kt-16bit.err"
echo "done: $(( $(date +%s) - t0 )) s"
