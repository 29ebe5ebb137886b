r"""Nsight Compute on kvattn's paged decode kernels and FlashInfer's, on the same benchmark rows.

Why FlashInfer's fa2 tensor-core decode reads ~2-3 % faster than kvattn on large equal bf16
batches: for each shape and implementation (kvattn; FlashInfer's kernels as
``benchmarks/peers_flashinfer.py`` calls them), one ``ncu`` process runs
``benchmarks/ncu_decode.py`` and profiles the kernels of its last ``--calls`` calls (those inside
its NVTX range; the warm-up calls, compiles, plans and input fills are outside it), further
narrowed to the implementation's attention and merge kernels by name (:data:`KERNEL_FILTERS`;
``--all-kernels`` keeps every kernel of the range). Metrics: :data:`METRICS`.

Measurement conditions (stated in the JSON's ``settings``): ncu's ``--cache-control all`` flushes
every cache, L2 included, before each profiled kernel and each of its replay passes, so every
kernel reads its pages from DRAM as in the benchmark's L2-flushed timing; ``--clock-control base``
(ncu's default) locks the clocks to base, so times are longer than the benchmark's boosted ones:
compare implementations with each other, not with ``benchmarks/run.py``'s microseconds.

Output: ``--json`` per (shape, implementation, kernel) the metrics (means over the profiled
launches, base units: bytes, ns, %), each launch's time and derived values; a table on stdout
(shape, impl, kernel, time, DRAM read MB, DRAM GB/s = bytes read + written over the kernel's time,
DRAM % of peak, L2 hit %, achieved occupancy, grid, registers, shared memory, instructions, top
stall reasons); progress on stderr. An implementation that fails is recorded with its error and
the next one runs; ``--budget`` seconds (everything, the prebuild included) stops the loop cleanly
before a run that would not fit. A preflight profiles one tiny kernel first: it drops metric
names and print flags this ncu does not know (recorded as ``dropped``) and stops early when ncu
cannot profile at all (e.g. ERR_NVGPUCTRPERM).

Usage (on the device, from the repository root; FlashInfer staged in .peers, carry [".peers"];
``lab/probes/h200_round_y6.sh`` is the device call)::

    source .peers/flashinfer/activate.sh
    PYTHONPATH=src:$PYTHONPATH python3 lab/probes/ncu_decode_compare.py --prebuild --budget 300 \
        --json out/ncu-decode.json
    python3 lab/probes/ncu_decode_compare.py --dry-run        # the ncu command lines (no GPU)
    python3 lab/probes/ncu_decode_compare.py --shape "decode bf16 64x8192 p16 NHD" --impls kvattn,fi-fa2-tc
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

from benchmarks import ncu_decode  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path("benchmarks") / "ncu_decode.py"  # relative: the runs' cwd is ROOT

DEFAULT_SHAPES = (
    "decode bf16 64x8192 p64 HND",
    "decode bf16 64x8192 p64 NHD",
    "decode bf16 128x2048 p64 HND",
    "decode bf16 16x4096 p64 NHD",
)
# FlashInfer's best peers on these rows: the tensor-core decode (fa2) and XQA.
DEFAULT_IMPLS = ("kvattn", "fi-fa2-tc", "fi-xqa")

# ncu --kernel-name regexes (searched in the kernel's function name, ncu's default name base), per
# implementation: its attention kernel and the merge launch that follows a split one. kvattn:
# decode/kernels.py decode_split_kernel, common/combine.py decode_combine_kernel (and the balanced
# one), decode/kernels_ragged.py for ragged drafts; FlashInfer 0.7.2: prefill.cuh
# BatchPrefillWithPagedKVCacheKernel (the tensor-core decode runs the prefill kernel) and cascade.cuh
# (Persistent)VariableLengthMergeStates / AttentionSum, decode.cuh BatchDecodeWithPagedKVCacheKernel,
# SingleDecodeWithKVCacheKernel, xqa/mha.cu and mha_sm90.cu kernel_mha. A filter that matches
# nothing is retried once without it (the whole NVTX range), and the record says so.
KERNEL_FILTERS = {
    "kvattn": r"decode_split|decode_combine|balanced_combine|ragged_pack|ragged_unpack",
    "fi-fa2-tc": r"BatchPrefillWithPagedKVCache|MergeStates|AttentionSum",
    "fi-fa2": r"BatchDecodeWithPagedKVCache|MergeStates|AttentionSum",
    "fi-xqa": r"kernel_mha",
    "fi-single": r"SingleDecodeWithKVCache|MergeState",
}

STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
# Everything each kernel is profiled for. The stall reasons are warp cycles per issued instruction
# spent stalled for that reason (ncu's WarpStateStats section); a name this ncu does not know is
# dropped by the preflight, not fatal.
METRICS = (
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "lts__t_sectors_op_read.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__maximum_warps_per_active_cycle_pct",
    "gpc__cycles_elapsed.avg.per_second",
    "dram__cycles_elapsed.avg.per_second",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic",
    "launch__shared_mem_per_block_static",
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_registers",
    "launch__occupancy_limit_warps",
    "launch__waves_per_multiprocessor",
    "smsp__inst_executed.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
)
# Print options that make the CSV easier to read (base units: no Kbyte / usecond rescaling;
# function names: no template arguments or parameters). The parser copes without them, so the
# preflight drops one this ncu rejects.
OPTIONAL_FLAGS = (("--print-units", "base"), ("--print-kernel-base", "function"))
PREFLIGHT_APP = "import torch; x = torch.ones(1 << 20, device='cuda'); torch.cuda.synchronize()"
PREFLIGHT_TRIES = 6
PREFLIGHT_S = 120.0  # at most, for the preflight's search (~6-8 s a try); one try when all is well
DEFAULT_RUN_S = 30.0  # a run's expected length before any has finished (the first compiles kvattn)
TAIL_CHARS = 1500


class Stopped(Exception):
    """SIGTERM (the device script's timeout) or Ctrl-C: stop after writing what there is."""


def _on_signal(signum: int, _frame: Any) -> None:
    raise Stopped(f"signal {signum}")


# ----------------------------------------------------------------------------------------------
# ncu command lines
# ----------------------------------------------------------------------------------------------


def find_ncu(given: str | None) -> str:
    """``--ncu``, else ncu on PATH, else the CUDA toolkit's; plain ``ncu`` if none (dry runs)."""
    if given:
        return given
    for cand in (shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if cand and os.path.exists(cand):
            return cand
    return "ncu"


def ncu_args(ncu: str, metrics: Iterable[str], *, clock_control: str, log_file: str,
             flags: Iterable[tuple[str, str]]) -> list[str]:
    """The options every profile shares (the preflight's and the runs')."""
    cmd = [ncu, "--target-processes", "application-only", "--replay-mode", "kernel",
           "--cache-control", "all", "--clock-control", clock_control,
           "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--log-file", log_file]
    for flag, value in flags:
        cmd += [flag, value]
    return cmd


def impl_arg(impl: str) -> str:
    """ncu_decode.py's ``--impl`` value of an implementation name."""
    return impl if impl == "kvattn" else f"fi:{impl}"


def run_command(base: list[str], python: str, shape_id: str, impl: str, *, warmup: int, calls: int,
                name_filter: str | None) -> list[str]:
    """ncu on ncu_decode.py: the kernels of its NVTX range, those matching ``name_filter``."""
    cmd = base + ["--nvtx", "--nvtx-include", f"{ncu_decode.NVTX_RANGE}/"]
    if name_filter:
        cmd += ["--kernel-name", f"regex:{name_filter}"]
    return cmd + [python, str(SCRIPT), shape_id, "--impl", impl_arg(impl), "--warmup", str(warmup),
                  "--calls", str(calls)]


def preflight_command(base: list[str], python: str) -> list[str]:
    return base + ["--launch-count", "1", python, "-c", PREFLIGHT_APP]


# ----------------------------------------------------------------------------------------------
# ncu's --csv --page raw output
# ----------------------------------------------------------------------------------------------


def parse_raw_csv(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """ncu's ``--csv --page raw`` report: one dict (column -> text) per profiled kernel launch, and
    the columns' units.

    The report is a header row of column names (``"ID"``, ``"Kernel Name"``, ..., metric names),
    then a row of units (empty for the identification columns), then one row per launch; every cell
    is quoted, so values such as ``"(132, 1, 1)"`` or ``"2,147,483,648"`` keep their commas. Lines
    around it (``==PROF==`` messages, the application's output) are skipped. The details page's long
    form (one row per metric: ``"Metric Name"``, ``"Metric Unit"``, ``"Metric Value"``), should an
    ncu print that instead, is folded into the same one row per launch.
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return [], {}
    block = [line for line in lines[start:] if line.startswith('"')]
    table = list(csv.reader(block))
    header, body = table[0], table[1:]
    units: dict[str, str] = {}
    if {"Metric Name", "Metric Value"} <= set(header):
        launches: dict[str, dict[str, str]] = {}
        for row in body:
            if len(row) != len(header):
                continue
            cells = dict(zip(header, row))
            launch = launches.setdefault(cells["ID"], {k: v for k, v in cells.items() if not k.startswith("Metric ")
                                                       and k not in ("Section Name", "Rule Name", "Rule Type",
                                                                     "Rule Description")})
            launch[cells["Metric Name"]] = cells["Metric Value"]
            if cells.get("Metric Unit"):
                units[cells["Metric Name"]] = cells["Metric Unit"]
        return list(launches.values()), units
    if body and not body[0][0].strip().isdigit():  # the units row: its ID cell is empty
        units = {h: u for h, u in zip(header, body[0]) if u}
        body = body[1:]
    return [dict(zip(header, row)) for row in body if len(row) == len(header)], units


def number(text: str | None) -> float | None:
    """A report cell as a number (thousands separators dropped); ``None`` for n/a or text."""
    if text is None:
        return None
    t = text.strip().replace(",", "")
    if not t or t.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30,
          "Ti": 2.0**40}
_TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9,
            "s": 1e9}


def to_base(value: float, unit: str) -> tuple[float, str]:
    """``value`` in ``unit`` as bytes, ns, byte/second or cycle/second (ncu rescales these under
    its default ``--print-units auto``: Mbyte, usecond, Gbyte/second, cycle/nsecond, GHz; newer
    versions abbreviate: MB, us, GB/s); any other unit unchanged."""
    u = unit.strip()
    if u in _TIME_NS:
        return value * _TIME_NS[u], "nsecond"
    num, _, per = u.partition("/")
    m = re.fullmatch(r"(Ki|Mi|Gi|Ti|K|M|G|T)?(byte|B|cycle)", num)
    if m and (not per or per in _TIME_NS):
        kind = "cycle" if m.group(2) == "cycle" else "byte"
        value *= _SCALE[m.group(1) or ""]
        if per:
            return value * 1e9 / _TIME_NS[per], f"{kind}/second"
        return value, kind
    m = re.fullmatch(r"([KMGT])?hz", u, flags=re.IGNORECASE)
    if m:
        return value * _SCALE[(m.group(1) or "").upper()], "cycle/second"
    return value, unit


def short_name(name: str) -> str:
    """A kernel's name without parameters, template arguments or namespaces, for the table."""
    base = re.sub(r"\(.*$", "", name)
    base = re.sub(r"<.*$", "", base)
    return (base.split("::")[-1].split() or [name])[-1]  # (a demangled name leads with its return type)


def summarize(rows: list[dict[str, str]], units: dict[str, str], metrics: Iterable[str], calls: int) -> list[dict]:
    """Per kernel name (in launch order): the metrics' means over its launches in base units, each
    launch's time, and the values the table shows."""
    metrics = [m for m in metrics if not rows or m in rows[0]]
    groups: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        groups.setdefault(row.get("Kernel Name", "?"), []).append(row)
    out = []
    for name, launches in groups.items():
        means: dict[str, float | None] = {}
        unit_of: dict[str, str] = {}
        for m in metrics:
            vals = []
            for row in launches:
                v = number(row.get(m))
                if v is not None:
                    v, unit_of[m] = to_base(v, units.get(m, ""))
                    vals.append(v)
            means[m] = statistics.fmean(vals) if vals else None
        times = []
        for row in launches:
            v = number(row.get("gpu__time_duration.sum"))
            if v is not None:
                times.append(round(to_base(v, units.get("gpu__time_duration.sum", "nsecond"))[0] / 1e3, 3))
        out.append({
            "name": name,
            "short": short_name(name),
            "launches": len(launches),
            "launches_per_call": len(launches) / calls,
            "grid": launches[0].get("Grid Size"),
            "block": launches[0].get("Block Size"),
            "metrics": means,
            "units": unit_of,
            "time_us_each": times,
            "derived": derived(means),
        })
    return out


def derived(m: dict[str, float | None]) -> dict[str, Any]:
    """What the table shows that is not a metric as such: time in us, DRAM MB and GB/s, shared
    memory in KiB, instructions in millions, the three largest stall reasons."""
    t_ns = m.get("gpu__time_duration.sum")
    rd, wr = m.get("dram__bytes_read.sum"), m.get("dram__bytes_write.sum")
    smem = [m.get("launch__shared_mem_per_block_dynamic"), m.get("launch__shared_mem_per_block_static")]
    stalls = sorted(((k[len(STALL_PREFIX):-len(STALL_SUFFIX)], v) for k, v in m.items()
                     if k.startswith(STALL_PREFIX) and k.endswith(STALL_SUFFIX) and v is not None),
                    key=lambda kv: -kv[1])
    inst = m.get("smsp__inst_executed.sum")
    return {
        "time_us": None if t_ns is None else t_ns / 1e3,
        "dram_read_mb": None if rd is None else rd / 1e6,
        "dram_write_mb": None if wr is None else wr / 1e6,
        # bytes per ns are GB/s
        "dram_gbps": None if not t_ns or rd is None else (rd + (wr or 0.0)) / t_ns,
        "smem_kib": None if all(s is None for s in smem) else sum(s or 0.0 for s in smem) / 1024,
        "inst_m": None if inst is None else inst / 1e6,
        "top_stalls": [[k, round(v, 2)] for k, v in stalls[:3]],
    }


# ----------------------------------------------------------------------------------------------
# What a failed profile says
# ----------------------------------------------------------------------------------------------


_MISSING = (
    re.compile(r"Failed to find metric\s+['\"]?(?:regex:)?([\w.]+)"),
    re.compile(r"[Mm]etric\s+['\"]?([\w.]+)['\"]?\s+(?:was\s+)?"
               r"(?:not found|does not exist|is not (?:available|supported))"),
    re.compile(r"[Uu]nknown metric\s+['\"]?([\w.]+)"),
)


def missing_metrics(output: str, metrics: Iterable[str]) -> list[str]:
    """The requested metrics ncu's messages call unknown."""
    wanted = set(metrics)
    found = {m for pat in _MISSING for m in pat.findall(output)}
    return sorted(found & wanted)


def rejected_flags(output: str, flags: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The optional flags ncu's messages reject (an unknown option or value)."""
    out = []
    for flag, value in flags:
        for line in output.splitlines():
            low = line.lower()
            if flag in line and ("option" in low or "invalid" in low or "unrecogni" in low or "unknown" in low):
                out.append((flag, value))
                break
    return out


# ----------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------


def run_proc(cmd: list[str], timeout: float) -> tuple[int | None, str, float, bool]:
    """``(exit status, stdout + stderr, seconds, timed out)``; on a timeout or a stop, ncu and the
    application it started (one process group of their own) are terminated."""
    t0 = time.monotonic()
    try:
        # (LC_ALL=C: ncu prints numbers in the locale's format, and a European one swaps '.' and ',')
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True, env={**os.environ, "LC_ALL": "C"})
    except OSError as exc:  # no ncu there
        return None, f"cannot start {cmd[0]}: {type(exc).__name__}: {exc}", 0.0, False
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1.0))
        return proc.returncode, out, time.monotonic() - t0, False
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, _ = proc.communicate()
        return None, out or "", time.monotonic() - t0, True
    except BaseException:
        _kill(proc)
        raise


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group this script started, SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def profile(cmd: list[str], log_file: Path, timeout: float) -> dict[str, Any]:
    """One ncu process: its status, seconds, output tail and parsed report."""
    log_file.unlink(missing_ok=True)
    rc, out, secs, timed_out = run_proc(cmd, timeout)
    log = log_file.read_text(errors="replace") if log_file.exists() else ""
    rows, units = parse_raw_csv(log)
    if not rows:  # (an ncu that ignored --log-file printed the report with the application's output)
        rows, units = parse_raw_csv(out)
    return {"rc": rc, "seconds": round(secs, 1), "timed_out": timed_out, "rows": rows, "units": units,
            "text": log + "\n" + out}


def tail(text: str, n: int = TAIL_CHARS) -> str:
    keep = [line for line in text.splitlines() if line.strip() and not line.startswith('"')]
    return "\n".join(keep)[-n:]


def preflight(ncu: str, python: str, metrics: list[str], flags: list[tuple[str, str]], clock_control: str,
              tmp: Path, seconds: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Profile one fill kernel with every metric and flag, dropping (in place) what ncu rejects.

    First the names ncu's messages give. If it still profiles nothing and says nothing usable: one
    metric and no optional flag tells whether ncu can profile at all (if not: ``ok`` False, the
    error, e.g. ERR_NVGPUCTRPERM); then the flags one by one, then the metrics by halving, within
    ``seconds`` (a metric not reached by then is dropped too: a run that fails on every shape
    would cost more).
    """
    t_end = time.monotonic() + seconds
    info: dict[str, Any] = {"ok": False, "dropped_metrics": [], "dropped_flags": [], "tries": 0, "error": None}
    log_file = tmp / "preflight.csv"
    one = ["gpu__time_duration.sum"]

    def attempt(ms: list[str], fs: list[tuple[str, str]]) -> dict[str, Any]:
        info["tries"] += 1
        base = ncu_args(ncu, ms, clock_control=clock_control, log_file=str(log_file), flags=fs)
        # (past the deadline a try still gets 30 s: the last one confirms what the search kept)
        return profile(preflight_command(base, python), log_file, max(t_end - time.monotonic(), 30.0))

    def drop(bad_m: list[str], bad_f: list[tuple[str, str]], why: str) -> None:
        for m in bad_m:
            metrics.remove(m)
        for f in bad_f:
            flags.remove(f)
        info["dropped_metrics"] += bad_m
        info["dropped_flags"] += [f[0] for f in bad_f]
        log(f"preflight: dropped {', '.join(bad_m + [f[0] for f in bad_f])} ({why})")

    def done(res: dict[str, Any]) -> dict[str, Any]:
        info["ok"] = True
        info["seconds"] = round(seconds - (t_end - time.monotonic()), 1)
        absent = [m for m in metrics if m not in res["rows"][0]]
        if absent:  # profiled, but no column: a metric this GPU does not report
            info["absent_metrics"] = absent
        return info

    res: dict[str, Any] = {}
    for _ in range(PREFLIGHT_TRIES):
        res = attempt(metrics, flags)
        if res["rows"]:
            return done(res)
        bad_m, bad_f = missing_metrics(res["text"], metrics), rejected_flags(res["text"], flags)
        if not bad_m and not bad_f:
            break
        drop(bad_m, bad_f, "named by ncu")
    first_error = f"rc {res.get('rc')}: {tail(res.get('text', ''), 800)}"
    if time.monotonic() >= t_end or not attempt(one, [])["rows"]:
        info["error"] = f"ncu profiled nothing, even with one metric and no print flag ({first_error})"
        return info
    for f in list(flags):
        if time.monotonic() >= t_end or not attempt(one, [f])["rows"]:
            drop([], [f], "no profile with it")
    bad: list[str] = []

    def search(ms: list[str]) -> None:
        if not ms:
            return
        if time.monotonic() >= t_end:
            bad.extend(ms)
        elif not attempt(ms, flags)["rows"]:
            if len(ms) == 1:
                bad.extend(ms)
            else:
                search(ms[: len(ms) // 2])
                search(ms[len(ms) // 2:])

    rest = [m for m in metrics if m not in one]
    search(rest[: len(rest) // 2])
    search(rest[len(rest) // 2:])
    if bad:
        drop(bad, [], "no profile with it, or not reached in time")
    res = attempt(metrics, flags)
    if res["rows"]:
        return done(res)
    info["error"] = f"no profile with the metrics left ({first_error})"
    return info


def prebuild(shapes: list[Shape], impls: list[str], log: Callable[[str], None]) -> dict[str, Any]:
    """Compile the FlashInfer modules the runs load, in parallel, each in the build directory its
    first use runs ninja in (``peers_flashinfer.prebuild``'s way, for these implementations only:
    the other kernels of the shapes would cost compile time for nothing)."""
    from benchmarks import peers_flashinfer as pf

    t0 = time.monotonic()
    keys: dict[tuple, None] = {}
    for s in shapes:
        have = {name for name, _ in pf.kernels(s)[0]}
        for name in impls:
            if name in have:
                for key in pf.modules(name, pf.fi_call(name, s)):
                    keys.setdefault(key, None)
    info: dict[str, Any] = {"variants": [pf.describe(k) for k in keys], "seconds": None, "stale": None, "error": None}
    try:
        if keys:
            pf.load()
            jobs = int(os.environ.get("MAX_JOBS", "") or 16)
            specs = pf.jit_specs(list(keys))
            todo = [s for s in specs if not getattr(s, "is_aot", False)]
            log(f"FlashInfer: compiling {len(todo)} modules, {jobs} jobs ({', '.join(info['variants'])}) ...")
            pf.build_in_parallel(todo, jobs)
            info["stale"] = [name for name, s in zip(info["variants"], specs) if not pf.up_to_date(s)]
    except Exception as exc:  # noqa: BLE001 - a failed prebuild leaves the modules to compile on first use
        info["error"] = f"{type(exc).__name__}: {str(exc).strip()[-600:]}"
    info["seconds"] = round(time.monotonic() - t0, 1)
    log(f"FlashInfer prebuild: {info['seconds']} s" + (f", error {info['error']}" if info["error"] else ""))
    return info


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------


COLUMNS = (  # (title, width, value of a kernel record)
    ("time us", 9, lambda k: _f(k["derived"]["time_us"], 1)),
    ("DRAM rd MB", 10, lambda k: _f(k["derived"]["dram_read_mb"], 1)),
    ("GB/s", 6, lambda k: _f(k["derived"]["dram_gbps"], 0)),
    ("dram%", 5, lambda k: _f(k["metrics"].get("dram__throughput.avg.pct_of_peak_sustained_elapsed"), 1)),
    ("L2hit%", 6, lambda k: _f(k["metrics"].get("lts__t_sector_hit_rate.pct"), 1)),
    ("warps%", 6, lambda k: _f(k["metrics"].get("sm__warps_active.avg.pct_of_peak_sustained_active"), 1)),
    ("grid", 6, lambda k: _f(k["metrics"].get("launch__grid_size"), 0)),
    ("blk", 4, lambda k: _f(k["metrics"].get("launch__block_size"), 0)),
    ("regs", 4, lambda k: _f(k["metrics"].get("launch__registers_per_thread"), 0)),
    ("smemKiB", 7, lambda k: _f(k["derived"]["smem_kib"], 1)),
    ("inst M", 7, lambda k: _f(k["derived"]["inst_m"], 2)),
)


def _f(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _kernel_text(short: str) -> str:
    """A kernel name compact enough for the table's column (the JSON keeps the full one)."""
    for long, brief in (("WithPagedKVCache", "Paged"), ("VariableLength", "VarLen")):
        short = short.replace(long, brief)
    return re.sub(r"(_kernel|Kernel)$", "", short)


def _shape_text(shape_id: str) -> str:
    return shape_id[len("decode "):] if shape_id.startswith("decode ") else shape_id


def table(runs: list[dict]) -> str:
    """One line per (shape, impl, kernel), a ``(call)`` line summing a run of several kernels, an
    error line per failed run."""
    head = f"{'shape':<22} {'impl':<9} {'kernel':<32} " + " ".join(f"{t:>{w}}" for t, w, _ in COLUMNS) + "  top stalls"
    lines = [head, "-" * len(head)]
    for r in runs:
        lead = f"{_shape_text(r['shape'])[:22]:<22} {r['impl'][:9]:<9} "
        if r.get("error") and not r.get("kernels"):
            note = r["error"] if r["error"].startswith("skipped") else f"ERROR: {r['error']}"
            lines.append((lead + note)[:200])
            continue
        for k in r["kernels"]:
            stalls = ", ".join(f"{n} {v:g}" for n, v in k["derived"]["top_stalls"])
            cells = " ".join(f"{fn(k):>{w}}" for _, w, fn in COLUMNS)
            lines.append((lead + f"{_kernel_text(k['short'])[:32]:<32} {cells}  {stalls}").rstrip())
        if len(r["kernels"]) > 1 and r.get("call_time_us") is not None:
            lines.append(lead + f"{'(call: sum of kernels)':<32} {r['call_time_us']:>9.1f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The parser checked on hand-written reports (--self-test; no GPU, no ncu)
# ----------------------------------------------------------------------------------------------

# The raw page as ncu prints it (--print-units auto here, to check the rescaling): names, units,
# one row per launch, commas inside quoted cells; around it ncu's and the application's lines.
# (A backslash at a line's end joins the lines: each CSV row is one line.)
SAMPLE_RAW = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
ncu_decode: kvattn on decode bf16 64x8192 p64 HND: 2 warm-up calls, 1 in NVTX range 'ncu_profile'
==PROF== Disconnected from process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",\
"Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum","launch__grid_size",\
"launch__shared_mem_per_block_dynamic","launch__shared_mem_per_block_static",\
"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",\
"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
"","","","","","","","","","","","Mbyte","Kbyte","usecond","","Kbyte","byte","",""
"0","4242","python3.12","h","decode_split_kernel","1","7","(256, 1, 1)","(264, 1, 1)","0","9.0",\
"2,147.48","1,049.60","452.32","264","147.46","0","12.5","1.75"
"1","4242","python3.12","h","decode_combine_kernel","1","7","(128, 1, 1)","(64, 32, 1)","0","9.0",\
"1.05","262.14","5.10","2,048","0","0","n/a","3.2"
"""
# The details page's long form: one row per metric.
SAMPLE_LONG = """"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",\
"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1","python3","h","kernel_mha","1","7","(384, 1, 1)","(132, 8, 1)","0","9.0","Command line profiler metrics",\
"gpu__time_duration.sum","ns","440,100"
"0","1","python3","h","kernel_mha","1","7","(384, 1, 1)","(132, 8, 1)","0","9.0","Command line profiler metrics",\
"dram__bytes_read.sum","GB","2.15"
"""


def self_test() -> None:
    """The parser and the derived values on :data:`SAMPLE_RAW` and :data:`SAMPLE_LONG`."""
    rows, units = parse_raw_csv(SAMPLE_RAW)
    assert [r["Kernel Name"] for r in rows] == ["decode_split_kernel", "decode_combine_kernel"], rows
    assert rows[0]["Grid Size"] == "(264, 1, 1)" and units["gpu__time_duration.sum"] == "usecond", (rows, units)
    split, combine = summarize(rows, units, METRICS, calls=1)
    d = split["derived"]
    assert abs(d["time_us"] - 452.32) < 1e-9 and abs(d["dram_read_mb"] - 2147.48) < 1e-9, d
    assert abs(d["dram_gbps"] - (2147.48e6 + 1049.6e3) / 452.32e3) < 1e-9, d
    assert abs(d["smem_kib"] - 147.46e3 / 1024) < 1e-9 and d["top_stalls"][0][0] == "long_scoreboard", d
    assert combine["metrics"]["launch__grid_size"] == 2048.0, combine
    assert combine["metrics"]["smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"] is None
    rows, units = parse_raw_csv(SAMPLE_LONG)
    (xqa,) = summarize(rows, units, METRICS, calls=1)
    assert xqa["short"] == "kernel_mha" and abs(xqa["derived"]["time_us"] - 440.1) < 1e-9, xqa
    assert abs(xqa["derived"]["dram_gbps"] - 2.15e9 / 440.1e3) < 1e-9, xqa
    assert to_base(1.98, "cycle/nsecond") == (1.98e9, "cycle/second") and to_base(3, "KiB") == (3072.0, "byte")
    assert short_name("void flashinfer::BatchPrefillWithPagedKVCacheKernel<T<1>, P>(P)") == \
        "BatchPrefillWithPagedKVCacheKernel"
    assert missing_metrics("==ERROR== Failed to find metric lts__t_sector_hit_rate.pct", METRICS) == \
        ["lts__t_sector_hit_rate.pct"]
    assert rejected_flags("==ERROR== unrecognised option '--print-units'.", OPTIONAL_FLAGS) == [OPTIONAL_FLAGS[0]]
    print(table([{"shape": "decode bf16 64x8192 p64 HND", "impl": "kvattn", "kernels": [split, combine],
                  "call_time_us": 457.42, "error": None},
                 {"shape": "decode bf16 64x8192 p64 HND", "impl": "fi-xqa", "kernels": [xqa], "error": None},
                 {"shape": "decode bf16 64x8192 p64 HND", "impl": "fi-fa2-tc", "kernels": [],
                  "error": "ncu_decode: fi:fi-fa2-tc not available on ...: NotAvailable: flashinfer not importable"}]))
    print("self-test: ok")


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------


def parse_impls(text: str) -> list[str]:
    """``kvattn,fi-fa2-tc,xqa`` -> ``["kvattn", "fi-fa2-tc", "fi-xqa"]`` (``fi:`` prefixes allowed)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        part = part[3:] if part.startswith("fi:") else part
        out.append(part if part == "kvattn" or part.startswith("fi-") else "fi-" + part)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=None, metavar="ID",
                   help="a decode shape id of the registry, exactly (repeat for several; default: "
                        + "; ".join(DEFAULT_SHAPES) + ")")
    p.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                   help=f"comma-separated: kvattn and FlashInfer variant names (default {','.join(DEFAULT_IMPLS)})")
    p.add_argument("--json", default=None, help="write the results here (rewritten after every run)")
    p.add_argument("--budget", type=float, default=300.0,
                   help="seconds for everything, the prebuild included; no run starts that would not fit (300)")
    p.add_argument("--run-timeout", type=float, default=150.0, help="seconds one ncu run may take at most (150)")
    p.add_argument("--warmup", type=int, default=2, help="calls before the profiled ones (2)")
    p.add_argument("--calls", type=int, default=2, help="profiled calls per run (2; the metrics are their means)")
    p.add_argument("--clock-control", default="base", choices=("base", "none"),
                   help="ncu's clock control: base (locked, ncu's default) or none (the GPU's own boost)")
    p.add_argument("--all-kernels", action="store_true",
                   help="profile every kernel of the NVTX range, not only the attention and merge kernels")
    p.add_argument("--prebuild", action="store_true", help="compile the FlashInfer modules the runs need first")
    p.add_argument("--no-preflight", action="store_true", help="skip the preflight profile (metric and flag check)")
    p.add_argument("--ncu", default=None, help="the ncu binary (default: ncu on PATH)")
    p.add_argument("--python", default=sys.executable, help="the Python ncu runs ncu_decode.py with")
    p.add_argument("--dry-run", action="store_true", help="print the ncu command lines and exit (no GPU, no ncu)")
    p.add_argument("--self-test", action="store_true", help="check the report parser on built-in samples and exit")
    args = p.parse_args(argv)
    if args.warmup < 0 or args.calls < 1:
        p.error("--warmup must be >= 0 and --calls >= 1")
    return args


def plan(shape_ids: list[str], impls: list[str]) -> tuple[list[Shape], list[tuple[Shape, str, str | None]]]:
    """The shapes, and ``(shape, impl, why not)`` per pair in run order (shape by shape, so the
    budget cuts whole shapes last); ``why not`` is set where the shape has no such kernel."""
    shapes = [ncu_decode.find_shape(s) for s in shape_ids]
    pairs = []
    for s in shapes:
        have = ncu_decode.impls(s)
        for impl in impls:
            why = None if impl_arg(impl) in have else f"not an implementation of this shape (it has {', '.join(have)})"
            pairs.append((s, impl, why))
    return shapes, pairs


def _write(doc: dict, path: str | None) -> None:
    if not path:
        return
    tmp = Path(path).with_suffix(".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.self_test:
        self_test()
        return 0
    t0 = time.monotonic()
    impls = parse_impls(args.impls)
    shapes, pairs = plan(args.shape or list(DEFAULT_SHAPES), impls)
    ncu = find_ncu(args.ncu)
    metrics, flags = list(METRICS), list(OPTIONAL_FLAGS)

    if args.dry_run:
        base = ncu_args(ncu, metrics, clock_control=args.clock_control, log_file="TMP/preflight.csv", flags=flags)
        print("# preflight\n" + shlex.join(preflight_command(base, args.python)))
        for shape, impl, why in pairs:
            if why:
                print(f"# {impl} on {shape.id}: skipped, {why}")
                continue
            base = ncu_args(ncu, metrics, clock_control=args.clock_control, log_file="TMP/run.csv", flags=flags)
            filt = None if args.all_kernels else KERNEL_FILTERS.get(impl)
            print(f"# {impl} on {shape.id}\n" + shlex.join(run_command(
                base, args.python, shape.id, impl, warmup=args.warmup, calls=args.calls, name_filter=filt)))
        return 0

    signal.signal(signal.SIGTERM, _on_signal)
    doc: dict[str, Any] = {
        "tool": "lab/probes/ncu_decode_compare.py",
        "argv": sys.argv[1:] if argv is None else argv,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "ncu": {"path": ncu, "version": None},
        "settings": {
            "cache_control": "all: ncu flushes every cache (L2 included) before each profiled kernel and replay pass",
            "clock_control": args.clock_control, "replay_mode": "kernel", "warmup": args.warmup, "calls": args.calls,
            "nvtx_range": ncu_decode.NVTX_RANGE, "kernel_filters": None if args.all_kernels else KERNEL_FILTERS,
            "budget_s": args.budget,
        },
        "metrics": list(METRICS), "preflight": None, "prebuild": None, "runs": [], "stopped": None, "seconds": None,
    }
    try:
        lines = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
        doc["ncu"]["version"] = lines[-1].strip() if lines else "?"
    except (OSError, subprocess.SubprocessError) as exc:
        doc["ncu"]["version"] = f"not runnable: {type(exc).__name__}: {exc}"
    left = lambda: args.budget - (time.monotonic() - t0)  # noqa: E731

    try:
        with tempfile.TemporaryDirectory(prefix="ncu-decode-") as tmp_dir:
            tmp = Path(tmp_dir)
            if args.prebuild:
                doc["prebuild"] = prebuild(shapes, [i for i in impls if i != "kvattn"], _log)
                _write(doc, args.json)
            if not args.no_preflight:
                doc["preflight"] = preflight(ncu, args.python, metrics, flags, args.clock_control, tmp,
                                             min(PREFLIGHT_S, max(left(), 1.0)), _log)
                doc["metrics"] = list(metrics)
                _write(doc, args.json)
                if not doc["preflight"]["ok"]:
                    doc["stopped"] = f"preflight: {doc['preflight']['error']}"
                    _log(doc["stopped"])
                    return 1
            recent: list[float] = []
            for i, (shape, impl, why) in enumerate(pairs):
                rec: dict[str, Any] = {"shape": shape.id, "impl": impl, "kernels": [], "error": None}
                doc["runs"].append(rec)
                if why:
                    rec["error"] = f"skipped: {why}"
                    continue
                expect = max(recent[-3:]) if recent else DEFAULT_RUN_S
                if left() < expect:
                    doc["stopped"] = f"budget: {left():.0f} s left, a run takes ~{expect:.0f} s"
                    doc["runs"].pop()
                    doc["not_run"] = [[s.id, m] for s, m, w in pairs[i:] if not w]
                    break
                run_one(rec, ncu, args, metrics, flags, tmp, min(args.run_timeout, left()))
                recent.append(rec["seconds"])
                n = sum(1 for _, _, w in pairs if not w)
                done = sum(1 for r in doc["runs"] if "seconds" in r)
                _log(f"[{time.monotonic() - t0:6.1f} s] ({done}/{n}) {impl} on {shape.id}: "
                     + (f"{len(rec['kernels'])} kernels" if rec["kernels"] else f"ERROR {rec['error']}"[:300])
                     + f" ({rec['seconds']} s)")
                if rec.get("timed_out") and left() <= 1.0:
                    doc["stopped"] = "budget: the last run was cut at the budget"
                    break
                _write(doc, args.json)
    except (Stopped, KeyboardInterrupt) as exc:
        doc["stopped"] = f"stopped: {exc or 'interrupted'}"
        if doc["runs"] and "seconds" not in doc["runs"][-1] and not doc["runs"][-1]["error"]:
            doc["runs"][-1]["error"] = doc["stopped"] + " during this run"
        _log(doc["stopped"])
    finally:
        doc["seconds"] = round(time.monotonic() - t0, 1)
        _write(doc, args.json)
    print(table(doc["runs"]))
    if doc["stopped"]:
        print(f"({doc['stopped']})")
    print(f"ncu: {doc['ncu']['version']}; clocks {args.clock_control}; L2 flushed before each "
          f"kernel (--cache-control all); {args.calls} profiled calls a run, means; {doc['seconds']} s")
    return 0


def run_one(rec: dict[str, Any], ncu: str, args: argparse.Namespace, metrics: list[str],
            flags: list[tuple[str, str]], tmp: Path, timeout: float) -> None:
    """Profile one (shape, impl) into ``rec``; a name filter that matched nothing is retried once
    without it, when time is left."""
    t0 = time.monotonic()
    log_file = tmp / "run.csv"
    base = ncu_args(ncu, metrics, clock_control=args.clock_control, log_file=str(log_file), flags=flags)
    filt = None if args.all_kernels else KERNEL_FILTERS.get(rec["impl"])
    cmd = run_command(base, args.python, rec["shape"], rec["impl"], warmup=args.warmup, calls=args.calls,
                      name_filter=filt)
    rec["command"] = shlex.join(cmd)
    rec["filter"] = filt
    res = profile(cmd, log_file, timeout)
    ok = res["rc"] == 0 and not res["timed_out"]
    remaining = timeout - (time.monotonic() - t0)
    if ok and not res["rows"] and filt and remaining > max(res["seconds"], 10.0):
        rec["filter_fallback"] = f"the filter {filt!r} matched no kernel of the range; profiled the whole range"
        rec["filter"] = None
        cmd = run_command(base, args.python, rec["shape"], rec["impl"], warmup=args.warmup, calls=args.calls,
                          name_filter=None)
        rec["command"] = shlex.join(cmd)
        res = profile(cmd, log_file, remaining)
        ok = res["rc"] == 0 and not res["timed_out"]
    rec.update(rc=res["rc"], seconds=round(time.monotonic() - t0, 1), timed_out=res["timed_out"])
    rec["kernels"] = summarize(res["rows"], res["units"], metrics, args.calls)
    if rec["kernels"]:
        times = [k["derived"]["time_us"] for k in rec["kernels"]]
        if all(t is not None for t in times):
            rec["call_time_us"] = sum(t * k["launches_per_call"] for t, k in zip(times, rec["kernels"]))
    if res["timed_out"]:
        rec["error"] = f"timed out after {res['seconds']} s"
    elif not ok or not rec["kernels"]:
        # ncu_decode's own refusal (FlashInfer missing, a peer refusing the shape), else the last
        # exception line of a traceback, else ncu's status
        lines = res["text"].splitlines()
        why = [x for x in lines if x.startswith("ncu_decode:") and "not available" in x]
        why = why or [x for x in lines if re.match(r"\w+(Error|Exception)\b", x)]
        state = f"rc {res['rc']}" if not ok else "no kernel profiled"
        rec["error"] = (f"{state}: {why[-1]}" if why else state)[:600]
    if rec["error"]:
        rec["output_tail"] = tail(res["text"])


if __name__ == "__main__":
    sys.exit(main())
