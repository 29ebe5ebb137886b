#!/usr/bin/env bash
# The lanes plan (a ragged batch in lanes, a batch found uniform dealt, one loop): probe m4's run
# again (decode and common GPU tests, then the whole sweep beside FlashInfer with the dynamic deal
# as the `kvattn-deal` arm). Carry [".peers"]. One call.
exec bash "$(dirname "$0")/h200_round_m4.sh"
