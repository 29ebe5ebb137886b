#!/usr/bin/env bash
# The long decode tiles by copy bandwidth an SM (plan change, configs.main_replaces_long): on an
# H200 the bf16 D128 launches that took the long tiles (128 keys, 8 warps, 3 stages) take the main
# table's (64, 4, 4), but for the spans of ragged one-KV-head launches past 16 x 512 keys (sw07,
# sw12). One call, same runs, kvattn only, CUDA-graph replay. First the device's bandwidth as the
# rule reads it. Then `kvattn` the new tree against `kvattn-old`, the previous rule (the bandwidth
# bound out of reach: the H100's launches), over the 22 of 100 rows whose launch changes on a faked
# H200 (lab/probes/decode_plan_rows.py) and six that must not (sw07, sw12 kept on the long tiles;
# sw33, sw52, 1x32768 p64 on the streaming tiles; 64x8192 p16 on the main tiles). Last, sw07 / sw12
# (and 64x8192 p16 8/1, an equal batch) on the main tiles as j5 timed them (`m`: a request capped at
# 16 units, sw07 not dealt) and with the merge at 4 partials a round (`mm`: the long tiles' units
# and cap, over two programs an SM; not measured before).
set -uo pipefail
source lab/probes/device_env.sh
python3 - <<'PY' 2>&1 | tee "$OUT/bandwidth.txt"
import torch
from kvattn.runtime import device
from kvattn.ops.decode import configs
dev = torch.device("cuda")
p = torch.cuda.get_device_properties(dev)
bw = device.memory_bandwidth(dev)
print(p.name, "SMs", p.multi_processor_count, "memory_clock_rate", getattr(p, "memory_clock_rate", None),
      "memory_bus_width", getattr(p, "memory_bus_width", None), "peak GB/s", round(bw / 1e9),
      "GB/s an SM", round(bw / 1e9 / p.multi_processor_count, 1),
      "main_replaces_long", configs.main_replaces_long("sm90", "bfloat16", 128, 16, False,
                                                      sm_count=p.multi_processor_count, bandwidth=bw))
PY
timeout ${AB_S:-150} python3 benchmarks/run.py --suite decode,sweep \
  --filter "sw03 ,sw05 ,sw06 ,sw10 ,sw16 ,sw27 ,sw28 ,sw40 ,sw46 ,sw51 ,sw59 ,sw07 ,sw12 ,sw33 ,sw52 ,bf16 16x4096 p16,bf16 16x4096 p64,bf16 64x8192 p64,bf16 128x2048 p64,8192] p64 ,bf16 64x8192 p16 NHD,bf16 1x32768 p64 NHD" \
  --graph-only --warmup 10 --rep 30 --no-peers --ab old:decode:long_max_sm_gbps=1000 \
  --out "$OUT/ab-long.json" --md "$OUT/ab-long.md" --time-budget $(( ${AB_S:-150} - 10 )) 2> "$OUT/ab-long.err"
grep "^| " "$OUT/ab-long.md" | grep -v "^| class\|^|---" | cut -c1-200
timeout ${MM_S:-50} python3 benchmarks/run.py --suite decode,sweep --filter "sw07 ,sw12 ,bf16 64x8192 p16 NHD h8/1" \
  --graph-only --warmup 10 --rep 30 --no-peers --ab m:decode:block_n=64,num_warps=4,num_stages=4 \
  --ab mm:decode:block_n=64,num_warps=4,num_stages=4,balance_merge_values=32 \
  --out "$OUT/ab-mm.json" --md "$OUT/ab-mm.md" --time-budget $(( ${MM_S:-50} - 10 )) 2> "$OUT/ab-mm.err"
grep "^| " "$OUT/ab-mm.md" | grep -v "^| class\|^|---" | cut -c1-200
xz -9 "$OUT/ab-long.err" "$OUT/ab-mm.err" 2>/dev/null
echo "done: $(( $(date +%s) - t0 )) s"
