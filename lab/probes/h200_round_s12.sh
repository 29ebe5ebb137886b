#!/usr/bin/env bash
# Probes s1 (decode lanes merged by the combine launch; the MHA rows at 3 stages) and s2 (the
# balanced MLA combine in 1-2 warps) in one call: the two patches touch different files and each
# arm names its own config field, so the other patch's presence leaves an arm's launches as they
# are. Outputs in s12.tar. No carry (~470 s).
exec bash lab/probes/packed.sh s12 lab/probes/h200_round_s1.sh lab/probes/h200_round_s2.sh
