#!/usr/bin/env bash
# Per-kernel times (torch.profiler) of the MLA rows mla-balance slows and speeds, main vs mla-balance.
F=(--filter "mla bf16 Hq64 64x4096" --filter "mla bf16 Hq32 64x4096" --filter "mla fp8 Hq16 64x4096" --filter sw71 --filter sw75 --filter sw70 --filter sw77)
for t in main mlabal; do (cd .dev/$t && PYTHONPATH=src timeout 150 python3 ../../lab/probes/kernel_times.py "${F[@]}" --label $t --json $OUT/kt-$t.json) 2>&1 | grep -v Warning | tail -12; done
