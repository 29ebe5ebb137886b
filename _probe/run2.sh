#!/usr/bin/env bash
set -u
rm -rf _probe/bs1; mkdir -p _probe/bs1; cp -r src _probe/bs1/src
sed -i 's/            MERGE_BLOCK_S=min(next_power_of_2(splits), max(1, 512 \* cfg.num_warps \/\/ (merge_rows \* plan.head_dim))),/            MERGE_BLOCK_S=1,/' _probe/bs1/src/kvattn/ops/decode_launch.py
diff -r src/kvattn _probe/bs1/src/kvattn | grep -c "^[<>]"
for fl in "" "--noflush"; do
  echo "== src $fl"
  PYTHONPATH=src timeout 100 python3 benchmarks/timeline.py --filter "1x32768" --filter "L4096 NONE" --no-readers --reps 15 $fl 2>&1 | grep programs
done
echo "== bs1"
PYTHONPATH=.:src timeout 100 python3 -c "
import sys, pathlib; sys.argv=['timeline','--filter','1x32768','--filter','L4096 NONE','--no-readers','--reps','15']
import benchmarks.timeline as t
t.ROOT = pathlib.Path('_probe/bs1').resolve()
sys.exit(t.main())" 2>&1 | grep -i "programs\|error" | head
