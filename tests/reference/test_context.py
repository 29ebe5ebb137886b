"""Reference ``trtllm_batch_context_with_kv_cache`` (CPU) against the dense float64 formulation."""

import pytest
import torch
from .refcheck import assert_close, paged_case, poisoned, randq, scale_arg, workspace

from kvattn import dense
from kvattn.formats import FP8_DTYPE
from kvattn.prefill import trtllm_batch_context_with_kv_cache

pytestmark = pytest.mark.usefixtures("reference_backend")  # the plain-PyTorch backend, explicitly

LENS = [1, 37, 0, 64, 20]
LQ = [1, 10, 0, 64, 0]  # Lq = 1, Lq < L, an empty request, Lq = L, a request with no queries


def cum(values):
    return torch.tensor([0] + list(torch.tensor(values).cumsum(0).tolist()), dtype=torch.int32)


def run(case, q, lq, *, out=None, layout=None, shared_idx=True, **kw):
    layout = layout or case.layout
    lens = case.seq_lens
    if out is None and "out_dtype" not in kw:
        out = poisoned(*q.shape, dtype=q.dtype if q.dtype != FP8_DTYPE else torch.bfloat16)
    cq, ckv = cum(lq), cum(lens.tolist())
    got = trtllm_batch_context_with_kv_cache(
        q, case.kv_cache, workspace(), case.block_tables, lens, max(lq), int(lens.max()),
        kw.pop("bmm1_scale", 0.125), kw.pop("bmm2_scale", 1.0), len(lq), cq, ckv,
        out=out, kv_layout=layout, kv_block_scales=case.kv_cache_sf, uses_shared_paged_kv_idx=shared_idx, **kw)
    if out is not None:
        assert got is out
    return got, cq


def dense_ref(case, q, cq, *, layout=None, shared_idx=True, **kw):
    return dense.context(q, case.kv_cache, case.block_tables, case.seq_lens, cq, kv_layout=layout or case.layout,
                         kv_block_scales=case.kv_cache_sf, uses_shared_paged_kv_idx=shared_idx, **kw)


@pytest.mark.parametrize("kv_format", ["float16", "bfloat16", "fp8", "nvfp4"])
@pytest.mark.parametrize("form", ["stacked", "shared", "tuple"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_cache_forms(layout, form, kv_format):
    case = paged_case(LENS, kv_format=kv_format, layout=layout, form=form, seed=2)
    qdtype = torch.float16 if kv_format in ("float16", "nvfp4") else torch.bfloat16
    q = randq(sum(LQ), 8, 64, dtype=qdtype, seed=2)
    out, cq = run(case, q, LQ, bmm1_scale=0.125, bmm2_scale=0.9)
    assert_close(out, dense_ref(case, q, cq, bmm1_scale=0.125, bmm2_scale=0.9))


@pytest.mark.parametrize("form", ["stacked", "shared", "tuple"])
def test_split_page_tables(form):
    case = paged_case(LENS, layout="HND", form=form, split_tables=True, seed=3)
    assert case.block_tables.shape[1] == 2
    q = randq(sum(LQ), 4, 64, seed=3)
    out, cq = run(case, q, LQ, shared_idx=False)
    assert_close(out, dense_ref(case, q, cq, shared_idx=False, bmm1_scale=0.125))


@pytest.mark.parametrize("group", [1, 4, 16], ids=lambda g: f"G{g}")
@pytest.mark.parametrize("d", [64, 128, 256], ids=lambda d: f"D{d}")
def test_head_dims_and_groups(d, group):
    case = paged_case([30, 12], hkv=1, d=d, seed=d + group)
    q = randq(17, group, d, seed=group)
    out, cq = run(case, q, [5, 12], bmm1_scale=d**-0.5)
    assert_close(out, dense_ref(case, q, cq, bmm1_scale=d**-0.5))


@pytest.mark.parametrize("page", [16, 32, 64, 128], ids=lambda p: f"page{p}")
def test_page_sizes(page):
    case = paged_case([page + 7, 3], page=page, seed=page)
    q = randq(page + 7 + 2, 4, 64, seed=page)
    out, cq = run(case, q, [page + 7, 2])
    assert_close(out, dense_ref(case, q, cq, bmm1_scale=0.125))


@pytest.mark.parametrize("offset", [1, 2, "zero", 9], ids=lambda o: f"w=L-{o}" if isinstance(o, int) else "w0")
def test_window_boundary(offset):
    L = 40
    case = paged_case([L, L], seed=4)
    q = randq(2 * L, 4, 64, seed=4)
    w = 0 if offset == "zero" else L - offset
    out, cq = run(case, q, [L, L], window_left=w)
    ref = dense_ref(case, q, cq, bmm1_scale=0.125, window_left=w)
    assert_close(out, ref)
    full = dense_ref(case, q, cq, bmm1_scale=0.125)
    if offset == 1:
        torch.testing.assert_close(ref, full)
    else:
        assert not torch.allclose(ref, full)
    if offset == "zero":  # each row sees only its own key
        own = torch.cat([case.v_tokens[b] for b in range(2)]).double().repeat_interleave(2, dim=1)
        torch.testing.assert_close(ref, own)


@pytest.mark.parametrize("kind", ["moderate", "dominating", "list"])
def test_sinks(kind):
    case = paged_case(LENS, seed=5)
    q = randq(sum(LQ), 8, 64, seed=5)
    sinks = torch.full((8,), 35.0) if kind == "dominating" else torch.randn(8)
    arg = [sinks] if kind == "list" else sinks
    out, cq = run(case, q, LQ, sinks=arg)
    ref = dense_ref(case, q, cq, bmm1_scale=0.125, sinks=sinks)
    assert_close(out, ref)
    if kind == "dominating":
        assert ref.norm() < 1e-6 * dense_ref(case, q, cq, bmm1_scale=0.125).norm()


@pytest.mark.parametrize("as_tensor", [False, True], ids=["float-scales", "tensor-scales"])
def test_scale_forms(as_tensor):
    case = paged_case(LENS, kv_format="fp8", seed=6)
    q = randq(sum(LQ), 8, 64, seed=6)
    out, cq = run(case, q, LQ, bmm1_scale=scale_arg(0.03, as_tensor), bmm2_scale=scale_arg(1.7, as_tensor))
    assert_close(out, dense_ref(case, q, cq, bmm1_scale=0.03, bmm2_scale=1.7))


@pytest.mark.parametrize("kv_format", ["fp8", "nvfp4"])
def test_fp8_query(kv_format):
    case = paged_case(LENS, kv_format=kv_format, seed=7)
    q = randq(sum(LQ), 8, 64, dtype=FP8_DTYPE, seed=7)
    out, cq = run(case, q, LQ, out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert_close(out, dense_ref(case, q, cq, bmm1_scale=0.125))


@pytest.mark.parametrize("how", ["out", "out_dtype", "out_dtype-str"])
def test_fp8_output(how):
    case = paged_case(LENS, kv_format="fp8", seed=8)
    q = randq(sum(LQ), 8, 64, seed=8)
    kw = {"out": poisoned(sum(LQ), 8, 64, dtype=FP8_DTYPE)} if how == "out" else {
        "out_dtype": FP8_DTYPE if how == "out_dtype" else "float8_e4m3fn"}
    out, cq = run(case, q, LQ, bmm2_scale=4.0, **kw)
    assert out.dtype == FP8_DTYPE
    assert_close(out, dense_ref(case, q, cq, bmm1_scale=0.125, bmm2_scale=4.0))


def test_fp8_output_saturates():
    case = paged_case([16], kv_format="fp8", seed=9, scale=3.0)
    q = randq(16, 4, 64, seed=9)
    out, cq = run(case, q, [16], bmm2_scale=400.0, out=poisoned(16, 4, 64, dtype=FP8_DTYPE))
    ref = dense_ref(case, q, cq, bmm1_scale=0.125, bmm2_scale=400.0)
    assert float(ref.abs().max()) > 448
    assert_close(out, ref)


def test_out_dtype_defaults_to_query_dtype():
    case = paged_case([9], kv_format="float16", seed=10)
    q = randq(9, 4, 64, dtype=torch.float16, seed=10)
    cq = cum([9])
    o = trtllm_batch_context_with_kv_cache(q, case.kv_cache, workspace(), case.block_tables, case.seq_lens, 9, 9,
                                           0.125, 1.0, 1, cq, cq, kv_layout="NHD")
    assert o.dtype == torch.float16
    assert_close(o, dense_ref(case, q, cq, bmm1_scale=0.125))


def test_all_empty():
    case = paged_case([0, 5], seed=11)
    q = randq(0, 4, 64, seed=11)
    out, _ = run(case, q, [0, 0])
    assert out.shape == (0, 4, 64)


@pytest.mark.parametrize("out_kind", ["query-dtype", "fp8"])
@pytest.mark.parametrize("kv_format, layout, form, split", [
    ("fp8", "NHD", "tuple", True), ("nvfp4", "HND", "stacked", False), ("nvfp4", "NHD", "shared", True),
    ("float16", "HND", "tuple", True),
], ids=["fp8-NHD-tuple-split", "nvfp4-HND-stacked", "nvfp4-NHD-shared-split", "fp16-HND-tuple-split"])
def test_feature_combinations(kv_format, layout, form, split, out_kind):
    """Ragged queries + window + sinks + tensor scales + split tables, on quantised caches."""
    case = paged_case(LENS, d=128, kv_format=kv_format, layout=layout, form=form, split_tables=split, page=32,
                      seed=41)
    q = randq(sum(LQ), 8, 128, dtype=torch.float16, seed=41)
    out = poisoned(*q.shape, dtype=FP8_DTYPE if out_kind == "fp8" else q.dtype)
    sinks = torch.randn(8)
    got, cq = run(case, q, LQ, out=out, shared_idx=not split, bmm1_scale=scale_arg(0.08, True),
                  bmm2_scale=scale_arg(2.0, True), window_left=9, sinks=sinks)
    ref = dense_ref(case, q, cq, shared_idx=not split, bmm1_scale=0.08, bmm2_scale=2.0, window_left=9, sinks=sinks)
    assert_close(got, ref)


def test_zero_batch():
    case = paged_case([3], seed=12)
    q = randq(0, 4, 64, seed=12)
    cq = torch.zeros(1, dtype=torch.int32)
    o = trtllm_batch_context_with_kv_cache(q, case.kv_cache, workspace(), case.block_tables[:0], case.seq_lens[:0], 0,
                                           0, 0.125, 1.0, 0, cq, cq, kv_layout="NHD")
    assert o.shape == (0, 4, 64)
    assert dense.context(q, case.kv_cache, case.block_tables[:0], case.seq_lens[:0], cq, kv_layout="NHD").shape == (0, 4, 64)
