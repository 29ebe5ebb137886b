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


# ---------------------------------------------------------------------------------------------
# Multi-token prediction: Q query tokens a request, token r at position L - Q + r
# ---------------------------------------------------------------------------------------------
def exact_mtp(query, cache, table, lens, bmm1, bmm2):
    """float64 ``(o [B, Q, Hq, 512], lse [B, Q, Hq])``, written out token by token from the rule
    (docs/semantics.md, MLA): token ``r`` sees the keys at positions ``0 .. L - Q + r``; a token
    that sees none is zero with LSE -inf. Independent of kvattn (plain torch, one token at a time)."""
    if cache.dim() == 4:
        cache = cache[:, 0]
    batch, q_len, heads, _ = query.shape
    page = cache.shape[1]
    o = torch.zeros(batch, q_len, heads, 512, dtype=torch.float64)
    lse = torch.full((batch, q_len, heads), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        length = int(lens[b])
        keys = torch.stack([cache[int(table[b, j // page]), j % page].double() for j in range(length)]) if length \
            else torch.zeros(0, 576, dtype=torch.float64)
        for r in range(q_len):
            seen = length - q_len + r + 1
            if seen <= 0:
                continue
            k = keys[:seen]
            s = (query[b, r].double() @ k.T) * bmm1  # [Hq, seen]
            m = s.max(dim=1, keepdim=True).values
            p = torch.exp(s - m)
            o[b, r] = (p @ k[:, :512]) / p.sum(dim=1, keepdim=True) * bmm2
            lse[b, r] = (m[:, 0] + torch.log(p.sum(dim=1))) / torch.log(torch.tensor(2.0, dtype=torch.float64))
    return o, lse


def run_mtp(query, cache, table, lens, bmm1=0.05, bmm2=1.1, **kw):
    b, q_len, hq, _ = query.shape
    out = poisoned(b, q_len, hq, 512, dtype=torch.bfloat16)
    lse = torch.full((b, q_len, hq), float("nan"))
    got, got_lse = xqa_batch_decode_with_kv_cache_mla(query, cache, workspace(), 128, 512, 64, table, lens,
                                                      max(int(lens.max()), 1), out=out, bmm1_scale=bmm1,
                                                      bmm2_scale=bmm2, return_lse=True, lse=lse, **kw)
    assert got is out and got_lse is lse
    return out, lse, exact_mtp(query, cache, table, lens, bmm1, bmm2)


def assert_lse_close(lse, ref):
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(lse), inf) and not torch.isnan(lse).any()
    assert torch.allclose(lse[~inf].double(), ref[~inf], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("q_len", [1, 2, 3, 4], ids=lambda q: f"Q{q}")
@pytest.mark.parametrize("hq", [16, 32], ids=lambda h: f"Hq{h}")
def test_mtp_tokens_see_keys_up_to_their_position(q_len, hq):
    """Ragged lengths: one exactly Q long, an empty one, lengths on and off page bounds."""
    lens = [q_len, 45, 0, 64, 33]
    cache, table, lens_t = make_case(lens, seed=10 * q_len + hq)
    q = randq(len(lens), q_len, hq, DIM, seed=q_len + hq)
    out, lse, (ref, ref_lse) = run_mtp(q, cache, table, lens_t)
    assert_close(out, ref)
    assert_lse_close(lse, ref_lse)
    assert (out[2].float() == 0).all() and torch.isinf(lse[2]).all()
    # the drafts differ: token r sees one key more than token r - 1
    if q_len > 1:
        assert not torch.equal(out[1, 0], out[1, 1])


@pytest.mark.parametrize("q_len", [2, 4], ids=lambda q: f"Q{q}")
def test_mtp_request_shorter_than_q(q_len, monkeypatch):
    """Rows at negative positions see no key: zero output, LSE -inf (the rows after them as usual).
    (Such a request is a caller error that the checks report on CPU tensors by default: off here.)"""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    lens = [1, 40] if q_len == 2 else [2, 3, 40]
    cache, table, lens_t = make_case(lens, seed=q_len)
    q = randq(len(lens), q_len, 16, DIM, seed=q_len)
    out, lse, (ref, ref_lse) = run_mtp(q, cache, table, lens_t)
    assert_close(out, ref)
    assert_lse_close(lse, ref_lse)
    hidden = q_len - lens[0]
    assert (out[0, :hidden].float() == 0).all() and torch.isinf(lse[0, :hidden]).all()
    assert torch.isfinite(lse[0, hidden:]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
def test_mtp_dtypes_4d_cache_and_allocated_output(dtype):
    lens = [70, 3, 129]
    cache, table, lens_t = make_case(lens, dtype=dtype, four_d=True, page=64, seed=5)
    q = randq(3, 3, 16, DIM, dtype=dtype, seed=5)
    o = xqa_batch_decode_with_kv_cache_mla(q, cache, workspace(), 128, 512, 64, table, lens_t, 129, bmm1_scale=0.03)
    assert o.shape == (3, 3, 16, 512) and o.dtype == torch.bfloat16
    assert_close(o, exact_mtp(q, cache, table, lens_t, 0.03, 1.0)[0])
    o, lse = xqa_batch_decode_with_kv_cache_mla(q, cache, workspace(), 128, 512, 64, table, lens_t, 129,
                                                bmm1_scale=0.03, return_lse=True)
    assert lse.shape == (3, 3, 16)


def test_q1_takes_a_4d_output_as_a_view():
    """Q = 1 with ``out [B, 1, Hq, 512]`` (and ``lse [B, 1, Hq]``): the same values as the 3-D form."""
    cache, table, lens = make_case([30, 5], seed=8)
    q = randq(2, 1, 16, DIM, seed=8)
    out4, lse4 = poisoned(2, 1, 16, 512, dtype=torch.bfloat16), torch.empty(2, 1, 16)
    got = xqa_batch_decode_with_kv_cache_mla(q, cache, workspace(), 128, 512, 64, table, lens, 30, out=out4,
                                             bmm1_scale=0.05, return_lse=True, lse=lse4)
    assert got[0] is out4 and got[1] is lse4
    out3, lse3 = xqa_batch_decode_with_kv_cache_mla(q, cache, workspace(), 128, 512, 64, table, lens, 30,
                                                    bmm1_scale=0.05, return_lse=True)
    assert out3.shape == (2, 16, 512) and lse3.shape == (2, 16)
    assert torch.equal(out4[:, 0], out3) and torch.equal(lse4[:, 0], lse3)


def test_mtp_query_whose_tokens_and_heads_do_not_fold():
    """A query view whose token and head dims cannot merge (heads sliced out of a wider tensor)."""
    cache, table, lens = make_case([50, 9], seed=9)
    wide = randq(2, 2, 32, DIM, seed=9)
    q = wide[:, :, :16]
    out, lse, (ref, ref_lse) = run_mtp(q, cache, table, lens)
    assert_close(out, ref)
    assert_lse_close(lse, ref_lse)
