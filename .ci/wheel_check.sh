#!/usr/bin/env bash
# The wheel as a user gets it: built from this checkout (`pip wheel --no-deps`), installed into a
# fresh venv with --no-deps, imported and run from outside the checkout; prints the wheel's size.
# torch, triton and numpy are not installed again: the new venv sees the packages of the Python that
# runs this script through a path entry. (A .pth *line* adds that folder to sys.path without running
# the .pth files inside it, so an editable install of kvattn there cannot shadow the wheel.)
# Usage: bash .ci/wheel_check.sh            (PYTHON=... to pick the interpreter; default python)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" -m pip wheel --no-deps --wheel-dir "$tmp/dist" . >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
whl=$(ls "$tmp"/dist/kvattn-*.whl)
# (the listing goes to a file first: `grep -q` stops reading at its first match, and the listing
# process, writing on, would die of a broken pipe that pipefail reports as a failure)
"$py" -m zipfile -l "$whl" >"$tmp/listing.txt"
grep -q "kvattn/py.typed" "$tmp/listing.txt" || { echo "wheel_check: py.typed missing from $whl"; exit 1; }
# kvattn bench runs on the harness the package ships (kvattn.benchmarking), not on the repository's
grep -q "kvattn/benchmarking/timing.py" "$tmp/listing.txt" \
    || { echo "wheel_check: kvattn/benchmarking missing from $whl"; exit 1; }
for pkg in kvattn/_inputs/paged.py kvattn/distributed/context_parallel.py kvattn/runtime/c_launcher.py; do
    grep -q "$pkg" "$tmp/listing.txt" || { echo "wheel_check: $pkg missing from $whl"; exit 1; }
done

"$py" -m venv "$tmp/venv"
outer=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
inner=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$outer" >"$inner/_wheel_check_outer.pth"
"$tmp/venv/bin/python" -m pip install --no-deps --no-index --quiet "$whl"

cd "$tmp"
"$tmp/venv/bin/python" - "$tmp/venv" <<'PY'
import sys
import kvattn
assert kvattn.__file__.startswith(sys.argv[1]), f"kvattn imported from {kvattn.__file__}, not from the wheel"
print(f"wheel_check: import kvattn {kvattn.__version__} from {kvattn.__file__}")
PY
"$tmp/venv/bin/kvattn" --version
"$tmp/venv/bin/kvattn" check --help >/dev/null
"$tmp/venv/bin/kvattn" info --device cpu >/dev/null
"$tmp/venv/bin/kvattn" bench --device cpu --only single_decode --rep-ms 1 >/dev/null
echo "wheel_check: $(basename "$whl") $(stat -c %s "$whl") bytes ($(( $(stat -c %s "$whl") / 1024 )) KiB)"
