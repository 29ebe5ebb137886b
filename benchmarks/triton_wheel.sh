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
#
# Or in ONE call: the wheel cut to what kvattn runs, packed under the carry limit (64 MiB):
#   bash benchmarks/triton_wheel.sh slim                # here, after split: .t371slim/*.tar.xz (~57 MiB)
#   bash benchmarks/triton_wheel.sh unpack              # on the device (carry [".t371slim"]), then as above
# The cut: the static CUPTI archives (profiler builds only), the Blackwell ptxas (sm_100+) and the
# copies pip makes of CUPTI's symlinks go; libtriton.so loses its debug sections (strip
# --strip-unneeded keeps the dynamic symbols Python loads it by: 441 -> 180 MB). Checked here with
# the same cut of the cp311 wheel: the sm_90a compile-only tests (ptxas included) pass.
set -euo pipefail
cmd=${1:?usage: triton_wheel.sh split [VERSION] | stage | install | slim | unpack}
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
  slim)
    wheel=/tmp/$(cat .t371/name)
    cat .t371/part-* > "$wheel"
    echo "$(cat .t371/sha256)  $wheel" | sha256sum -c -
    tree=$(mktemp -d)
    python3 -m zipfile -e "$wheel" "$tree"
    nv="$tree/triton/backends/nvidia"
    chmod +x "$nv"/bin/*  # (zipfile drops the mode bits)
    rm -f "$nv/bin/ptxas-blackwell" "$nv"/lib/cupti/*_static.a "$nv"/lib/cupti/libcupti.so.[0-9]*
    strip --strip-unneeded "$tree/triton/_C/libtriton.so"
    version=$(sed -n 's/^triton-\([0-9.]*\)-.*/\1/p' .t371/name)
    mkdir -p .t371slim
    tar -cf - -C "$tree" . | xz -9 -T2 > ".t371slim/triton-$version-slim.tar.xz"
    rm -rf "$tree" "$wheel"
    ls -l .t371slim
    ;;
  unpack)
    rm -rf "$site" && mkdir -p "$site"
    tar -xJf .t371slim/triton-*-slim.tar.xz -C "$site"
    PYTHONPATH="$site" python3 -c 'import triton; print("triton", triton.__version__, triton.__file__)'
    ;;
  *) echo "triton_wheel.sh: unknown command $cmd" >&2; exit 2 ;;
esac
