"""The benchmark command: ceilings, then kvattn and its peers on every selected shape; JSON out.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/run.py --suite decode,single_decode --out results.json --md results.md
    PYTHONPATH=src python benchmarks/run.py --quick --out results.json
    python benchmarks/run.py --device cpu          # smoke test of the harness (tiny shapes)
    python benchmarks/run.py --suite prefill --filter mixed --list
                                                   # which grid shapes a selection runs (no device)
    PYTHONPATH=src python benchmarks/run.py --suite decode,mla,prefill --batch-invariant --out inv.json
                                                   # the same suites in batch-invariant mode (its cost)

As a module: ``from benchmarks.run import run; doc = run(suites=["decode"], out="r.json")``.

The JSON document is rewritten after every shape, so a run cut short still leaves its results. If a
kernel leaves the CUDA context unusable (illegal address...), the command records the error and
restarts itself on the remaining shapes (``--resume``), with a fresh context.
"""

from __future__ import annotations

import argparse
import datetime
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

from benchmarks import ceilings as ceilings_mod  # noqa: E402
from benchmarks import report, shapes  # noqa: E402
from benchmarks.runner import DeviceLost, Options, run_shape  # noqa: E402
from benchmarks.timing import Timer  # noqa: E402

MAX_RESTARTS = 4


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
    import triton

    import kvattn

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": name, "torch": torch.__version__, "triton": triton.__version__,
        "kvattn": getattr(kvattn, "__version__", "?"), "git": _git_rev(), "command": command,
        "cuda": torch.version.cuda, "python": sys.version.split()[0],
        "batch_invariant": kvattn.is_batch_invariant(),
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(sm_count=p.multi_processor_count, l2_bytes=getattr(p, "L2_cache_size", None),
                   memory_bytes=p.total_memory)
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
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    os.replace(tmp, path)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _summary(recs: list[dict]) -> str:
    parts = []
    for r in recs:
        if r["status"] == "ok":
            parts.append(f"{r['impl']} {r.get('us') or 0:.1f}us {r.get('fraction') or 0:.2f}")
        else:
            parts.append(f"{r['impl']} [{r['status']}]")
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
    doc["selection"] = {"suites": list(suites or shapes.SUITES), "quick": quick, "smoke": smoke,
                        "filters": list(filters or []), "peers": peers, "flex": flex}
    if doc["ceilings"] is None:
        _log("measuring ceilings ...")
        doc["ceilings"] = ceilings_mod.measure(dev, timer)
        c = doc["ceilings"]
        _log(f"  copy {c.get('copy_gbps')} GB/s, bf16 {c.get('matmul_bf16_tflops')} TFLOP/s, "
             f"fp8 {c.get('matmul_fp8_tflops')} TFLOP/s {c['errors'] or ''}")
        _save(doc, out)

    grid = shapes.SMOKE if smoke else shapes.GRID
    selected = shapes.select(grid, suites=suites, quick=quick and not smoke, filters=filters)
    opt = Options(peers=peers, flex=flex, **(options or {}))
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
    _save(doc, out)
    if md:
        Path(md).write_text(report.markdown(doc))
    if print_table:
        print(report.table(doc), flush=True)
    return doc


def list_shapes(suites=None, *, quick: bool = False, smoke: bool = False, filters=None, peers: bool = True,
                all_peers: bool = False) -> list[str]:
    """One line per shape the selection would run (the GPU grid unless ``smoke``): id, then whether
    the peers are timed on it. Measures nothing, so it runs anywhere."""
    grid = shapes.SMOKE if smoke else shapes.GRID
    selected = shapes.select(grid, suites=suites, quick=quick and not smoke, filters=filters)
    width = max((len(s.id) for s in selected), default=0)
    lines = []
    for s in selected:
        who = "kvattn + peers" if peers and (s.peers or all_peers) else "kvattn only"
        lines.append(f"{s.id:<{width}}  {who}{'  (quick)' if s.quick else ''}")
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default=",".join(shapes.SUITES), help=f"comma-separated, of {','.join(shapes.SUITES)}")
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
    p.add_argument("--all-peers", action="store_true", help="peers on every shape (not only one layout per workload)")
    p.add_argument("--flex-gathered", action="store_true", help="also time flex on gathered K/V when paged flex works")
    p.add_argument("--sdpa-backends", default=",".join(("flash", "cudnn", "efficient")))
    p.add_argument("--time-reference", action="store_true", help="time kvattn ops that run the reference backend")
    p.add_argument("--no-check", dest="check", action="store_false", default=True,
                   help="skip the output comparison between kvattn and the peers")
    p.add_argument("--workspace-mib", type=int, default=256)
    p.add_argument("--warmup", type=int, default=25, help="do_bench warm-up, ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    p.add_argument("--time-budget", type=float, default=480.0,
                   help="seconds after which peers are skipped (kvattn 60 s later), to fit the device's limit")
    p.add_argument("--batch-invariant", action="store_true",
                   help="run kvattn in batch-invariant mode (KVATTN_BATCH_INVARIANT=1), to measure its cost")
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
                            all_peers=args.all_peers)
        print("\n".join(lines) if lines else "no shape matches", flush=True)
        return 0
    options = dict(all_peers=args.all_peers, flex_gathered=args.flex_gathered, time_reference=args.time_reference,
                   check=args.check, workspace_mib=args.workspace_mib,
                   sdpa_backends=tuple(b for b in args.sdpa_backends.split(",") if b))
    command = "python benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        run(suites, out=args.out, md=args.md, quick=args.quick,
            smoke=True if args.smoke else None, filters=filters, device=args.device, peers=args.peers,
            flex=args.flex, options=options, warmup_ms=args.warmup, rep_ms=args.rep,
            time_budget_s=args.time_budget, resume=args.resume, command=command)
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
