"""Every call form of the five public functions replayed on the GPU (kvattn.runtime.callcache): output
given or allocated, LSE not asked for, allocated or given, pages of 16 and 64, a bf16 and an fp8
cache. Each form is replayed (the cache's hit count grows), gives the bits of the same call with
the cache off, and agrees with the reference backend on CPU copies; allocated outputs are fresh
tensors each call, given ones are written through (poisoned before every call). CUDA-graph capture
of an allocating call records its launches and allocations into the graph."""

from __future__ import annotations

import os

import pytest
import torch

import kvattn
from kvattn.runtime import callcache as _callcache
from kvattn.testing import make_paged_kv, poison_, relative_error

ON_GPU = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="replays launch compiled kernels on a GPU")]

FP8 = torch.float8_e4m3fn
LENS = (700, 1, 2500, 0)  # off-page lengths, a one-token request and an empty one


def batch_case(page, kv_fmt, device):
    case = make_paged_kv(list(LENS), num_kv_heads=2, head_dim=128, page_size=page, dtype=torch.bfloat16,
                         kv_format=kv_fmt, device=device, seed=page)
    q = torch.randn(len(LENS), 16, 128, device=device).to(torch.bfloat16)
    ws = torch.zeros(32 << 20, dtype=torch.uint8, device=device)
    args = (q, case.kv_cache, ws, case.block_tables, case.seq_lens, max(LENS))
    return kvattn.decode.xqa_batch_decode_with_kv_cache, args, dict(bmm1_scale=128 ** -0.5), (len(LENS), 16)


def xqa_case(page, kv_fmt, device):
    case = make_paged_kv(list(LENS), num_kv_heads=2, head_dim=128, page_size=page, dtype=torch.bfloat16,
                         kv_format=kv_fmt, device=device, seed=page + 1)
    q = torch.randn(len(LENS), 1, 16, 128, device=device).to(torch.bfloat16)
    k, v = (case.kv_cache[:, i].reshape(-1, 128).clone() for i in (0, 1))
    lens = case.seq_lens.view(-1, 1).to(torch.uint32)
    ws = torch.zeros(32 << 20, dtype=torch.uint8, device=device)
    semaphores = torch.zeros(128, dtype=torch.uint32, device=device)
    args = (q, k, v, case.block_tables, lens, torch.empty_like(q), ws, semaphores, 2, page)
    return kvattn.xqa.xqa, args, {}, (len(LENS), 1, 16)


def single_case(page, kv_fmt, device):
    q = torch.randn(32, 128, device=device).to(torch.bfloat16)
    dtype = FP8 if kv_fmt == "fp8" else torch.bfloat16
    k, v = (torch.randn(3001, 8, 128, device=device).to(dtype) for _ in range(2))
    return kvattn.decode.single_decode_with_kv_cache, (q, k, v), {}, (32,)


def mla_case(page, kv_fmt, device):
    case = make_paged_kv(list(LENS), num_kv_heads=1, head_dim=576, page_size=page, dtype=torch.bfloat16,
                         kv_format=kv_fmt, form="shared", device=device, seed=page + 2)
    q = torch.randn(len(LENS), 1, 16, 576, device=device).to(torch.bfloat16)
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device=device)
    args = (q, case.kv_cache[:, 0, :, 0], ws, 128, 512, 64, case.block_tables, case.seq_lens, max(LENS))
    return kvattn.mla.xqa_batch_decode_with_kv_cache_mla, args, dict(bmm1_scale=192 ** -0.5), (len(LENS), 16)


def prefill_case(page, kv_fmt, device):
    lens, lq = (300, 1, 70), (50, 1, 70)
    case = make_paged_kv(list(lens), num_kv_heads=2, head_dim=128, page_size=page, dtype=torch.bfloat16,
                         kv_format=kv_fmt, layout="HND", device=device, seed=page + 3)
    cum_q = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cum_kv = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(int(cum_q[-1]), 8, 128, device=device).to(torch.bfloat16)
    args = (q, case.kv_cache, torch.zeros(32 << 20, dtype=torch.uint8, device=device), case.block_tables,
            case.seq_lens, max(lq), max(lens), 128 ** -0.5, 1.0, len(lens), cum_q, cum_kv)
    return kvattn.prefill.trtllm_batch_context_with_kv_cache, args, {}, (q.shape[0], 8)


BUILDERS = {"batch": batch_case, "xqa": xqa_case, "single": single_case, "mla": mla_case, "prefill": prefill_case}
FORMS = ("out", "no-out", "out+lse", "lse", "no-out+lse")  # as in benchmarks/host_time.py
GRID = [(name, page, kv, form) for name in BUILDERS for page in ((None,) if name == "single" else (16, 64))
        for kv in ("bf16", "fp8") for form in FORMS if not (name == "xqa" and form.startswith("no-out"))]


def _call(fn, args, base, form, out, lse):
    """The call of ``form``: ``out`` / ``lse`` given where the form gives them (xqa's output is
    its positional argument)."""
    kw = dict(base)
    if fn is not kvattn.xqa.xqa:
        kw["out"] = None if form.startswith("no-out") else out
    if "lse" in form:
        kw["return_lse"], kw["lse"] = True, (lse if form == "out+lse" else None)
    got = fn(*args, **kw)
    if fn is kvattn.xqa.xqa:
        return args[5], got
    return got if "lse" in form else (got, None)


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    return type(x)(map(_cpu, x)) if isinstance(x, (tuple, list)) else x


def _cache(fn):
    return {c.name: c for c in _callcache._caches}[fn.__name__]


@pytest.mark.parametrize("name, page, kv, form", GRID,
                         ids=[f"{n}-{'p' + str(p) if p else 'contiguous'}-{k}-{f}" for n, p, k, f in GRID])
def test_every_form_is_replayed_and_correct(name, page, kv, form, monkeypatch):
    device = torch.device("cuda")
    fn, args, base, lse_shape = BUILDERS[name](page, "fp8" if kv == "fp8" else None, device)
    out = torch.empty_like(args[0]) if name != "mla" else torch.empty(args[0].shape[0], 16, 512, device=device,
                                                                        dtype=torch.bfloat16)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=device)
    given = (out, lse, args[5]) if name == "xqa" else (out, lse)
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    for t in given:
        poison_(t)
    want = [t.clone() if t is not None else None for t in _call(fn, args, base, form, out, lse)]
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    cache = _cache(fn)
    results = []
    for i in range(4):  # seen, recorded, then replayed twice
        for t in given:
            poison_(t)
        hits = cache.hits
        got = _call(fn, args, base, form, out, lse)
        if i >= 2:
            assert cache.hits == hits + 1, "not replayed"
            results.append(got)
    torch.cuda.synchronize()
    for got in results:
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            if g is not None:  # the ordinary call's kernels: the same bits
                assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
        if not form.startswith("no-out") and name != "xqa":
            assert got[0] is out
        if form == "out+lse":
            assert got[1] is lse
    fresh = [t for got in results for t in got if t is not None and t is not out and t is not lse
             and not (name == "xqa" and t is args[5])]
    assert len({t.data_ptr() for t in fresh}) == len(fresh)  # a new allocation each replay
    # The reference backend on CPU copies.
    with_cpu = _cpu(args)
    ref_out = _cpu(out).clone()
    if name == "xqa":
        with_cpu = (*with_cpu[:5], ref_out, *with_cpu[6:])
    ref = _call(fn, with_cpu, base, form, ref_out, _cpu(lse).clone())
    got_out, got_lse = results[-1]
    assert relative_error(got_out.cpu().float(), ref[0].float()) <= 2e-2
    if got_lse is not None:
        finite = torch.isfinite(ref[1])
        assert torch.equal(finite, torch.isfinite(got_lse.cpu()))
        assert torch.allclose(got_lse.cpu()[finite], ref[1][finite], atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("name", ["batch", "mla", "prefill", "single"])
def test_an_allocating_call_captured_in_a_cuda_graph(name, monkeypatch):
    """A replayed allocating call captured in a graph: the graph's replay rewrites the allocations the
    capture returned, with the eager call's bits (single decode bypasses the cache while capturing)."""
    device = torch.device("cuda")
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    fn, args, base, _ = BUILDERS[name](16, None, device)
    for _ in range(3):
        want = [t.clone() for t in fn(*args, **base, return_lse=True)]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = fn(*args, **base, return_lse=True)
    for t in got:
        poison_(t)
    graph.replay()
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))


def test_the_forms_table_runs(tmp_path):
    """``benchmarks/host_time.py --forms-only`` on the GPU: every form of every row replayed, with the
    bits of the same call with everything given."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root / "src"))
    # (--seconds 0: every row, however long its first calls compile)
    got = subprocess.run([sys.executable, str(root / "benchmarks" / "host_time.py"), "--forms-only", "--form-calls",
                          "30", "--seconds", "0", "--json", str(tmp_path / "forms.json")], capture_output=True,
                         text=True, env=env, cwd=root, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    rows = json.loads((tmp_path / "forms.json").read_text())["forms"]
    assert rows and all("error" not in row for row in rows), [row.get("error") for row in rows]
    for row in rows:
        assert row["bits"], row
        assert all(f["replayed"] for f in row["forms"].values()), row
        assert row["launch"]["median"] > 0, row  # (its launch floor: the call is replayed)
