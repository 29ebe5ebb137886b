#!/usr/bin/env bash
# Probes s4 (fp8 decode at 64-key tiles and three programs an SM) and s3 (FlashInfer's fa3 MLA
# against kvattn per kernel; carry [".peers"]) in one call, outputs in s43.tar (~420 s).
exec bash lab/probes/packed.sh s43 lab/probes/h200_round_s4.sh lab/probes/h200_round_s3.sh
