#!/usr/bin/env bash
# h200_round_aa5.sh then h200_round_aa4.sh in one call (one machine start; their logs go into the
# same logs.tar): fp8 at three programs an SM on 128-key tiles, then sw12's lanes combine launch
# (its patch applied after the fp8 arms). No carry, ~360 s.
set -uo pipefail
bash lab/probes/h200_round_aa5.sh
bash lab/probes/h200_round_aa4.sh
