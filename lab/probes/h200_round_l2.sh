#!/usr/bin/env bash
# fp8 decode with the keys in the products' M dim (KEYS_IN_M: S^T = K Q^T, O^T = V^T P^T on mma.sync
# N = 8), which the plan takes for fp8 caches with at most 8 query rows a KV head. Compile-only so far:
# sm_90a SASS of sw36 840 -> 657 instructions a 128-key tile (lab/notes/formats.md "Formats: where the
# fp8 decode loop's instructions go"). Same run, kvattn only, graph replay, every decode fp8 row of the
# grid and the sweep: the default (keys in M where taken) against `rows` (keys_in_m off: the padded
# 16-row tiles of today). Rows of 16 query rows a KV head take neither and should read level.
# Arm `offs` (candidate b, also compile-only): page_offsets off, i.e. the page ids carried and each
# row's 64-bit offset computed in the load layout, K and V apart (the default computes the offsets
# where the ids load and V takes K's: sw36 fp8 657 -> 549 SASS instructions a tile with keys in M,
# bf16 606 -> 541 a 64-key tile). Both arms in one run: the budget is shared, not doubled.
set -uo pipefail
source lab/probes/device_env.sh
kv_rows ab-keys-in-m ${AB_S:-110} "decode fp8" --ab rows:decode:keys_in_m=false --ab offs:decode:page_offsets=false
# The page offsets change the paged bf16 kernels too: the grid's bf16 rows and the sweep's bf16
# rows furthest behind FlashInfer, the same `offs` arm.
kv_rows ab-offs-bf16 ${BF_S:-100} \
  "decode bf16 16x4096,decode bf16 64x8192,decode bf16 128x2048,decode bf16 256x1024,8192] p16,sw07 ,sw12 ,sw54 ,sw57 ,sw43 ,sw33 ,sw10 ,sw09 ,sw00 " \
  --ab offs:decode:page_offsets=false
echo "done: $(( $(date +%s) - t0 )) s"
