"""The benchmark command: ceilings, then kvattn and its peers on every selected shape; JSON out.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/run.py --suite decode,single_decode --out results.json --md results.md
    PYTHONPATH=src python benchmarks/run.py --quick --out results.json
    python benchmarks/run.py --device cpu          # smoke test of the harness (tiny shapes)
    python benchmarks/run.py --suite prefill --filter mixed --list
                                                   # which grid shapes a selection runs (no device)
    PYTHONPATH=src python benchmarks/run.py --suite decode,mla,prefill --batch-invariant --out inv.json
                                                   # the same suites in batch-invariant mode (its cost)
    source .peers/flashinfer/activate.sh && PYTHONPATH=src:$PYTHONPATH python benchmarks/run.py \
        --suite sweep --fi-prebuild --out sweep.json   # the sweep, FlashInfer beside (benchmarks/README.md)

As a module: ``from benchmarks.run import run; doc = run(suites=["decode"], out="r.json")``.

The JSON document is rewritten after every shape, so a run cut short still leaves its results. If a
kernel leaves the CUDA context unusable (illegal address...), the command records the error and
restarts itself on the remaining shapes (``--resume``), with a fresh context.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``kvattn`` importable
    sys.path.insert(0, str(_ROOT))
try:
    import kvattn  # noqa: F401
except ImportError:
    sys.path.insert(0, str(_ROOT / "src"))

import torch  # noqa: E402

from kvattn.benchmarking import records  # noqa: E402
from kvattn.benchmarking.timing import Timer  # noqa: E402

from benchmarks import ceilings as ceilings_mod  # noqa: E402
from benchmarks import peers_flashinfer, report, shapes, sweep  # noqa: E402
from benchmarks.runner import DeviceLost, Options, run_shape  # noqa: E402

MAX_RESTARTS = 4
SUITES = (*shapes.SUITES, "sweep")
# The sweep's timing unless --warmup / --rep are given: CUDA-graph replays only, short (many shapes).
SWEEP_WARMUP_MS, SWEEP_REP_MS = 10, 30


def _git_rev() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_ROOT, capture_output=True, text=True, timeout=5)
        if r.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return r.stdout.strip() + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - no git on the device copy is fine
        return None


def environment(device: torch.device, command: str) -> dict:
    """The harness's environment (:func:`kvattn.benchmarking.records.environment`) with this
    repository's git revision, the command line, the batch-invariant mode and the Triton ops."""
    import kvattn

    env = records.environment(device)
    env.update(git=_git_rev(), command=command, batch_invariant=kvattn.is_batch_invariant())
    from benchmarks.runner import kvattn_backend

    # The ops whose Triton kernels run on this device: none on a CPU (the reference serves there)
    # unless KVATTN_BACKEND=triton runs them in Triton's interpreter.
    env["triton_ops"] = [op for op in ("batch_decode", "context", "mla_decode", "single_decode")
                         if _runs_triton(kvattn_backend, op, device)]
    return env


def _runs_triton(backend_of, op: str, device: torch.device) -> bool:
    try:
        return backend_of(op, device) == "triton"
    except RuntimeError:  # KVATTN_BACKEND=triton on CPU tensors without the interpreter: nothing runs
        return False


def _save(doc: dict, path: str | None) -> None:
    if path:
        records.write_json(path, doc)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def select_shapes(suites=None, *, quick: bool = False, smoke: bool = False, filters=None) -> list:
    """The shapes a selection runs: the grid's (or the smoke shapes') of the named suites, then the
    sweep's rows if ``sweep`` is named (the sweep is never part of the default selection)."""
    suites = list(suites or shapes.SUITES)
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {unknown}; expected some of {SUITES}")
    grid_suites = [s for s in suites if s != "sweep"]
    out = []
    if grid_suites:
        out += shapes.select(shapes.SMOKE if smoke else shapes.GRID, suites=grid_suites, quick=quick and not smoke,
                             filters=filters)
    if "sweep" in suites:
        out += sweep.select(sweep.SMOKE_SWEEP if smoke else sweep.SWEEP, filters=filters)
    return out


def _flashinfer_env(prebuild_shapes) -> dict:
    """FlashInfer's version (or why it is not importable) and, if asked, the prebuild's outcome."""
    info: dict = {}
    try:
        fi = peers_flashinfer.load()
        info["version"] = getattr(fi, "__version__", "?")
    except peers_flashinfer.NotAvailable as exc:
        info["error"] = str(exc)
    if prebuild_shapes is not None:
        info["prebuild"] = peers_flashinfer.prebuild(prebuild_shapes, log=_log)
    return info


def _summary(recs: list[dict]) -> str:
    parts = []
    for r in recs:
        built = r.get("build_s") or 0.0  # a peer's set-up (FlashInfer: a compile if not prebuilt)
        setup = f" (set-up {built:.1f}s)" if built >= 1.0 else ""
        if r["status"] == "ok":
            parts.append(f"{r['impl']} {r.get('us') or 0:.1f}us {r.get('fraction') or 0:.2f}{setup}")
        else:
            parts.append(f"{r['impl']} [{r['status']}]{setup}")
    return " | ".join(parts)


def run(
    suites=None,
    *,
    out: str | None = None,
    md: str | None = None,
    quick: bool = False,
    smoke: bool | None = None,
    filters=None,
    device: str | None = None,
    peers: bool = True,
    flex: bool = True,
    options: dict | None = None,
    warmup_ms: int = 25,
    rep_ms: int = 100,
    time_budget_s: float = 480.0,
    resume: str | None = None,
    command: str = "",
    print_table: bool = True,
    fi_prebuild: bool = False,
) -> dict:
    """Run the benchmarks and return the results document (also written to ``out`` / ``md``)."""
    t_start = time.time()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if smoke is None:
        smoke = dev.type != "cuda"  # the grid is far too large for a CPU
    timer = Timer(dev, warmup_ms, rep_ms)
    if resume:
        with open(resume) as f:
            doc = json.load(f)
        t_start = doc["env"].get("started", t_start)
    else:
        doc = {"env": environment(dev, command), "ceilings": None, "records": [], "done": [], "restarts": 0}
        doc["env"]["started"] = t_start
    env = doc["env"]
    opt = Options(peers=peers, flex=flex, **(options or {}))
    doc["selection"] = {"suites": list(suites or shapes.SUITES), "quick": quick, "smoke": smoke,
                        "filters": list(filters or []), "peers": peers, "flex": flex,
                        "flashinfer": opt.flashinfer, "graph_only": opt.graph_only}
    selected = select_shapes(suites, quick=quick, smoke=smoke, filters=filters)
    if peers and opt.flashinfer and "flashinfer" not in env:
        _log("FlashInfer peers: " + ("prebuilding ..." if fi_prebuild else "compiled on first use"))
        env["flashinfer"] = _flashinfer_env(selected if fi_prebuild else None)
        pre = env["flashinfer"].get("prebuild")
        built = f"; prebuild {pre['seconds']} s, {len(pre['variants'])} variants {pre['error'] or ''}" if pre else ""
        if pre and pre.get("stale"):  # the timed phase's first use of these will compile again
            built += f" STILL TO COMPILE on first use: {', '.join(pre['stale'])}"
        _log(f"  FlashInfer: {env['flashinfer'].get('version') or env['flashinfer'].get('error')}{built}")
        _save(doc, out)
    if doc["ceilings"] is None:
        _log("measuring ceilings ...")
        doc["ceilings"] = ceilings_mod.measure(dev, timer)
        c = doc["ceilings"]
        _log(f"  copy {c.get('copy_gbps')} GB/s, bf16 {c.get('matmul_bf16_tflops')} TFLOP/s, "
             f"fp8 {c.get('matmul_fp8_tflops')} TFLOP/s {c['errors'] or ''}")
        _save(doc, out)

    opt.l2_bytes = env.get("l2_bytes") or (1 << 20)  # CPU: a nominal 1 MiB, so rotation is exercised
    opt.peers_deadline = t_start + time_budget_s
    opt.kvattn_deadline = t_start + time_budget_s + 60
    ops = env["triton_ops"]
    _log(f"{len(selected)} shapes on {env['device']} (kvattn: "
         + (f"Triton kernels for {', '.join(ops)}; the reference for any other op)" if ops
            else "its plain-PyTorch reference; no Triton kernel is timed)"))
    for i, shape in enumerate(selected):
        if shape.id in doc["done"]:
            continue
        t0 = time.time()
        try:
            recs = run_shape(shape, dev, timer, doc["ceilings"], opt)
        except DeviceLost as exc:
            recs = exc.records + [{"shape": shape.id, "suite": shape.suite, "impl": "device", "family": "peer",
                                   "includes": "", "status": "error", "error": f"device lost: {exc}"}]
            doc["records"] += recs
            doc["done"].append(shape.id)
            _save(doc, out)
            _log(f"[{time.time() - t_start:6.1f}s] {shape.id}: DEVICE LOST ({exc})")
            raise
        doc["records"] += recs
        doc["done"].append(shape.id)
        doc.setdefault("shapes", {})[shape.id] = shape.as_dict()  # the full configuration (a mixed batch's pairs)
        _save(doc, out)
        _log(f"[{time.time() - t_start:6.1f}s] ({i + 1}/{len(selected)}) {shape.id} ({time.time() - t0:.1f}s): "
             f"{_summary(recs)}")
    doc["env"]["elapsed_s"] = round(time.time() - t_start, 1)
    doc["summary"] = report.summary(doc)
    _save(doc, out)
    if md:
        Path(md).write_text(report.markdown(doc))
    if print_table:
        print(report.table(doc), flush=True)
    return doc


def list_shapes(suites=None, *, quick: bool = False, smoke: bool = False, filters=None, peers: bool = True,
                all_peers: bool = False, flashinfer: bool = True) -> list[str]:
    """One line per shape the selection would run (the GPU grid unless ``smoke``): id, then which
    peers are timed on it (torch's, FlashInfer's kernels). Measures nothing, so it runs anywhere."""
    selected = select_shapes(suites, quick=quick, smoke=smoke, filters=filters)
    width = max((len(s.id) for s in selected), default=0)
    lines = []
    for s in selected:
        torch_peers = peers and (s.peers or all_peers)
        fi = [name for name, _ in peers_flashinfer.kernels(s)[0]] if peers and flashinfer else []
        who = "kvattn + peers" if torch_peers else ("kvattn" if fi else "kvattn only")
        if fi:
            who += f" + FlashInfer ({', '.join(fi)})"
        lines.append(f"{s.id:<{width}}  {who}{'  (quick)' if s.quick else ''}")
    return lines


def parse_ab(text: str) -> tuple:
    """``LABEL:FAMILY:FIELD=VALUE,...`` -> ``(label, family, {field: int / float / bool / str})``."""
    label, family, assigns = text.split(":", 2)
    fields = {}
    for item in filter(None, assigns.split(",")):
        key, value = item.split("=", 1)
        for cast in (int, float):
            try:
                fields[key] = cast(value)
                break
            except ValueError:
                continue
        else:
            fields[key] = {"true": True, "false": False}.get(value.lower(), value)
    return label, family, fields


def fi_variants_text(suites=None, *, quick: bool = False, smoke: bool = False, filters=None) -> str:
    """The FlashInfer JIT variants a selection compiles (``--list`` prints it on stderr)."""
    keys = peers_flashinfer.variant_keys(select_shapes(suites, quick=quick, smoke=smoke, filters=filters))
    return f"FlashInfer variants compiled for this selection: {len(keys)}" + (
        ": " + "; ".join(peers_flashinfer.describe(k) for k in keys) if keys else "")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default=",".join(shapes.SUITES),
                   help=f"comma-separated, of {','.join(SUITES)} (default: all but sweep)")
    p.add_argument("--out", default="results.json", help="JSON output (rewritten after every shape)")
    p.add_argument("--md", default=None, help="also write the RESULTS.md block here")
    p.add_argument("--quick", action="store_true", help="the ~1-minute subset of the grid")
    p.add_argument("--smoke", action="store_true", help="tiny shapes (default on a CPU)")
    p.add_argument("--filter", action="append", default=None,
                   help="keep shapes whose id contains this (repeatable; comma-separated alternatives)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    p.add_argument("--peers", dest="peers", action="store_true", default=True)
    p.add_argument("--no-peers", dest="peers", action="store_false", help="time kvattn only")
    p.add_argument("--no-flex", dest="flex", action="store_false", default=True, help="skip FlexAttention peers")
    p.add_argument("--no-fi", dest="flashinfer", action="store_false", default=True, help="skip FlashInfer peers")
    p.add_argument("--fi-prebuild", action="store_true",
                   help="compile every FlashInfer variant the selection needs, in parallel, before timing")
    p.add_argument("--fi-prebuild-only", action="store_true",
                   help="only compile the FlashInfer variants the selection needs (in parallel), print the outcome")
    p.add_argument("--graph-only", action="store_true", default=None,
                   help="time CUDA-graph replays only, no eager calls (the default for --suite sweep)")
    p.add_argument("--all-peers", action="store_true", help="peers on every shape (not only one layout per workload)")
    p.add_argument("--flex-gathered", action="store_true", help="also time flex on gathered K/V when paged flex works")
    p.add_argument("--sdpa-backends", default=",".join(("flash", "cudnn", "efficient")))
    p.add_argument("--time-reference", action="store_true", help="time kvattn ops that run the reference backend")
    p.add_argument("--no-check", dest="check", action="store_false", default=True,
                   help="skip the output comparison between kvattn and the peers")
    p.add_argument("--workspace-mib", type=int, default=256)
    p.add_argument("--warmup", type=int, default=None, help="do_bench warm-up, ms (25; the sweep: 10)")
    p.add_argument("--rep", type=int, default=None, help="do_bench repetition time, ms (100; the sweep: 30)")
    p.add_argument("--time-budget", type=float, default=480.0,
                   help="seconds after which peers are skipped (kvattn 60 s later), to fit the device's limit")
    p.add_argument("--batch-invariant", action="store_true",
                   help="run kvattn in batch-invariant mode (KVATTN_BATCH_INVARIANT=1), to measure its cost")
    p.add_argument("--ab", action="append", default=[], metavar="LABEL:FAMILY:FIELD=VALUE[,FIELD=VALUE]",
                   help="also time kvattn under a config override of FAMILY (decode, mla, prefill) as "
                        "'kvattn-LABEL' (same-run A/B; e.g. uniform:decode:balance_waves=0)")
    p.add_argument("--list", action="store_true",
                   help="print the selected shapes (the GPU grid unless --smoke) and whether peers run on each; "
                   "measure nothing")
    p.add_argument("--resume", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.batch_invariant:
        # Through the variable, so a restart (os.execv, same environment) keeps the mode.
        os.environ["KVATTN_BATCH_INVARIANT"] = "1"
    filters = [f.strip() for a in (args.filter or []) for f in a.split(",") if f.strip()] or None
    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    if args.list:
        lines = list_shapes(suites, quick=args.quick, smoke=args.smoke, filters=filters, peers=args.peers,
                            all_peers=args.all_peers, flashinfer=args.flashinfer)
        print("\n".join(lines) if lines else "no shape matches", flush=True)
        if args.peers and args.flashinfer:
            _log(fi_variants_text(suites, quick=args.quick, smoke=args.smoke, filters=filters))
        return 0
    if args.fi_prebuild_only:
        info = _flashinfer_env(select_shapes(suites, quick=args.quick, smoke=args.smoke, filters=filters))
        print(json.dumps(info, indent=1), flush=True)
        return 0 if not info.get("error") and not info["prebuild"].get("error") else 1
    is_sweep = "sweep" in suites
    graph_only = is_sweep if args.graph_only is None else args.graph_only
    warmup = args.warmup if args.warmup is not None else (SWEEP_WARMUP_MS if is_sweep else 25)
    rep = args.rep if args.rep is not None else (SWEEP_REP_MS if is_sweep else 100)
    options = dict(all_peers=args.all_peers, flex_gathered=args.flex_gathered, time_reference=args.time_reference,
                   check=args.check, workspace_mib=args.workspace_mib, flashinfer=args.flashinfer,
                   graph_only=graph_only, sdpa_backends=tuple(b for b in args.sdpa_backends.split(",") if b),
                   ab=tuple(parse_ab(a) for a in args.ab))
    command = "python benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        run(suites, out=args.out, md=args.md, quick=args.quick,
            smoke=True if args.smoke else None, filters=filters, device=args.device, peers=args.peers,
            flex=args.flex, options=options, warmup_ms=warmup, rep_ms=rep,
            time_budget_s=args.time_budget, resume=args.resume, command=command, fi_prebuild=args.fi_prebuild)
    except DeviceLost:
        return _restart(args)
    return 0


def _restart(args: argparse.Namespace) -> int:
    """Go on with the remaining shapes in a fresh process (a fresh CUDA context)."""
    with open(args.out) as f:
        doc = json.load(f)
    doc["restarts"] = doc.get("restarts", 0) + 1
    _save(doc, args.out)
    if doc["restarts"] > MAX_RESTARTS:
        _log("too many device losses; giving up")
        return 1
    argv = [a for a in sys.argv[1:]]
    if "--resume" not in argv:
        argv += ["--resume", args.out]
    _log(f"restarting on the remaining shapes (restart {doc['restarts']})")
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
