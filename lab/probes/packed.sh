#!/usr/bin/env bash
# packed.sh NAME SCRIPT...: the probe SCRIPTs one after another in one device call, each writing
# into /tmp/NAME (as its $OUT), all of it packed into $OUT/NAME.tar at the end: the device returns
# at most 8 files a call, and a few probes write more than that together.
set -uo pipefail
name=$1
shift
final=${OUT:-out}
mkdir -p "$final"
export OUT=/tmp/$name
mkdir -p "$OUT"
for script in "$@"; do
  bash "$script"
done
tar cf "$final/$name.tar" -C "$OUT" .
