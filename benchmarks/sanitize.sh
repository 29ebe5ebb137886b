#!/usr/bin/env bash
# compute-sanitizer over every kernel family, in one device call (well under 6 minutes on an H100):
# benchmarks/sanitize_driver.py makes one small call per kernel variant (decode one-split / split
# with the in-kernel merge / split with the combine launch / fp8 / spec-decode, xqa persistent,
# single decode plain / RoPE, MLA Triton / Gluon / warp-specialised Gluon (mbarriers, TMA),
# prefill Triton / warp-specialised Gluon, append, merge, the device-side clamps with extreme
# values, the batch-invariant mode), first without a tool (which also fills Triton's cache, so no
# tool run compiles), then under memcheck, racecheck and synccheck.
#   bash benchmarks/sanitize.sh [VARIANT_FILTER...]
# Logs and summary.txt (error count and time per tool) go to $OUT (or ./out). Per-tool time limits:
# SANITIZE_TIMEOUT_<TOOL> seconds (defaults below: 150 + 75 + 90 + 45 s, 6 minutes at worst; a
# tool cut short says TIMED OUT in the summary, and its log shows the variants it passed). Exit
# status: 0 when memcheck and synccheck report 0 errors, racecheck none in kvattn's code (its
# hazards on Triton's partition prologue and in the calibration kernels are counted apart:
# benchmarks/racecheck_triage.py), and the driver passes every variant.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
status=0
if [ -z "$CS" ]; then
  echo "compute-sanitizer: not found (PATH, /usr/local/cuda*/bin)" | tee -a "$SUMMARY"
  exit 2
fi
{ "$CS" --version | tail -n 1; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } \
  2>&1 | tee "$OUT/env.txt"

run_tool() {  # name, time limit, command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 10 -s INT "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local secs=$((SECONDS - t0))
  local fails
  fails=$(grep -c '^FAIL ' "$OUT/$name.log")
  local errs
  # memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck (--racecheck-report
  # analysis) with "RACECHECK SUMMARY: ... (N errors, M warnings)".
  errs=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$name.log" | tail -n 1)
  [ -n "$errs" ] || errs="(no ERROR SUMMARY line)"
  local ran
  ran=$(grep -c '^ok ' "$OUT/$name.log")
  { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && errs="$errs; TIMED OUT after ${limit}s"
  printf '%-10s %s | variants ok %s, failed %s | rc %s | %ss\n' "$name" "$errs" "$ran" "$fails" "$rc" "$secs" \
    | tee -a "$SUMMARY"
  grep -E '^(FAIL|=========.*(Invalid|Race|Barrier|hazard|Hazard|Error))' "$OUT/$name.log" | grep -v 'ERROR SUMMARY' \
    | sed -E 's/0x[0-9a-f]+/0x?/g' | sort | uniq -c | sort -rn \
    | head -n 15 | sed 's/^/    /' | tee -a "$SUMMARY"
  if [ "$rc" != 0 ]; then status=1; fi
  case "$name" in
    plain) ;;
    racecheck)  # its hazards sorted by place: only those in kvattn's code fail the run
      "${TRIAGE_PYTHON:-python3}" "$(dirname "$0")/racecheck_triage.py" "$OUT/$name.log" src benchmarks \
        | tee -a "$SUMMARY"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    *)
      echo "$errs" | grep -qE 'ERROR SUMMARY: 0 errors' || status=1 ;;
  esac
}

# The plain run: every variant passes and Triton's cache holds every kernel before the tools run.
run_tool plain "${SANITIZE_TIMEOUT_PLAIN:-150}" python3 benchmarks/sanitize_driver.py "$@"
# memcheck with PyTorch's caching allocator off: each tensor is an allocation of its own, so an
# access past a tensor is past an allocation, which memcheck sees.
run_tool memcheck "${SANITIZE_TIMEOUT_MEMCHECK:-75}" \
  env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$CS" --tool memcheck --print-limit 20 python3 benchmarks/sanitize_driver.py "$@"
run_tool racecheck "${SANITIZE_TIMEOUT_RACECHECK:-90}" \
  "$CS" --tool racecheck --racecheck-report analysis --print-limit 200 python3 benchmarks/sanitize_driver.py "$@"
run_tool synccheck "${SANITIZE_TIMEOUT_SYNCCHECK:-45}" \
  "$CS" --tool synccheck --print-limit 20 python3 benchmarks/sanitize_driver.py "$@"
echo "---"
grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT"/memcheck.log "$OUT"/racecheck.log "$OUT"/synccheck.log 2>/dev/null
exit $status
