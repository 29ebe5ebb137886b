"""The four ways a fuzz call is run, each ending in an outcome dict.

* ``plain``: one call against the float64 formulation.
* ``determinism``: the same call twice: the outputs and LSEs bitwise equal (and the first checked
  against the float64 formulation).
* ``invariant``: under :func:`kvattn.batch_invariant`, one request decoded alone (one of those
  with the most query rows) against the same request inside the call's batch: bitwise equal
  (docs/semantics.md, "Backends and switches").
* ``graph`` (CUDA only): the call captured in a CUDA graph, then new lengths, table rows and
  device-scale values written into its tensors in place and the graph replayed: the replay must
  follow the new values (a launch that read a device value on the host, or allocated, would not).

An outcome is ``{"result": "ok" | "mismatch" | "error", "why": str, ...}``.
"""

from __future__ import annotations

import random

import torch

from ..invariance import batch_invariant
from .calls import Call, build, public, request_rows, row_counts
from .draws import MODES
from .oracle import compare


def applicable(mode: str, function: str, device: torch.device) -> bool:
    if mode == "graph":
        return device.type == "cuda"
    if mode == "invariant":
        return function != "single_decode"  # one request a call: nothing to be invariant to
    return True


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check(call: Call, out, lse) -> dict:
    exact_out, exact_lse = call.expected()
    r = compare(call, out, lse, exact_out, exact_lse)
    return {"result": "ok" if r["ok"] else "mismatch", "why": r["why"], "err": r["err"], "tol": r["tol"],
            "lse_err": r["lse_err"]}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    return t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a).cpu(), _bits(b).cpu())


def run_plain(call: Call, rng: random.Random, device) -> dict:
    out, lse = call.run()
    _sync(device)
    return _check(call, out, lse)


def run_determinism(call: Call, rng: random.Random, device) -> dict:
    out, lse = call.run()
    _sync(device)
    first = (out.clone(), None if lse is None else lse.clone())
    outcome = _check(call, *first)
    out2, lse2 = call.run()
    _sync(device)
    if not (_same_bits(first[0], out2) and _same_bits(first[1], lse2)):
        what = "output" if not _same_bits(first[0], out2) else "lse"
        return {"result": "mismatch", "why": f"two identical calls gave different {what} bits", "err": None,
                "tol": None, "lse_err": None}
    return outcome


def _busiest(call: Call, rng: random.Random) -> int:
    """The request decoded alone: one of those with the most query rows. A request alone is a
    call of its own shape, whose kernels Triton compiles for its row count; with ragged drafts
    or prefill ``q_lens`` (each request its own count, fixed by the class) a random request
    compiled anew for nearly every count a class has, the busiest ones keep it to one."""
    rows = row_counts(call)
    most = max(rows)
    return rng.choice([b for b, n in enumerate(rows) if n == most])


def run_invariant(call: Call, rng: random.Random, device) -> dict:
    with batch_invariant():
        out, lse = call.run()
        _sync(device)
        whole = (out.clone(), None if lse is None else lse.clone())
        outcome = _check(call, *whole)
        if outcome["result"] != "ok" or call.batch == 0:
            return outcome
        b = _busiest(call, rng)
        alone_out, alone_lse = call.request(b).run()
        _sync(device)
    rows = request_rows(call, b)  # the same slice of the output and of the LSE
    ok = _same_bits(whole[0][rows], alone_out)
    if ok and whole[1] is not None:
        ok = _same_bits(whole[1][rows], alone_lse)
    if not ok:
        return {"result": "mismatch", "why": f"batch-invariant mode: request {b} alone differs from request {b} "
                f"in its batch of {call.batch}", "err": None, "tol": None, "lse_err": None, "request": b}
    return outcome


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _tensors(y)]
    if hasattr(x, "data") and hasattr(x, "scale"):  # FP4Tensor
        return [x.data, x.scale]
    return []


_CAPTURE_STREAMS: dict = {}  # device -> the side stream the graph mode captures on


def _capture(fn, kwargs: dict, device) -> tuple:
    """``fn(**kwargs)`` captured in a CUDA graph on a side stream: ``(graph, its result)``. What
    ``torch.cuda.graph`` does, less its ``empty_cache`` at every call (that handed every cached
    block back to the driver, and the next calls' tensors came from ``cudaMalloc``): the cache is
    handed back only when a capture runs out of memory, and the capture made again. A capture
    allocates from the graph's own pool, and PyTorch's allocator does not free the ordinary pool's
    cached blocks while a capture is under way; a worker under its share of the GPU
    (:mod:`kvattn.fuzz.jobs`) whose earlier large calls left that share cached would otherwise
    fail every capture that needs a new block (lab/notes/robustness.md)."""
    try:
        return _capture_once(fn, kwargs, device)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return _capture_once(fn, kwargs, device)


def _capture_once(fn, kwargs: dict, device) -> tuple:
    stream = _CAPTURE_STREAMS.get(device)
    if stream is None:
        stream = _CAPTURE_STREAMS[device] = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            raw = fn(**kwargs)
        finally:
            graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph, raw


def run_graph(call: Call, rng: random.Random, device) -> dict:
    from ..testing import poison_

    fn = public(call.function)
    fn(**call.kwargs)  # compile and plan outside the capture
    _sync(device)
    call.poison()
    graph, raw = _capture(fn, call.kwargs, device)
    call.rewrite(rng)
    call.poison()
    for t in _tensors(raw):
        poison_(t)
    graph.replay()
    _sync(device)
    out, lse = call.outputs(raw)
    outcome = _check(call, out, lse)
    if outcome["result"] != "ok":
        outcome["why"] = "after graph replay with new lengths/tables: " + outcome["why"]
    return outcome


RUNNERS = {"plain": run_plain, "graph": run_graph, "determinism": run_determinism, "invariant": run_invariant}


def run_spec(spec: dict, mode: str, device, mode_seed: int) -> dict:
    """Build ``spec`` on ``device`` and run it in ``mode``; an exception is an ``error`` outcome."""
    device = torch.device(device)
    try:
        call = build(spec, device)
        return RUNNERS[mode](call, random.Random(mode_seed), device)
    except Exception as exc:  # a crash is a finding, reported like a mismatch
        message = (str(exc).strip().splitlines() or [""])[0]
        return {"result": "error", "why": f"{type(exc).__name__}: {message}", "error_type": type(exc).__name__,
                "err": None, "tol": None, "lse_err": None}
