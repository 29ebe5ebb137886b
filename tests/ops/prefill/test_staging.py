"""Pages of a quantised cache staged in the workspace (``kvattn.ops.prefill.staging``).

CPU tier (the staging kernel in Triton's interpreter, float16 pages): every staged token equals
the cache's dequantised value (``make_paged_kv``'s float32 tokens), tokens past a request's length
and tokens of unusable page ids are zeros (the cache holds NaN there), chunks before a window's
first key tile are left alone, and the table points each request's page at its staged copy. The
host's choices: which calls stage, how much workspace they need, where the views sit (after the
decode kernels' counters, which must stay zero). The GPU tier (staged launches through the Gluon
kernel against the oracles) is ``test_gluon_ws``'s staged cases.
"""

from __future__ import annotations

import pytest
import torch

from kvattn._inputs import paged_kv_from_cache
from kvattn.formats import FP8_DTYPE
from kvattn.ops.launch.workspace import COUNTER_BYTES
from kvattn.ops.prefill import staging
from kvattn.testing import make_paged_kv


def _case(fmt, layout, page, lens, lq, hkv=2, d=64, seed=0, split=False):
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, kv_format=fmt, layout=layout,
                         form="tuple" if split else "stacked", seed=seed, split_tables=split)
    kv = paged_kv_from_cache(case.kv_cache, case.block_tables, layout, d, torch.device("cpu"), kv_sf=case.kv_cache_sf,
                             split_tables=split)
    cum = torch.tensor([0, *torch.tensor(lq).cumsum(0).tolist()], dtype=torch.int32)
    return case, kv, cum


@pytest.mark.parametrize("fmt,layout,page,window,qdt,split", [
    ("fp8", "HND", 16, -1, torch.float16, False),
    ("fp8", "NHD", 128, -1, torch.float16, False),  # two programs a page
    ("nvfp4", "HND", 32, -1, torch.float16, False),
    ("nvfp4", "NHD", 64, -1, torch.float16, True),
    ("fp8", "HND", 16, 130, torch.float16, False),  # chunked rows under a window: early chunks skipped
    ("fp8", "NHD", 16, -1, FP8_DTYPE, True),  # fp8 query: V only, in K's form
], ids=["fp8-HND-p16", "fp8-NHD-p128", "nvfp4-HND-p32", "nvfp4-NHD-p64-split-tables", "fp8-HND-p16-window130",
        "fp8q-fp8-NHD-p16-V-only"])
def test_staged_pages_are_the_dequantised_tokens(fmt, layout, page, window, qdt, split):
    lens, lq = [1, 300, 0, 77, 520], [1, 40, 0, 77, 9]
    case, kv, cum = _case(fmt, layout, page, lens, lq, split=split, seed=page)
    # wild table entries on used pages: an id past the cache and a negative one (read as zeros)
    k_table = kv.k_table.clone()
    v_table = k_table if not split else kv.v_table.clone()
    k_table[1, 2] = kv.k.shape[0] + 5
    v_table[4, 1] = -3
    q = torch.zeros(sum(lq), 8, 64, dtype=qdt)
    ws = torch.zeros(COUNTER_BYTES + 64 + staging.staged_bytes(*k_table.shape, page, 2, 64, qdt != FP8_DTYPE),
                     dtype=torch.uint8)
    staged = staging.plan(q, kv.k, k_table, ws, max_q_len=4096)
    assert staged is not None
    assert (staged.k is None) == (qdt == FP8_DTYPE)
    for t in (staged.k, staged.v):
        if t is not None:
            t.fill_(float("nan"))
    staging.launch(staged, q, kv.k, kv.v, kv.k_sf, kv.v_sf, k_table, v_table, case.seq_lens, cum,
                   window_left=window, interpreter=True)
    pps = k_table.shape[1]
    assert torch.equal(staged.table, torch.arange(len(lens) * pps, dtype=torch.int32).view(len(lens), pps))
    planes = [(staged.v, case.v_tokens, v_table)] + ([(staged.k, case.k_tokens, k_table)] if staged.k is not None else [])
    for dst, tokens, table in planes:
        for b, n in enumerate(lens):
            first = 0 if window < 0 else max(n - lq[b] - window, 0) // staging.KEY_ALIGN * staging.KEY_ALIGN
            for p in range(-(-n // page)):
                got = dst[b * pps + p].float()  # [page, Hkv, D]
                want = torch.zeros_like(got)
                lo, hi = p * page, min(n, (p + 1) * page)
                bad = not (0 <= int(table[b, p]) < kv.k.shape[0])
                if not bad:
                    want[: hi - lo] = tokens[b][lo:hi]
                # chunks of a page wholly before the window's first key tile are never read: not staged
                chunk = min(page, staging.TOKENS)  # tokens a program
                for c0 in range(0, page, chunk):
                    rows = slice(c0, c0 + chunk)
                    if lo + c0 + chunk <= first:
                        assert torch.isnan(got[rows]).all(), (b, p, c0)
                    else:
                        assert torch.equal(got[rows], want[rows]), (b, p, c0)
            assert first == 0 or torch.isnan(dst[b * pps]).all()


def test_which_calls_stage():
    """A 16-bit query over an fp8 or NVFP4 cache stages K and V; an fp8 query over an fp8 cache V
    only; 16-bit caches and an fp8 query over NVFP4 do not stage."""
    assert staging.stages(torch.bfloat16, FP8_DTYPE) and staging.stages(torch.float16, torch.uint8)
    assert staging.stages(FP8_DTYPE, FP8_DTYPE)
    assert not staging.stages(torch.bfloat16, torch.bfloat16) and not staging.stages(FP8_DTYPE, torch.uint8)
    assert staging.staged_dtype(torch.bfloat16) == torch.bfloat16 and staging.staged_dtype(FP8_DTYPE) == torch.float16


def test_staging_pays_for_nvfp4_always_and_for_fp8_with_enough_rows(monkeypatch):
    """NVFP4's alternative is the Triton kernel: always staged. fp8's is the converter partition:
    staged where max_q_len x the GQA group reaches the table's threshold."""
    from kvattn.ops.prefill import configs as prefill_configs

    monkeypatch.setitem(prefill_configs.STAGE_MIN_ROWS, False, 1000)
    monkeypatch.setitem(prefill_configs.STAGE_MIN_ROWS, True, 500)
    assert staging.pays(torch.bfloat16, torch.uint8, 1, 1)
    assert staging.pays(torch.bfloat16, FP8_DTYPE, 250, 4) and not staging.pays(torch.bfloat16, FP8_DTYPE, 249, 4)
    assert staging.pays(FP8_DTYPE, FP8_DTYPE, 125, 4) and not staging.pays(FP8_DTYPE, FP8_DTYPE, 124, 4)


def test_views_fit_the_workspace_after_the_counters():
    """The staged views start past the decode kernels' counters (zero at rest), 1024-aligned, and
    end inside the workspace; a workspace one byte short stages nothing (the call converts tile by
    tile instead)."""
    _, kv, _ = _case("fp8", "HND", 16, [100, 30], [100, 30])
    b, pps = kv.k_table.shape
    need = staging.staged_bytes(b, pps, 16, 2, 64, True)
    q = torch.zeros(130, 8, 64, dtype=torch.bfloat16)
    base = torch.zeros(COUNTER_BYTES + need + 64, dtype=torch.uint8)
    ws = base[3:]  # a misaligned start
    staged = staging.plan(q, kv.k, kv.k_table, ws, 4096)
    assert staged is not None
    lo = (-ws.data_ptr()) % 16 + COUNTER_BYTES
    for t in (staged.k, staged.v, staged.table):
        start = t.data_ptr() - ws.data_ptr()
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))  # the view's last element
        assert start >= lo and start + (last + 1) * t.element_size() <= ws.numel()
    for t in (staged.k, staged.v):
        assert (t.data_ptr() % staging.STAGE_ALIGN) == 0 and t.dtype == torch.bfloat16
        assert t.shape == (b * pps, 16, 2, 64) and t.stride(1) == 64 and t.stride(2) == 16 * 64  # HND
    short = base[: (-base.data_ptr()) % 16 + COUNTER_BYTES + need - 1]
    assert staging.plan(q, kv.k, kv.k_table, short, 4096) is None
    assert staging.plan(q, kv.k, kv.k_table, None, 4096) is None
    assert staging.plan(q, kv.k, kv.k_table, ws, 1) is None  # (fp8: one query row a head does not pay)
    assert staging.plan(q.to(torch.float16), kv.k.view(torch.float16)[..., :32], kv.k_table, ws, 4096) is None  # 16-bit cache
