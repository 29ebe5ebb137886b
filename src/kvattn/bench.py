"""``kvattn bench``: the five functions beside the attention torch provides, on this machine.

One shape per function (GPU-sized on CUDA, tiny on a CPU), random values, each request's pages in a
random order. For each shape: kvattn's call, then torch's ``scaled_dot_product_attention`` under each
backend (flash, cuDNN, memory-efficient) and FlexAttention (``torch.compile``) on the same values
laid out contiguously, ``[B, H, L, D]``. The peers have no paged form: their K/V are gathered from
the pages *before* timing, so their times leave out the copy a paged cache would pay on every call.
Decode shapes fold each KV head's query heads into query rows for SDPA (K/V read once per KV head).

GPU times: ``triton.testing.do_bench`` medians, L2 flushed before every repetition, of the replay
of a CUDA graph holding one call (what the kernels take) and of eager calls (launch overhead
included). CPU times: medians of host-timed eager calls; they only show that the command works.
Each peer's output is compared with kvattn's (relative error). The benchmark behind the numbers
the project reports is ``benchmarks/run.py`` in the repository (ceilings, many shapes, peers on
paged inputs too); this command is the small version a user runs on their own GPU.

As a library::

    from kvattn import bench
    doc = bench.run(torch.device("cuda"))     # {"env": ..., "method": ..., "records": [...]}
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import statistics
import sys
import textwrap
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ._version import __version__
from ._console import FUNCTION_KEYS, Progress, UsageError, format_rate, function_list, positive_int, print_table

SDPA_BACKENDS = ("flash", "cudnn", "efficient")

# ---------------------------------------------------------------------------------------------
# problems
# ---------------------------------------------------------------------------------------------
@dataclass
class PeerInputs:
    """What the peers compute: ``softmax(scale * q k^T) v`` with ``q [B, Hq, Lq, D]``,
    ``k [B, Hkv, L, D]``, ``v [B, Hkv, L, Dv]`` (contiguous), causal aligned to the last query."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float
    causal: bool
    flex: str = ""  # why FlexAttention is not tried here (empty: tried)


@dataclass
class Problem:
    key: str  # FUNCTION_KEYS
    function: str  # the table's name
    shape: str
    run: Callable[[], torch.Tensor]  # kvattn's call
    common: Callable[[torch.Tensor], torch.Tensor]  # kvattn's output as [B, Hq, Lq, Dv]
    work: float
    unit: str  # "B" (bytes: GB/s) or "FLOP" (TFLOP/s)
    peers: Optional[PeerInputs] = None
    peer_note: str = ""  # why there are no peers


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _randn(shape, dtype, device, seed: int) -> torch.Tensor:
    """Normal values drawn on ``device`` itself (the GPU grid's ~1.5 GB would take the host seconds)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=dtype)


def _paged_pool(batch: int, length: int, heads: int, dim: int, page: int, layout: str, dtype, device, seed: int,
                planes: int = 1):
    """``planes`` pools of pages ``[P, page, H, dim]`` (NHD) or ``[P, H, page, dim]`` (HND) and one
    table of each request's pages in a random order (``[B, pages a request]`` int32; one spare page)."""
    per = -(-length // page)
    total = batch * per + 1
    shape = (total, page, heads, dim) if layout == "NHD" else (total, heads, page, dim)
    pools = [_randn(shape, dtype, device, seed + i) for i in range(planes)]
    table = torch.randperm(total, generator=_gen(seed + planes))[: batch * per].view(batch, per).to(torch.int32)
    return pools, table.to(device)


def _gather(pages: torch.Tensor, table: torch.Tensor, length: int, layout: str) -> torch.Tensor:
    """Each request's tokens from its pages, contiguous ``[B, H, L, dim]``."""
    rows = pages[table.long()]  # [B, per, page, H, d] (NHD) or [B, per, H, page, d]
    b, per = rows.shape[:2]
    if layout == "NHD":
        rows = rows.reshape(b, per * rows.shape[2], rows.shape[3], rows.shape[4]).transpose(1, 2)
    else:
        rows = rows.transpose(1, 2).reshape(b, rows.shape[2], per * rows.shape[3], rows.shape[4])
    return rows[:, :, :length].contiguous()


def sizes(device: torch.device) -> dict:
    """The grid: GPU shapes a serving engine meets; CPU shapes small enough to finish in seconds."""
    if device.type == "cuda":
        return dict(decode=(32, 4096, 32, 8, 128, 16), single=(32768, 32, 128), mla=(32, 4096, 128, 64),
                    prefill=(4, 2048, 32, 8, 128, 64), workspace=128 << 20)
    return dict(decode=(2, 64, 4, 2, 64, 16), single=(128, 4, 64), mla=(2, 64, 16, 16),
                prefill=(2, 32, 4, 2, 64, 16), workspace=8 << 20)


def build(key: str, device: torch.device) -> Problem:
    """The problem of one function on ``device`` (inputs allocated here)."""
    import kvattn

    dt = torch.bfloat16
    grid = sizes(device)
    ws = torch.zeros(grid["workspace"], dtype=torch.uint8, device=device)
    if key in ("batch_decode", "xqa"):
        b, n, hq, hkv, d, page = grid["decode"]
        (k, v), table = _paged_pool(b, n, hkv, d, page, "NHD", dt, device, seed=1, planes=2)
        lens = torch.full((b,), n, dtype=torch.int32, device=device)
        q = _randn((b, hq, d), dt, device, seed=3)
        work = b * n * hkv * d * 2 * 2 + 2 * q.numel() * 2
        shape = f"{b} requests x {n} tokens, {hq}/{hkv} heads, D {d}, bf16 pages of {page}"
        if key == "batch_decode":
            out = torch.empty_like(q)

            def run():
                return kvattn.decode.xqa_batch_decode_with_kv_cache(
                    query=q, kv_cache=(k, v), workspace_buffer=ws, block_tables=table, seq_lens=lens,
                    max_seq_len=n, bmm1_scale=d ** -0.5, out=out)

            peers = PeerInputs(q.view(b, hq, 1, d), _gather(k, table, n, "NHD"), _gather(v, table, n, "NHD"),
                               d ** -0.5, causal=False)
            return Problem(key, "batch decode", shape, run, lambda o: o.view(b, hq, 1, d), work, "B", peers)
        q1 = q.view(b, 1, hq, d)
        out1 = torch.empty_like(q1)
        lens1 = lens.view(b, 1)
        sem = torch.zeros(64, dtype=torch.uint32, device=device)
        k_pool, v_pool = k.view(-1, d), v.view(-1, d)  # the seed's flat pools of head vectors

        def run_xqa():
            kvattn.xqa.xqa(q=q1, k_cache=k_pool, v_cache=v_pool, page_table=table, seq_lens=lens1, output=out1,
                           workspace_buffer=ws, semaphores=sem, num_kv_heads=hkv, page_size=page)
            return out1

        return Problem(key, "xqa", shape, run_xqa, lambda o: o.view(b, hq, 1, d), work, "B",
                       peer_note="same work as batch decode: see its peers")
    if key == "single_decode":
        n, h, d = grid["single"]
        q = _randn((h, d), dt, device, seed=4)
        k = _randn((n, h, d), dt, device, seed=5)
        v = _randn((n, h, d), dt, device, seed=6)

        def run():
            return kvattn.decode.single_decode_with_kv_cache(q=q, k=k, v=v)

        peers = PeerInputs(q.view(1, h, 1, d), k.transpose(0, 1).unsqueeze(0).contiguous(),
                           v.transpose(0, 1).unsqueeze(0).contiguous(), d ** -0.5, causal=False)
        return Problem(key, "single decode", f"{n} tokens, {h} heads, D {d}, bf16", run,
                       lambda o: o.view(1, h, 1, d), 2 * n * h * d * 2 + 2 * q.numel() * 2, "B", peers)
    if key == "mla":
        b, n, hq, page = grid["mla"]
        (cache,), table = _paged_pool(b, n, 1, 576, page, "NHD", dt, device, seed=7)
        cache = cache[:, :, 0]  # [P, page, 576]
        lens = torch.full((b,), n, dtype=torch.int32, device=device)
        q = _randn((b, 1, hq, 576), dt, device, seed=8)
        out = torch.empty(b, hq, 512, dtype=dt, device=device)
        scale = 192 ** -0.5  # DeepSeek's 1 / sqrt(128 + 64)

        def run():
            return kvattn.mla.xqa_batch_decode_with_kv_cache_mla(
                query=q, kv_cache=cache, workspace_buffer=ws, qk_nope_head_dim=128, kv_lora_rank=512,
                qk_rope_head_dim=64, block_tables=table, seq_lens=lens, max_seq_len=n, out=out, bmm1_scale=scale)

        rows = _gather(cache.unsqueeze(2), table, n, "NHD")  # [B, 1, L, 576]
        peers = PeerInputs(q.transpose(1, 2).contiguous(), rows, rows[..., :512], scale, causal=False,
                           flex="not tried: FlexAttention does not compile 576-wide heads")
        return Problem(key, "MLA decode", f"{b} requests x {n} tokens, {hq} heads, bf16 pages of {page}", run,
                       lambda o: o.view(b, hq, 1, 512), 2.0 * hq * b * n * (576 + 512), "FLOP", peers)
    if key == "prefill":
        b, n, hq, hkv, d, page = grid["prefill"]
        (k, v), table = _paged_pool(b, n, hkv, d, page, "HND", dt, device, seed=9, planes=2)
        q = _randn((b * n, hq, d), dt, device, seed=11)
        lens = torch.full((b,), n, dtype=torch.int32, device=device)
        cum = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=device)
        out = torch.empty_like(q)

        def run():
            return kvattn.prefill.trtllm_batch_context_with_kv_cache(
                query=q, kv_cache=(k, v), workspace_buffer=ws, block_tables=table, seq_lens=lens, max_q_len=n,
                max_kv_len=n, bmm1_scale=d ** -0.5, bmm2_scale=1.0, batch_size=b, cum_seq_lens_q=cum,
                cum_seq_lens_kv=cum, out=out, kv_layout="HND")

        peers = PeerInputs(q.view(b, n, hq, d).transpose(1, 2).contiguous(), _gather(k, table, n, "HND"),
                           _gather(v, table, n, "HND"), d ** -0.5, causal=True)
        flops = 4.0 * d * hq * b * (n * (n + 1) / 2)  # causal (query, key) pairs
        return Problem(key, "prefill", f"{b} requests x {n} new tokens (causal), {hq}/{hkv} heads, D {d}, "
                       f"bf16 pages of {page}", run, lambda o: o.view(b, n, hq, d).transpose(1, 2), flops,
                       "FLOP", peers)
    raise ValueError(f"unknown function {key!r}; expected one of {FUNCTION_KEYS}")


# ---------------------------------------------------------------------------------------------
# peers
# ---------------------------------------------------------------------------------------------
class NotAvailable(Exception):
    """A peer that cannot run this shape here (reported as "n/a", not as an error; the benchmark
    harness in ``benchmarks/`` raises this one too)."""


@dataclass
class Impl:
    name: str
    fn: Callable[[], torch.Tensor]  # one call, output [B, Hq, Lq, Dv] (after ``common``)
    common: Callable[[torch.Tensor], torch.Tensor]
    context: Callable = nullcontext
    note: str = ""


def _sdpa(p: PeerInputs, backend: str) -> Impl:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    enum = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def context():
        return sdpa_kernel([enum])

    b, hq, lq, d = p.q.shape
    hkv, dv = p.k.shape[1], p.v.shape[-1]
    g = hq // hkv
    note = ""
    if not p.causal:
        # Every key is visible: fold each KV head's query heads into query rows, K/V read once a head.
        q, k, v, kw = p.q.reshape(b, hkv, g * lq, d), p.k, p.v, {}

        def common(o):
            return o.reshape(b, hq, lq, dv)
    else:  # causal with as many queries as keys (prefill): is_causal's top-left alignment is exact
        assert lq == p.k.shape[2], "causal peers are built with Lq == L"
        q, k, v, kw = p.q, p.k, p.v, {"is_causal": True, "enable_gqa": g > 1}

        def common(o):
            return o

    def call(q=q, k=k, v=v, kw=kw):
        return F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kw)

    try:
        try_backend(call, context)
    except NotAvailable:
        if not kw.get("enable_gqa"):
            raise
        # This backend has no GQA: K/V with each head repeated for its query heads (outside the timing).
        k, v = p.k.repeat_interleave(g, dim=1), p.v.repeat_interleave(g, dim=1)
        kw = {"is_causal": True}
        try_backend(lambda: F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kw), context)
        note = "K/V heads repeated (no native GQA)"

        def call(q=q, k=k, v=v, kw=kw):
            return F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kw)

    return Impl(f"sdpa-{backend}", call, common, context, note)


def try_backend(fn, context) -> None:
    """One call under ``context``; torch's "no available kernel" becomes NotAvailable, with the
    reasons torch gives in its warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with context():
                fn()
        except RuntimeError as exc:
            text = str(exc)
            if any(m in text for m in ("No available kernel", "No viable backend", "not supported")):
                # torch says why in warnings: "<backend> kernel not used because:" then the reasons.
                reasons = [str(w.message).split("(Triggered internally")[0].strip() for w in caught]
                reasons = [r for r in reasons if r and not r.endswith("because:")]
                raise NotAvailable(_clip("; ".join(reasons) if reasons else "no kernel of this backend here")) from None
            raise


_compiled_flex = None


def _flex(p: PeerInputs) -> Impl:
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    flex = _compiled_flex
    b, hq, lq, _ = p.q.shape
    n = p.k.shape[2]
    gqa = hq != p.k.shape[1]
    mask = None
    if p.causal:
        def causal(bi, hi, qi, ki):
            return ki - qi <= n - lq

        mask = create_block_mask(causal, B=None, H=None, Q_LEN=lq, KV_LEN=n, device=p.q.device)

    def call():
        return flex(p.q, p.k, p.v, block_mask=mask, scale=p.scale, enable_gqa=gqa)

    return Impl("flex", call, lambda o: o)


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
class Timer:
    """Microseconds of one call: do_bench medians (L2 flushed) on a GPU, host medians on a CPU."""

    def __init__(self, device: torch.device, warmup_ms: int = 25, rep_ms: int = 100):
        self.device, self.warmup_ms, self.rep_ms = device, warmup_ms, rep_ms
        self.cuda = device.type == "cuda"

    def eager(self, fn, context=nullcontext) -> float:
        with context():
            fn()
            if not self.cuda:
                times, start = [], time.perf_counter()
                while len(times) < 3 or (time.perf_counter() - start < self.rep_ms / 1e3 and len(times) < 1000):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                return 1e6 * statistics.median(times)
            from triton.testing import do_bench

            torch.cuda.synchronize()
            return 1e3 * do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")

    def graph(self, fn, context=nullcontext) -> Optional[float]:
        """Replay of a CUDA graph holding one call (None on a CPU)."""
        if not self.cuda:
            return None
        from triton.testing import do_bench

        with context():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture stream, as torch asks
                fn()
                fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            torch.cuda.synchronize()
        try:
            return 1e3 * do_bench(g.replay, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")
        finally:
            del g


def _clip(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:160]


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.float(), ref.float()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def _measure(rec: dict, impl: Impl, timer: Timer, ref: Optional[torch.Tensor]) -> torch.Tensor:
    """Time ``impl`` into ``rec``; returns its output (in the common layout)."""
    t0 = time.perf_counter()
    with impl.context():
        out = impl.common(impl.fn())
    if timer.cuda:
        torch.cuda.synchronize()
    rec["first_call_s"] = round(time.perf_counter() - t0, 3)
    if ref is not None:
        rec["rel_err"] = _rel_err(out, ref)
    out = out.clone()
    rec["eager_us"] = timer.eager(impl.fn, impl.context)
    try:
        rec["graph_us"] = timer.graph(impl.fn, impl.context)
    except Exception as exc:  # noqa: BLE001 - a capture failure leaves the eager time standing
        rec["graph_error"] = _short(exc)
        if timer.cuda:
            torch.cuda.synchronize()
    return out


def environment(device: torch.device) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "triton": triton_version, "kvattn": __version__,
        "python": platform.python_version(), "cuda": torch.version.cuda,
    }
    return env


def method(device: torch.device) -> str:
    if device.type == "cuda":
        return ("us: triton.testing.do_bench medians, L2 flushed before every repetition; graph = replay of a CUDA "
                "graph holding one call, eager = plain calls (launch overhead included). Peers run on K/V "
                "gathered from the pages into contiguous [B, H, L, D] before timing (a paged cache would pay "
                "that gather on every call).")
    return ("us: medians of host-timed eager calls on the CPU (no CUDA graphs, no L2 flush): kvattn runs its "
            "plain-PyTorch reference here and torch its CPU attention, so these numbers only show that the "
            "command works; run it on a GPU to compare kernels.")


def run(device: torch.device, functions=FUNCTION_KEYS, *, peers: bool = True, flex: Optional[bool] = None,
        warmup_ms: int = 25, rep_ms: int = 100, progress: bool = True) -> dict:
    """Measure and return the results document (``env``, ``method``, ``records``)."""
    if flex is None:
        flex = device.type == "cuda"
    timer = Timer(device, warmup_ms, rep_ms)
    plan = []
    for key in functions:
        plan.append((key, "kvattn"))
        if peers and key != "xqa":
            plan += [(key, f"sdpa-{b}") for b in SDPA_BACKENDS] + [(key, "flex")]
    bar = Progress(len(plan), "kvattn bench", quiet=not progress)
    records: list[dict] = []
    problems: dict = {}
    refs: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # reference fallbacks and torch's backend notices: the table says
        for key, impl_name in plan:
            bar.step(f"{key}: {impl_name}")
            if key not in problems:
                problems.clear()  # one problem's inputs alive at a time
                refs.clear()
                problems[key] = build(key, device)
            prob = problems[key]
            rec = {"function": prob.function, "shape": prob.shape, "impl": impl_name, "status": "ok", "note": "",
                   "eager_us": None, "graph_us": None, "unit": prob.unit, "work": prob.work}
            records.append(rec)
            try:
                if impl_name == "kvattn":
                    from .runtime import backend as _backend

                    op = {"batch_decode": "batch_decode", "xqa": "batch_decode", "single_decode": "single_decode",
                          "mla": "mla_decode", "prefill": "context"}[key]
                    rec["backend"] = "triton" if _backend.use_triton(op, device) else "reference"
                    if rec["backend"] == "reference":
                        rec["note"] = "kvattn's reference backend"
                    if prob.peer_note:
                        rec["note"] = "; ".join(x for x in (rec["note"], prob.peer_note) if x)
                    refs[key] = _measure(rec, Impl("kvattn", prob.run, prob.common), timer, None)
                    continue
                if prob.peers is None:
                    rec.update(status="n/a", note=prob.peer_note)
                    continue
                if impl_name == "flex":
                    if not flex:
                        rec.update(status="skipped", note="FlexAttention not timed on a CPU (torch.compile there "
                                                          "takes minutes)" if device.type != "cuda" else "--no-flex")
                        continue
                    if prob.peers.flex:
                        rec.update(status="n/a", note=prob.peers.flex)
                        continue
                    impl = _flex(prob.peers)
                else:
                    impl = _sdpa(prob.peers, impl_name.split("-", 1)[1])
                rec["note"] = impl.note
                _measure(rec, impl, timer, refs.get(key))
            except NotAvailable as exc:
                rec.update(status="n/a", note=str(exc))
            except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the run
                rec.update(status="error", note=_short(exc))
                if device.type == "cuda":
                    torch.cuda.synchronize()
            finally:
                _rates(rec)
    bar.done()
    problems.clear()
    return {"env": environment(device), "method": method(device), "records": records}


def _rates(rec: dict) -> None:
    us = rec.get("graph_us") or rec.get("eager_us")
    rec["us"] = us
    if us and rec["status"] == "ok":
        rec["rate"] = rec["work"] / (us * 1e-6)


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def _ratio(x: float) -> str:
    return f"{x:.2f}x" if x >= 0.01 else f"{x:.1e}x"


def _us(x) -> str:
    return "-" if not x else (f"{x:.1f}" if x < 1000 else f"{x:.0f}")


def table_rows(doc: dict) -> list[tuple]:
    rows, kv_us, last = [], {}, None
    for r in doc["records"]:
        if r["impl"] == "kvattn":
            kv_us[r["function"]] = r.get("us")
    for r in doc["records"]:
        first = r["function"] != last
        last = r["function"]
        base = kv_us.get(r["function"])
        if r["status"] == "ok":
            ratio = _ratio(r["us"] / base) if base and r.get("us") else "-"
            err = "-" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
            rate = format_rate(r["rate"], r["unit"]) if r.get("rate") else "-"
            cells = (r["impl"], _us(r.get("graph_us")), _us(r.get("eager_us")), rate, ratio, err, r.get("note", ""))
        else:
            cells = (r["impl"], "-", "-", "-", "-", "-", f"{r['status']}: {r.get('note', '')}")
        rows.append(((r["function"], r["shape"]) if first else ("", "")) + cells)
    return rows


HEADER = ("function", "shape", "impl", "us graph", "us eager", "rate", "time / kvattn's", "err vs kvattn", "note")
WIDTH = 120  # columns of the default table (--wide: one line a record, as long as it takes)


def print_report(doc: dict, out=None, wide: bool = False) -> None:
    out = out or sys.stdout
    env = doc["env"]
    head = (f"kvattn {env['kvattn']} bench on {env['device']}, {env['date'][:16].replace('T', ' ')} UTC, "
            f"torch {env['torch']}, triton {env['triton']}")
    if wide:
        print(head, file=out)
        print(doc["method"], file=out)
        print(file=out)
        print_table(table_rows(doc), HEADER, out=out)
        return
    for text in (head, doc["method"]):
        print(textwrap.fill(text, WIDTH), file=out)
    print(file=out)
    _print_narrow(table_rows(doc), out)


def _print_narrow(rows: list[tuple], out) -> None:
    """The table in ``WIDTH`` columns: a title line a function (its shape), then a line a record
    with the numbers, its note wrapped beneath it."""
    cells = [r[2:-1] for r in rows]
    header = HEADER[2:-1]
    widths = [max(len(str(c[i])) for c in cells + [header]) for i in range(len(header))]

    def line(values):
        return ("  " + "  ".join(str(v).ljust(w) for v, w in zip(values, widths))).rstrip()

    print(line(header), file=out)
    for r, c in zip(rows, cells):
        if r[0]:
            print(textwrap.fill(f"{r[0]}: {r[1]}", WIDTH, subsequent_indent="  "), file=out)
        print(line(c), file=out)
        if r[-1]:
            print(textwrap.fill(r[-1], WIDTH, initial_indent="      ", subsequent_indent="      "), file=out)


def plot(doc: dict, path: str) -> None:
    """Bars of each implementation's time per function (graph replay where there is one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    functions = []
    for r in doc["records"]:
        if r["function"] not in functions:
            functions.append(r["function"])
    fig, axes = plt.subplots(len(functions), 1, figsize=(9, 1.2 + 1.6 * len(functions)), squeeze=False)
    for ax, fn in zip(axes[:, 0], functions):
        recs = [r for r in doc["records"] if r["function"] == fn and r["status"] == "ok" and r.get("us")]
        names = [r["impl"] for r in recs]
        values = [r["us"] for r in recs]
        colours = ["#d62728" if n == "kvattn" else "#1f77b4" if n.startswith("sdpa") else "#2ca02c" for n in names]
        ax.barh(names, values, color=colours)
        ax.invert_yaxis()
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.0f}" if v >= 100 else f" {v:.1f}", va="center", fontsize=7)
        shape = recs[0]["shape"] if recs else ""
        ax.set_title(f"{fn}: {shape}", fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
        ax.set_xlabel("us per call (lower is better)", fontsize=7)
    env = doc["env"]
    fig.suptitle(f"kvattn {env['kvattn']} bench, {env['device']}, {env['date'][:10]}, torch {env['torch']}, "
                 f"triton {env['triton']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")
    p.add_argument("--only", type=function_list, default=FUNCTION_KEYS, metavar="LIST",
                   help=f"comma-separated subset of {','.join(FUNCTION_KEYS)}")
    p.add_argument("--no-peers", dest="peers", action="store_false", help="time kvattn alone")
    p.add_argument("--no-flex", dest="flex", action="store_false", default=None, help="skip FlexAttention")
    p.add_argument("--rep-ms", type=positive_int, default=100, help="time spent measuring each call, ms")
    p.add_argument("--json", metavar="FILE", default=None, help="write the results document (JSON)")
    p.add_argument("--plot", metavar="FILE", default=None, help="write a bar chart (PNG; needs matplotlib)")
    p.add_argument("--wide", action="store_true",
                   help=f"one table line a record, shapes and notes in their own columns (default: {WIDTH} columns)")


def main(args, device: torch.device) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
    doc = run(device, args.only, peers=args.peers, flex=args.flex, rep_ms=args.rep_ms)
    print_report(doc, wide=args.wide)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
            f.write("\n")
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(doc, args.plot)
        print(f"wrote {args.plot}")
    failed = [r for r in doc["records"] if r["impl"] == "kvattn" and r["status"] != "ok"]
    return 1 if failed else 0

