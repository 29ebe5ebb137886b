"""Reference MLA decode (CPU) against the dense float64 formulation."""

import pytest
import torch
from .refcheck import assert_close, poisoned, randq, scale_arg, workspace

from kvattn import dense
from kvattn.formats import FP8_DTYPE
from kvattn.mla import xqa_batch_decode_with_kv_cache_mla

pytestmark = pytest.mark.usefixtures("reference_backend")  # the plain-PyTorch backend, explicitly

DIM = 576


def make_case(lens, *, page=32, dtype=torch.bfloat16, four_d=False, seed=0):
    """Latent cache with permuted pages; unused slots NaN."""
    g = torch.Generator().manual_seed(seed)
    need = [(n + page - 1) // page for n in lens]
    total = sum(need) + 2
    perm = torch.randperm(total, generator=g)
    width = max(need + [0]) + 1
    table = torch.full((len(lens), width), 1 << 30, dtype=torch.int32)
    used = torch.zeros(total, page, dtype=torch.bool)
    pos = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[pos : pos + n].to(torch.int32)
        pos += n
        for t in range(lens[b]):
            used[int(table[b, t // page]), t % page] = True
    cache = torch.randn(total, page, DIM, generator=g)
    cache[~used] = float("nan")
    cache = cache.to(dtype) if dtype != FP8_DTYPE else cache.clamp(-448, 448).to(dtype)
    if four_d:
        cache = cache.unsqueeze(1)
    return cache, table, torch.tensor(lens, dtype=torch.int32)


def run(query, cache, table, lens, **kw):
    out = poisoned(query.shape[0], query.shape[2], 512, dtype=torch.bfloat16)
    got = xqa_batch_decode_with_kv_cache_mla(query, cache, workspace(), 128, 512, 64, table, lens,
                                             int(lens.max()), out=out, **kw)
    assert got is out
    return out, dense.mla(query, cache, table, lens, **kw)


@pytest.mark.parametrize("four_d", [False, True], ids=["3d-cache", "4d-cache"])
@pytest.mark.parametrize("hq", [16, 32, 64, 128], ids=lambda h: f"Hq{h}")
def test_heads_and_cache_rank(hq, four_d):
    cache, table, lens = make_case([1, 45, 0, 64], four_d=four_d, seed=hq)
    q = randq(4, 1, hq, DIM, seed=hq)
    out, ref = run(q, cache, table, lens, bmm1_scale=192**-0.5, bmm2_scale=1.3)
    assert_close(out, ref)
    assert (out[2].float() == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
@pytest.mark.parametrize("as_tensor", [False, True], ids=["float-scales", "tensor-scales"])
def test_dtypes_and_scale_forms(dtype, as_tensor):
    cache, table, lens = make_case([20, 70], dtype=dtype, seed=3)
    q = randq(2, 1, 16, DIM, dtype=dtype, seed=3)
    out, ref = run(q, cache, table, lens, bmm1_scale=scale_arg(0.02, as_tensor), bmm2_scale=scale_arg(0.8, as_tensor))
    assert_close(out, ref)


@pytest.mark.parametrize("page", [16, 64, 128], ids=lambda p: f"page{p}")
def test_page_sizes(page):
    cache, table, lens = make_case([page - 1, page + 1], page=page, seed=page)
    q = randq(2, 1, 16, DIM, seed=page)
    out, ref = run(q, cache, table, lens, bmm1_scale=0.04)
    assert_close(out, ref)


def test_returns_b_hq_512_when_out_is_none():
    cache, table, lens = make_case([5], seed=4)
    q = randq(1, 1, 16, DIM, seed=4)
    o = xqa_batch_decode_with_kv_cache_mla(q, cache, workspace(), 128, 512, 64, table, lens, 5, bmm1_scale=0.04)
    assert o.shape == (1, 16, 512) and o.dtype == torch.bfloat16
    assert_close(o, dense.mla(q, cache, table, lens, bmm1_scale=0.04))
