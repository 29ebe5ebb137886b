"""Runs one shape: kvattn and each peer, eager and CUDA-graph timings, metrics, a correctness check.

Every implementation gets its own record; a failure is caught and recorded on that record, so one
broken peer or kernel never ends the run. Errors that leave the CUDA context unusable (illegal
address, device-side assert) raise :class:`DeviceLost` with the records made so far: the caller
restarts the process to go on with a fresh context.
"""

from __future__ import annotations

import gc
import time
import traceback
import warnings
from dataclasses import dataclass

import torch

from kvattn.benchmarking.availability import NotAvailable
from kvattn.benchmarking.measure import Variant, is_fatal, rel_err, short_error, time_variant
from kvattn.benchmarking.records import headline_us
from kvattn.benchmarking.timing import Timer, sync

from . import metrics, peers_flashinfer, peers_flex, peers_sdpa, report
from .problems import Problem, build
from .shapes import Shape


class DeviceLost(RuntimeError):
    """The CUDA context is unusable after this error; ``records`` holds what was measured."""

    def __init__(self, message: str, records: list[dict]):
        super().__init__(message)
        self.records = records


@dataclass
class Options:
    peers: bool = True
    flex: bool = True
    flashinfer: bool = True  # FlashInfer's kernels on every shape they serve (not only shape.peers)
    graph_only: bool = False  # time CUDA-graph replays only (eager calls skipped; the sweep's mode)
    sdpa_backends: tuple[str, ...] = peers_sdpa.BACKENDS
    all_peers: bool = False  # time peers also on shapes the grid marks peers=False
    flex_gathered: bool = False  # also time flex on gathered K/V when the paged form works
    time_reference: bool = False  # time kvattn even when its op falls back to the reference
    check: bool = True
    workspace_mib: int = 256
    l2_bytes: int = 50 << 20
    # Same-run A/B of kvattn's own configurations: (label, family, {config field: value}) timed as
    # "kvattn-<label>" beside "kvattn" under that family's config override (run.py --ab).
    ab: tuple = ()
    peers_deadline: float = float("inf")  # time.time() after which peers are skipped
    kvattn_deadline: float = float("inf")


def kvattn_backend(op: str, device: torch.device) -> str:
    """"triton" when kvattn would run its Triton kernel for ``op`` on ``device``, else "reference"."""
    from kvattn.runtime import backend as _backend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return "triton" if _backend.use_triton(op, device) else "reference"


def _record(shape: Shape, problem: Problem | None, impl: str, family: str, **kw) -> dict:
    rec = {
        "shape": shape.id, "suite": shape.suite, "impl": impl, "family": family, "includes": "",
        "status": "ok", "note": "", "eager_us": None, "graph_us": None, "us": None,
        "n_sets": len(problem.sets) if problem else None,
        "bytes": problem.work.bytes if problem else None, "flops": problem.work.flops if problem else None,
    }
    rec.update(kw)
    return rec


def _add_rates(rec: dict, problem: Problem, ceilings: dict) -> None:
    us = headline_us(rec)
    rec["us"] = us
    if not us:
        return
    rec.update(metrics.rates(problem.work, us * 1e-6, ceilings))
    if rec.get("eager_us"):
        rec["fraction_eager"] = metrics.rates(problem.work, rec["eager_us"] * 1e-6, ceilings)["fraction"]


def run_shape(shape: Shape, device: torch.device, timer: Timer, ceilings: dict, opt: Options,
              log=print) -> list[dict]:
    """All records of one shape (kvattn first, then peers)."""
    records: list[dict] = []
    problem = None
    try:
        try:
            problem = build(shape, device, l2_bytes=opt.l2_bytes, workspace_mib=opt.workspace_mib)
        except Exception as exc:  # noqa: BLE001
            if is_fatal(exc):
                raise
            records.append(_record(shape, None, "kvattn", "kvattn", status="error", error=short_error(exc),
                                   traceback=traceback.format_exc()[-2000:]))
            return records
        ref, ref_name = _run_kvattn(shape, problem, device, timer, ceilings, opt, records)
        want_peers = opt.peers and (shape.peers or opt.all_peers)
        want_fi = opt.peers and opt.flashinfer
        if (want_peers or want_fi) and time.time() > opt.peers_deadline:
            records.append(_record(shape, problem, "peers", "peer", status="skipped",
                                   note="time budget spent: peers skipped"))
            return records
        if want_fi:
            _run_flashinfer(shape, problem, timer, ceilings, opt, records, ref, ref_name)
        if want_peers:
            _run_peers(shape, problem, timer, ceilings, opt, records, ref, ref_name)
        _copy_check_to_kvattn(records)
        report.attach_fi_ratio(records)
        return records
    except Exception as exc:  # noqa: BLE001
        if is_fatal(exc):
            raise DeviceLost(short_error(exc), records) from exc
        raise
    finally:
        del problem
        gc.collect()
        if device.type == "cuda":
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as exc:  # noqa: BLE001
                if is_fatal(exc):
                    raise DeviceLost(short_error(exc), records) from exc


def _copy_check_to_kvattn(records: list[dict]) -> None:
    """kvattn's check: its distance to the first peer that ran attention alone."""
    kv = records[0]
    # torch's peers first (an independent formulation), then FlashInfer's kernels that passed theirs
    ordered = sorted(records[1:], key=lambda r: r["family"] == peers_flashinfer.FAMILY)
    for rec in ordered:
        if rec.get("rel_err") is not None and rec.get("check_against") == "kvattn" and not rec["includes"] \
                and not rec.get("check_failed"):
            kv["rel_err"], kv["check_against"] = rec["rel_err"], rec["impl"]
            return


def _run_kvattn(shape, problem, device, timer, ceilings, opt, records):
    backend = kvattn_backend(problem.op, device)
    rec = _record(shape, problem, "kvattn", "kvattn", backend=backend)
    records.append(rec)
    if time.time() > opt.kvattn_deadline:
        rec.update(status="skipped", note="time budget spent")
        return None, None
    if backend == "reference" and device.type == "cuda" and not opt.time_reference:
        rec.update(status="not timed", note="reference fallback, not timed")
        return None, None
    if backend == "reference":
        rec["note"] = "reference backend"
    var = Variant("kvattn", "kvattn", [s.kvattn for s in problem.sets])
    try:
        time_variant(rec, var, timer, opt.graph_only)
        _add_rates(rec, problem, ceilings)
        out = problem.sets[0].kvattn()
        sync(device)
        if not torch.isfinite(out.float()).all():
            rec["note"] = (rec["note"] + "; " if rec["note"] else "") + "NON-FINITE OUTPUT"
        out = out.clone()
        for label, family, fields in opt.ab:
            if problem.op in _FAMILY_OPS.get(family, ()):
                _run_ab(shape, problem, device, timer, ceilings, opt, records, label, family, fields, out)
        return out, "kvattn"
    except Exception as exc:  # noqa: BLE001
        if is_fatal(exc):
            raise
        rec.update(status="error", error=short_error(exc), traceback=traceback.format_exc()[-2000:])
        return None, None


_FAMILY_OPS = {"decode": ("batch_decode", "single_decode"), "mla": ("mla_decode",), "prefill": ("context",)}


def _config_override(family: str, fields: dict):
    import importlib

    configs = importlib.import_module(f"kvattn.ops.{family}.configs")
    return lambda: configs.override(**fields)


def _run_ab(shape, problem, device, timer, ceilings, opt, records, label, family, fields, ref):
    """kvattn under a config override (``--ab``), checked against the plain call's output."""
    rec = _record(shape, problem, f"kvattn-{label}", "kvattn-ab", backend="triton", note=f"{family}: {fields}")
    records.append(rec)
    var = Variant(rec["impl"], "kvattn-ab", [s.kvattn for s in problem.sets], context=_config_override(family, fields))
    try:
        time_variant(rec, var, timer, True)
        _add_rates(rec, problem, ceilings)
        with var.context():
            out = problem.sets[0].kvattn()
        sync(device)
        rec["rel_err"] = rel_err(out, ref)
        rec["check_against"] = "kvattn"
    except Exception as exc:  # noqa: BLE001
        if is_fatal(exc):
            raise
        rec.update(status="error", error=short_error(exc))


def _run_peers(shape, problem, timer, ceilings, opt, records, ref, ref_name):
    specs = [s.spec for s in problem.sets]
    builders = list(peers_sdpa.variants(specs, opt.sdpa_backends))
    for name, make in builders:
        ref, ref_name = _run_peer(shape, problem, name, "sdpa", make, timer, ceilings, opt, records, ref, ref_name)
    if not opt.flex:
        return
    paged_failed = False
    for name, make in peers_flex.variants(specs, always_gathered=opt.flex_gathered):
        if _flex_peer(shape, problem, name, make, timer, ceilings, opt, records, ref, ref_name) == "paged failed":
            paged_failed = True
    if paged_failed:
        for name, make in peers_flex.variants(specs, paged_failed=True):
            _flex_peer(shape, problem, name, make, timer, ceilings, opt, records, ref, ref_name)


def _run_flashinfer(shape, problem, timer, ceilings, opt, records, ref, ref_name):
    """FlashInfer's kernels for the shape, each checked against kvattn's output (or, without one,
    against the first FlashInfer kernel that ran)."""
    kernels, why = peers_flashinfer.kernels(shape)
    if not kernels:
        records.append(_record(shape, problem, "fi", peers_flashinfer.FAMILY, status="not available", note=why))
        return
    for name, make in peers_flashinfer.variants(problem):
        ref, ref_name = _run_peer(shape, problem, name, peers_flashinfer.FAMILY, make, timer, ceilings, opt, records,
                                  ref, ref_name)
        rec = records[-1]
        compiled = peers_flashinfer.compiled_in_timed_phase(rec)
        if compiled:
            rec["note"] = (rec["note"] + "; " if rec["note"] else "") + compiled
        if peers_flashinfer.check_failed(rec):
            rec["check_failed"] = True
            rec["note"] = (rec["note"] + "; " if rec["note"] else "") + (
                f"CHECK FAILED: rel_err {rec['rel_err']:.2e} against {rec['check_against']} "
                f"(> {peers_flashinfer.CHECK_MAX}): not counted as FlashInfer's best")


def _flex_peer(shape, problem, name, make, timer, ceilings, opt, records, ref, ref_name) -> str:
    """One flex variant, skipping a formulation that already failed to compile on an earlier shape."""
    spec = problem.sets[0].spec
    form = "paged" if name == "flex-paged" else name
    earlier = peers_flex.earlier_failure(spec, form)
    if earlier:
        records.append(_record(shape, problem, name, "flex", status="not available",
                               note=f"failed on an earlier shape of this kind: {earlier}"[:500]))
    else:
        _run_peer(shape, problem, name, "flex", make, timer, ceilings, opt, records, ref, ref_name)
        rec = records[-1]
        if rec["status"] == "error" and rec.get("first_call_s") is None:  # failed before timing: compile/launch
            peers_flex.remember_failure(spec, form, rec.get("error", ""))
    return "paged failed" if name == "flex-paged" and records[-1]["status"] != "ok" else ""


def _run_peer(shape, problem, name, family, make, timer, ceilings, opt, records, ref, ref_name):
    rec = _record(shape, problem, name, family)
    records.append(rec)
    var = None
    try:
        t0 = time.perf_counter()
        var = make()
        # Setting the peer up (FlashInfer: its wrapper and plan, where a module not built yet is
        # compiled): seconds spent in the timed phase that the prebuild is meant to take.
        rec["build_s"] = round(time.perf_counter() - t0, 3)
        rec.update(impl=var.name, includes=var.includes, note=var.note)
        time_variant(rec, var, timer, opt.graph_only)
        _add_rates(rec, problem, ceilings)
        if opt.check and (not var.includes or ref is None):  # +prep variants compute the same output
            with var.context():
                raw = var.fns[0]()
                # FlashInfer's outputs are already in kvattn's layout (same signatures)
                out = raw if var.extra.get("native_out") else problem.sets[0].spec.to_common(var.unfold(raw))
            sync(timer.device)
            if ref is None:
                ref, ref_name = out.clone(), var.name
            else:
                rec["rel_err"] = rel_err(out, ref)
                rec["check_against"] = ref_name
    except NotAvailable as exc:
        rec.update(status="not available", note=str(exc)[:500])
    except Exception as exc:  # noqa: BLE001
        if is_fatal(exc):
            raise
        rec.update(status="error", error=short_error(exc), traceback=traceback.format_exc()[-2000:])
        if timer.cuda:
            torch.cuda.synchronize()
    finally:
        del var
        gc.collect()
        if timer.cuda:
            torch.cuda.empty_cache()
    return ref, ref_name
