#!/usr/bin/env bash
# Run kvattn on the GPU machine under another Triton than the machine's own (3.6): the wheel
# (Triton 3.7.1 is 198 MB, over what one device call carries) travels in parts, one per call,
# into an ignored folder of the checkout (.t371/), and waits in /tmp while the machine stays warm.
#
# Here (CPU machine), once:
#   bash benchmarks/triton_wheel.sh split [VERSION]     # downloads the cp312 wheel, splits it into .t371/
# On the device, one call per part, back to back (carry [".t371"] holding that part only):
#   bash benchmarks/triton_wheel.sh stage               # copies .t371/part-* to /tmp/triton-parts/
# then, in the last call:
#   bash benchmarks/triton_wheel.sh install             # joins, checks the sha256, pip install --target
#   export PYTHONPATH=/tmp/triton-site:src               # that Triton first, kvattn from the checkout
#   bash benchmarks/device_check.sh ...                  # or any command
set -euo pipefail
cmd=${1:?usage: triton_wheel.sh split [VERSION] | stage | install}
parts=/tmp/triton-parts
site=/tmp/triton-site
case "$cmd" in
  split)
    version=${2:-3.7.1}
    rm -rf .t371 && mkdir -p .t371/dl
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 -d .t371/dl "triton==$version"
    wheel=$(ls .t371/dl/*.whl)
    basename "$wheel" > .t371/name
    sha256sum "$wheel" | cut -d' ' -f1 > .t371/sha256
    split -b 50M -d "$wheel" .t371/part-
    rm -r .t371/dl
    ls -l .t371
    ;;
  stage)
    mkdir -p "$parts"
    cp .t371/name .t371/sha256 "$parts"/
    for p in .t371/part-*; do cp "$p" "$parts"/; echo "staged $(basename "$p")"; done
    ls -l "$parts"
    ;;
  install)
    [ -d .t371 ] && cp .t371/name .t371/sha256 .t371/part-* "$parts"/ 2>/dev/null || true
    wheel="$parts/$(cat "$parts/name")"
    cat "$parts"/part-* > "$wheel"
    echo "$(cat "$parts/sha256")  $wheel" | sha256sum -c -
    python3 -m pip install -q --no-deps --no-compile --no-cache-dir --target "$site" "$wheel"
    PYTHONPATH="$site" python3 -c 'import triton; print("triton", triton.__version__, triton.__file__)'
    ;;
  *) echo "triton_wheel.sh: unknown command $cmd" >&2; exit 2 ;;
esac
