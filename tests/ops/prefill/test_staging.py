"""Pages of a quantised cache staged in the workspace (``kvattn.ops.prefill.staging``).

The staging kernel (in Triton's interpreter on a CPU-only machine, float16 pages; compiled, with
fp8 and NVFP4 read as words, where a GPU is present): every staged token equals
the cache's dequantised value (``make_paged_kv``'s float32 tokens), tokens past a request's length
and tokens of unusable page ids are zeros (the cache holds NaN there), chunks before a window's
first key tile are left alone, and the table points each request's page at its staged copy. The
host's choices: which calls stage, how much workspace they need, where the views sit (after the
decode kernels' counters, which must stay zero). The GPU tier (staged launches through the Gluon
kernel against the oracles) is ``test_gluon_ws``'s staged cases.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvattn._inputs import paged_kv_from_cache
from kvattn.formats import FP8_DTYPE
from kvattn.runtime.workspace import COUNTER_BYTES
from kvattn.ops.prefill import staging
from kvattn.testing import make_paged_kv


# The interpreter on a CPU-only machine; the compiled kernel (fp8 and NVFP4 read as words) on a GPU.
DEVICE = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _case(fmt, layout, page, lens, lq, hkv=2, d=64, seed=0, split=False, device=torch.device("cpu")):
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, kv_format=fmt, layout=layout,
                         form="tuple" if split else "stacked", seed=seed, split_tables=split, device=device)
    kv = paged_kv_from_cache(case.kv_cache, case.block_tables, layout, d, device, kv_sf=case.kv_cache_sf,
                             split_tables=split)
    cum = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return case, kv, cum


@pytest.mark.parametrize("fmt,layout,page,window,qdt,split", [
    ("fp8", "HND", 16, -1, torch.float16, False),  # staged in pages of 64: a chunk spans 4 cache pages
    ("fp8", "NHD", 128, -1, torch.float16, False),  # two programs a page
    ("nvfp4", "HND", 32, -1, torch.float16, False),
    ("nvfp4", "NHD", 64, -1, torch.float16, True),
    ("fp8", "HND", 16, 130, torch.float16, False),  # chunked rows under a window: early chunks skipped
    ("fp8", "NHD", 16, -1, FP8_DTYPE, True),  # fp8 query: V only, in K's form and pages
    ("float16", "NHD", 8, 70, torch.float16, True),  # a 16-bit cache in small pages, staged in pages of 64
], ids=["fp8-HND-p16", "fp8-NHD-p128", "nvfp4-HND-p32", "nvfp4-NHD-p64-split-tables", "fp8-HND-p16-window130",
        "fp8q-fp8-NHD-p16-V-only", "fp16-NHD-p8-window70-split-tables"])
def test_staged_pages_are_the_dequantised_tokens(fmt, layout, page, window, qdt, split):
    lens, lq = [1, 300, 0, 77, 520], [1, 40, 0, 77, 9]
    case, kv, cum = _case(fmt, layout, page, lens, lq, split=split, seed=page, device=DEVICE)
    # wild table entries on used pages: an id past the cache and a negative one (read as zeros)
    k_table = kv.k_table.clone()
    v_table = k_table if not split else kv.v_table.clone()
    k_table[1, 2] = kv.k.shape[0] + 5
    v_table[4, 1] = -3
    both = qdt != FP8_DTYPE
    dst_page = staging.staged_page(page, both)
    dst_pages = -(-k_table.shape[1] * page // dst_page)
    q = torch.zeros(sum(lq), 8, 64, dtype=qdt, device=DEVICE)
    ws = torch.zeros(COUNTER_BYTES + 64 + staging.staged_bytes(len(lens), dst_pages, dst_page, 2, 64, both),
                     dtype=torch.uint8, device=DEVICE)
    staged = staging.plan(q, kv.k, k_table, ws, max_q_len=4096, max_kv_len=10**6)
    assert staged is not None
    assert (staged.k is None) == (not both) and staged.v.shape == (len(lens) * dst_pages, dst_page, 2, 64)
    for t in (staged.k, staged.v):
        if t is not None:
            t.fill_(float("nan"))
    run, call = staging.launch(staged, q, kv.k, kv.v, kv.k_sf, kv.v_sf, k_table, v_table, case.seq_lens, cum,
                               window_left=window, interpreter=DEVICE.type == "cpu")
    run(call)
    k_table, v_table = k_table.cpu(), v_table.cpu()
    staged = staged._replace(**{f: getattr(staged, f).cpu() for f in ("k", "v", "table")
                                if getattr(staged, f) is not None})
    assert torch.equal(staged.table, torch.arange(len(lens) * dst_pages, dtype=torch.int32).view(len(lens), dst_pages))
    chunk = math.gcd(dst_page, staging.TOKENS)  # tokens a program
    planes = [(staged.v, case.v_tokens, v_table)] + ([(staged.k, case.k_tokens, k_table)] if both else [])
    for dst, tokens, table in planes:
        for b, n in enumerate(lens):
            first = 0 if window < 0 else max(n - lq[b] - window, 0) // staging.KEY_ALIGN * staging.KEY_ALIGN
            flat = dst[b * dst_pages:(b + 1) * dst_pages].flatten(0, 1).float()  # [tokens, Hkv, D]
            for t0 in range(0, -(-n // dst_page) * dst_page, chunk):
                got = flat[t0:t0 + chunk]
                if t0 + chunk <= first:  # wholly before the window's first key tile: never read, not staged
                    assert torch.isnan(got).all(), (b, t0)
                    continue
                want = torch.zeros_like(got)
                for i in range(chunk):
                    t = t0 + i
                    if t < n and 0 <= int(table[b, t // page]) < kv.k.shape[0]:
                        want[i] = tokens[b][t].cpu()
                assert torch.equal(got, want), (b, t0)
            if first:
                assert torch.isnan(flat[0]).all()


def test_which_calls_stage():
    """A 16-bit query over an fp8 or NVFP4 cache stages K and V; an fp8 query over an fp8 cache V
    only; a 16-bit cache of the query's type in pages under 64 tokens; not other 16-bit caches or
    an fp8 query over NVFP4."""
    assert staging.stages(torch.bfloat16, FP8_DTYPE, 64) and staging.stages(torch.float16, torch.uint8, 16)
    assert staging.stages(FP8_DTYPE, FP8_DTYPE, 64)
    assert staging.stages(torch.bfloat16, torch.bfloat16, 16) and staging.stages(torch.float16, torch.float16, 32)
    assert not staging.stages(torch.bfloat16, torch.bfloat16, 64) and not staging.stages(FP8_DTYPE, torch.uint8, 64)
    assert not staging.stages(torch.float16, torch.bfloat16, 16)
    assert staging.staged_dtype(torch.bfloat16) == torch.bfloat16 and staging.staged_dtype(FP8_DTYPE) == torch.float16
    assert staging.staged_page(16, True) == 64 and staging.staged_page(128, True) == 128
    assert staging.staged_page(16, False) == 16  # (V alone: K's pages)


def test_room_follows_the_callers_bound_of_lengths():
    """A request gets room for ``max_kv_len`` keys (rounded up to a staged page), not the table's
    width, and its length is clamped there; a bound past the table keeps the table's capacity."""
    _, kv, _ = _case("fp8", "HND", 16, [100, 30], [100, 30])
    q = torch.zeros(130, 8, 64, dtype=torch.bfloat16)
    ws = torch.zeros(64 << 20, dtype=torch.uint8)
    width = kv.k_table.shape[1] * 16
    for bound, room in ((100, 128), (64, 64), (10**6, -(-width // 64) * 64)):
        staged = staging.plan(q, kv.k, kv.k_table, ws, 4096, bound)
        assert staged.table.shape == (2, room // 64) and staged.v.shape[:2] == (2 * room // 64, 64)
        assert staged.capacity == min(room, width)
    assert staging.plan(q, kv.k, kv.k_table, ws, 4096, 0) is None


def test_staging_pays_for_nvfp4_always_and_otherwise_with_enough_rows(monkeypatch):
    """NVFP4's alternative is the Triton kernel: always staged. fp8's is the converter partition,
    small 16-bit pages' a box a page: staged where max_q_len x the GQA group reaches the table's
    threshold for the kind."""
    from kvattn.ops.prefill import configs as prefill_configs

    monkeypatch.setitem(prefill_configs.STAGE_MIN_ROWS, "fp8", 1000)
    monkeypatch.setitem(prefill_configs.STAGE_MIN_ROWS, "fp8q", 500)
    monkeypatch.setitem(prefill_configs.STAGE_MIN_ROWS, "half", 2000)
    assert staging.pays(torch.bfloat16, torch.uint8, 1, 1)
    assert staging.pays(torch.bfloat16, FP8_DTYPE, 250, 4) and not staging.pays(torch.bfloat16, FP8_DTYPE, 249, 4)
    assert staging.pays(FP8_DTYPE, FP8_DTYPE, 125, 4) and not staging.pays(FP8_DTYPE, FP8_DTYPE, 124, 4)
    assert staging.pays(torch.float16, torch.float16, 500, 4) and not staging.pays(torch.bfloat16, torch.bfloat16, 499, 4)


def test_views_fit_the_workspace_after_the_counters():
    """The staged views start past the decode kernels' counters (zero at rest), 1024-aligned, and
    end inside the workspace; a workspace one byte short stages nothing (the call converts tile by
    tile instead)."""
    _, kv, _ = _case("fp8", "HND", 16, [100, 30], [100, 30])
    b, pps = kv.k_table.shape
    dst_pages = -(-pps * 16 // 64)  # (pages of 16 staged in pages of 64)
    need = staging.staged_bytes(b, dst_pages, 64, 2, 64, True)
    q = torch.zeros(130, 8, 64, dtype=torch.bfloat16)
    base = torch.zeros(COUNTER_BYTES + need + 64, dtype=torch.uint8)
    ws = base[3:]  # a misaligned start
    staged = staging.plan(q, kv.k, kv.k_table, ws, 4096, 10**6)
    assert staged is not None
    lo = (-ws.data_ptr()) % 16 + COUNTER_BYTES
    for t in (staged.k, staged.v, staged.table):
        start = t.data_ptr() - ws.data_ptr()
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))  # the view's last element
        assert start >= lo and start + (last + 1) * t.element_size() <= ws.numel()
    for t in (staged.k, staged.v):
        assert (t.data_ptr() % staging.STAGE_ALIGN) == 0 and t.dtype == torch.bfloat16
        assert t.shape == (b * dst_pages, 64, 2, 64) and t.stride(1) == 64 and t.stride(2) == 64 * 64  # HND
    short = base[: (-base.data_ptr()) % 16 + COUNTER_BYTES + need - 1]
    assert staging.plan(q, kv.k, kv.k_table, short, 4096, 10**6) is None
    assert staging.plan(q, kv.k, kv.k_table, None, 4096, 10**6) is None
    assert staging.plan(q, kv.k, kv.k_table, ws, 1, 10**6) is None  # (fp8: one query row a head does not pay)
    half = kv.k.view(torch.float16)[..., :32]  # (a 16-bit cache in pages of 16)
    assert staging.plan(q, half, kv.k_table, ws, 4096, 10**6) is None  # of another type than the query's
    assert staging.plan(q.to(torch.float16), half, kv.k_table, ws, 4096, 10**6) is not None


def _facts(q, kv, workspace, *, nvfp4_out=False):
    """A prefill call's host facts (``plan.PrefillFacts``) on a GPU (compiled kernels), as
    ``launch_context`` reads them from its tensors."""
    from kvattn.ops.prefill import plan as prefill_launch
    from kvattn.runtime.common import words_aligned

    k, v = kv.k, kv.v
    return prefill_launch.PrefillFacts(
        device=torch.device("cuda", 0), interpreter=False, q_shape=q.shape, q_stride=q.stride(), q_dtype=q.dtype,
        k_shape=k.shape, k_stride=k.stride(), v_shape=v.shape, v_stride=v.stride(), kv_dtype=k.dtype,
        v_dtype=v.dtype, k_aligned16=k.data_ptr() % 16 == 0, v_aligned16=v.data_ptr() % 16 == 0,
        kv_aligned4=words_aligned(k, v, None, None), q_copyable=prefill_launch.q_copies_whole(q), ksf_stride=None,
        vsf_stride=None, kt_shape=kv.k_table.shape,
        kt_stride=kv.k_table.stride(), vt_stride=kv.v_table.stride(), same_table=kv.k_table is kv.v_table,
        batch=kv.k_table.shape[0], has_sinks=False, has_logit=False, has_out_scale=False, q_sign=1,
        out_stride=q.stride(), out_dtype=q.dtype, sf_cols=4 if nvfp4_out else None, sf_start=0, lse_stride=None,
        window_left=-1, skip=False, causal=True, gluon_on=True, ws_usable=staging.usable_bytes(workspace),
    )


def test_the_launcher_stages_where_the_kernel_takes_the_copies(monkeypatch):
    """The host's choice on a (faked) Hopper GPU: a call whose copies fit and pay stages them and
    launches the Gluon kernel on the copies, their table and their capacity; where the kernel would
    not take the copies (here: an NVFP4 output), nothing is staged and the cache is planned as it
    is; a workspace too small stages nothing."""
    import types

    from kvattn.ops.prefill import plan_gluon_ws as prefill_ws
    from kvattn.ops.prefill import plan as prefill_launch

    _, kv, _ = _case("fp8", "HND", 16, [100, 30], [100, 30])
    q = torch.zeros(130, 8, 64, dtype=torch.bfloat16)
    planned, built = [], []

    def fake_plan(*, k, v, nvfp4_out, **_):
        planned.append((k.dtype, v.shape[1], nvfp4_out))
        return None if nvfp4_out and k.dtype == torch.bfloat16 else ("cfg", "k_view", "v_view")

    def fake_launch(cfg, f, k, v, k_view, v_view, *, kt_stride, vt_stride, max_q_len, sm_count, capacity):
        built.append(dict(k=k, v=v, kt_stride=kt_stride, vt_stride=vt_stride, capacity=capacity))
        return len(built)  # (stands for the launch)

    monkeypatch.setattr(prefill_ws, "plan", fake_plan)
    monkeypatch.setattr(prefill_ws, "launch", fake_launch)
    monkeypatch.setattr(prefill_launch, "_device", types.SimpleNamespace(has_tma=lambda device: False,
                                                                         sm_count=lambda device: 132))
    monkeypatch.setattr(prefill_launch, "arch", lambda device, interpreter: "sm90")
    monkeypatch.setattr(prefill_launch, "words_allowed", lambda *args: False)
    ws = torch.zeros(64 << 20, dtype=torch.uint8)
    route = prefill_launch._Plan(_facts(q, kv, ws)).route(4096, 100)
    staged = staging.views(ws, route.staging)
    assert route.gluon and route.launch == 1
    (got,) = built
    assert got["k"].shape == staged.k.shape and got["k"].stride == staged.k.stride() and got["k"].aligned16
    assert got["v"].shape == staged.v.shape and got["v"].stride == staged.v.stride()
    assert got["kt_stride"] == got["vt_stride"] == staged.table.stride()
    assert staged.k.dtype == torch.bfloat16 and staged.k.shape[1] == 64 and got["capacity"] == staged.capacity == 128
    planned.clear()
    built.clear()
    route = prefill_launch._Plan(_facts(q, kv, ws, nvfp4_out=True)).route(4096, 100)
    assert planned == [(torch.bfloat16, 64, True), (FP8_DTYPE, 16, True)]  # the copies, then the cache
    assert route.gluon and route.staging is None
    assert built[0]["k"].shape == kv.k.shape and built[0]["kt_stride"] == kv.k_table.stride()
    assert built[0]["capacity"] == kv.k_table.shape[1] * 16
    small = torch.zeros(1 << 16, dtype=torch.uint8)
    route = prefill_launch._Plan(_facts(q, kv, small)).route(4096, 100)
    assert route.gluon and route.staging is None
