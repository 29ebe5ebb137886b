# Sourced by the device scripts of lab/probes: $OUT made (default ./out), Python unbuffered, the
# checkout's src first on PYTHONPATH, t0 the script's start (seconds), and $OUT/env.txt naming the
# GPU, its driver and memory, torch, Triton and the checkout's commit.
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  git log --oneline -1 2>/dev/null; } > "$OUT/env.txt" 2>&1

# The device returns at most 8 files from $OUT: on exit, the logs and tables (.md, .err.xz, .txt.xz,
# unpack.txt) are added to one logs.tar (scripts run one after another add theirs), leaving the JSON
# records, env.txt and the test summaries loose.
pack_out() {
  ( cd "$OUT" && ls | grep -E '\.(md|xz)$|^unpack\.txt$' > .logs 2>/dev/null
    [ -s .logs ] && tar rf logs.tar -T .logs && xargs rm -f < .logs; rm -f .logs ) 2>/dev/null
  local n; n=$(ls "$OUT" | wc -l)
  [ "$n" -gt 8 ] && echo "warning: $n files in \$OUT, the device returns 8" >&2
  return 0
}
trap pack_out EXIT

# gpu_tests NAME SECONDS PATH...: the GPU tests under PATHs (16 workers, not the compile-only
# `codegen` ones) into $OUT/NAME.txt (xz), stopped by SIGINT after SECONDS so pytest still prints
# its summary; the failures and the count go to the console and $OUT/NAME-summary.txt.
gpu_tests() {
  local name=$1 secs=$2
  shift 2
  OMP_NUM_THREADS=1 timeout -s INT "$secs" python3 -m pytest -q -rfE -p no:cacheprovider -n 16 -m "not codegen" --durations=20 \
    "$@" > "$OUT/$name.txt" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|Interrupted" "$OUT/$name.txt" | tail -n 30 | tee "$OUT/$name-summary.txt"
  xz -9 "$OUT/$name.txt" 2>/dev/null
}

# suite_rows SUITES NAME SECONDS FILTER RUN_ARGS...: benchmarks/run.py over the SUITES rows whose ids
# hold a FILTER part, kvattn only (`--ab` arms among RUN_ARGS), CUDA-graph replay, within SECONDS;
# $OUT/NAME.json / .md, the rows to the console. kv_rows: the decode and sweep suites; mla_rows:
# the MLA and sweep suites.
suite_rows() {
  local suites=$1 name=$2 secs=$3 filter=$4
  shift 4
  timeout "$secs" python3 benchmarks/run.py --suite "$suites" --filter "$filter" --graph-only --warmup 10 --rep 30 \
    --no-peers "$@" --out "$OUT/$name.json" --md "$OUT/$name.md" --time-budget $(( secs - 12 )) 2> "$OUT/$name.err"
  grep "^| " "$OUT/$name.md" | grep -v "^| class\|^|---" | cut -c1-240
  xz -9 "$OUT/$name.err" 2>/dev/null
}
kv_rows() { suite_rows decode,sweep "$@"; }
mla_rows() { suite_rows mla,sweep "$@"; }

# patch_arms NAME PATCH SECONDS ROWS ROWS_FN: a change already in the tree against the tree without
# it, interleaved: ROWS_FN (kv_rows / mla_rows) over ROWS as arms NAME-new-1, NAME-old (PATCH
# reversed on the device's copy) and NAME-new-2, each within SECONDS.
patch_arms() {
  local name=$1 patch=$2 secs=$3 rows=$4 rows_fn=$5
  "$rows_fn" "$name-new-1" "$secs" "$rows"
  patch -R -p1 < "$patch" > /dev/null || return 1
  "$rows_fn" "$name-old" "$secs" "$rows"
  patch -p1 < "$patch" > /dev/null || return 1
  "$rows_fn" "$name-new-2" "$secs" "$rows"
}

# triton_371: in the second of two back-to-back calls (the first, carry [".t371/a"]:
#   mkdir -p /tmp/slimparts && cp .t371/a/slimpart.aa /tmp/slimparts/
# this one carry [".t371/b"]), the slim Triton 3.7.1 wheel joined, checked against .t371/b/sha and
# unpacked (benchmarks/triton_wheel.sh), first on PYTHONPATH; the versions appended to $OUT/env.txt.
triton_371() {
  mkdir -p .t371slim
  cat /tmp/slimparts/slimpart.aa .t371/b/slimpart.ab > .t371slim/triton-3.7.1-slim.tar.xz
  echo "$(cat .t371/b/sha)  .t371slim/triton-3.7.1-slim.tar.xz" | sha256sum -c - || return 1
  bash benchmarks/triton_wheel.sh unpack > "$OUT/unpack.txt" 2>&1 || { cat "$OUT/unpack.txt"; return 1; }
  export PYTHONPATH=/tmp/triton-site:src
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/env.txt"
}

# peer_rows NAME SECONDS SUITES RUN_ARGS...: benchmarks/run.py over SUITES beside FlashInfer's kernels
# (staged in .peers: carry [".peers"]; its modules prebuilt), no flex or SDPA peers, CUDA-graph replay,
# within SECONDS; $OUT/NAME.json / .md / .err.xz, the block's last rows to the console.
peer_rows() {
  local name=$1 secs=$2 suites=$3
  shift 3
  ( source .peers/flashinfer/activate.sh
    export PYTHONPATH=src:${PYTHONPATH:-} MAX_JOBS=16
    timeout "$secs" python3 benchmarks/run.py --suite "$suites" --graph-only --fi-prebuild --no-flex --sdpa-backends "" \
      "$@" --out "$OUT/$name.json" --md "$OUT/$name.md" --time-budget $(( secs - 40 )) 2> "$OUT/$name.err" )
  grep "^| " "$OUT/$name.md" | grep -v "^|---" | tail -n 14 | cut -c1-200
  xz -9 "$OUT/$name.err" 2>/dev/null
}
