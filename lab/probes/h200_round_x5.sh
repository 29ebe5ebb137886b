#!/usr/bin/env bash
# h200_round_w6.sh without its GPU tests (the patch's MLA and common GPU tests passed in session w
# call 1): the gated fitted chunk (lab/probes/grid_chunk_fitted_gated.patch) against the bound, arms
# in the mirrored order fitted, bound, bound, fitted, so a linear drift (a GPU warming through the
# call) cancels in the pair means. No carry (~240 s).
TEST_S=0 exec bash lab/probes/h200_round_w6.sh
