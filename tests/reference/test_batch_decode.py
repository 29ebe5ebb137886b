"""Reference ``xqa_batch_decode_with_kv_cache`` (CPU) against the dense float64 formulation."""

import math

import pytest
import torch
from .refcheck import assert_close, paged_case, poisoned, randq, scale_arg, workspace

from kvattn import dense
from kvattn.decode import xqa_batch_decode_with_kv_cache
from kvattn.formats import FP8_DTYPE

pytestmark = pytest.mark.usefixtures("reference_backend")  # the plain-PyTorch backend, explicitly


def run(case, q, *, q_len=1, out=None, layout=None, **kw):
    """Call the public function with a poisoned ``out``; return it and the dense o_real."""
    hq, d = q.shape[1], q.shape[2]
    if out is None:
        out = poisoned(*q.shape, dtype=q.dtype)
    layout = layout or case.layout
    got = xqa_batch_decode_with_kv_cache(
        q, case.kv_cache, workspace(), case.block_tables, case.seq_lens, case.max_seq_len,
        out=out, kv_layout=layout, q_len_per_req=q_len, kv_cache_sf=case.kv_cache_sf, **kw)
    assert got is out
    ref = dense.batch_decode(q, case.kv_cache, case.block_tables, case.seq_lens, kv_layout=layout,
                             q_len_per_req=q_len, kv_cache_sf=case.kv_cache_sf, **kw)
    assert ref.shape == (q.shape[0], hq, d)
    return got, ref


LENS = [1, 37, 0, 64]  # seq_len 1, not a multiple of the page, an empty slot, exactly 4 pages


@pytest.mark.parametrize("kv_format", ["float16", "bfloat16", "fp8", "nvfp4"])
@pytest.mark.parametrize("form", ["stacked", "shared", "tuple"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cache_forms(layout, form, kv_format):
    case = paged_case(LENS, kv_format=kv_format, layout=layout, form=form, seed=1)
    qdtype = torch.float16 if kv_format in ("float16", "nvfp4") else torch.bfloat16
    q = randq(len(LENS), 8, 64, dtype=qdtype, seed=1)
    out, ref = run(case, q, bmm1_scale=64**-0.5, bmm2_scale=0.75)
    assert_close(out, ref)
    assert (out[2].float() == 0).all(), "an empty request gives an all-zero row"


@pytest.mark.parametrize("group", [1, 2, 4, 8, 16], ids=lambda g: f"G{g}")
@pytest.mark.parametrize("d", [64, 128, 256], ids=lambda d: f"D{d}")
def test_head_dims_and_groups(d, group):
    hkv = 2 if group <= 4 else 1
    case = paged_case([19, 50], hkv=hkv, d=d, seed=d + group)
    q = randq(2, hkv * group, d, seed=group)
    out, ref = run(case, q, bmm1_scale=d**-0.5)
    assert_close(out, ref)


@pytest.mark.parametrize("page", [16, 32, 64, 128], ids=lambda p: f"page{p}")
def test_page_sizes(page):
    case = paged_case([1, page - 1, page + 3, 2 * page], page=page, seed=page, extra_pages=3)
    q = randq(4, 4, 64, seed=page)
    out, ref = run(case, q, bmm1_scale=0.125)
    assert_close(out, ref)


@pytest.mark.parametrize("tensors", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["float-float", "tensor-float", "float-tensor", "tensor-tensor"])
def test_scale_forms(tensors):
    """fp8 cache: k/v dequant scales folded into bmm1/bmm2, given as floats or one-element tensors."""
    k_scale, v_scale = 0.37, 1.9
    case = paged_case([23, 40], kv_format="fp8", seed=5)
    q = randq(2, 8, 64, seed=5)
    out, ref = run(case, q, bmm1_scale=scale_arg(64**-0.5 * k_scale, tensors[0]),
                   bmm2_scale=scale_arg(v_scale, tensors[1]))
    assert_close(out, ref)


def test_bf16_output_scale_applies_o_scale():
    """A non-fp8 output stores o_real = bmm2 * o_scale * softmax V (SPEC, divergence 1)."""
    case = paged_case([30, 9], seed=6)
    q = randq(2, 4, 64, seed=6)
    out, ref = run(case, q, bmm1_scale=0.1, bmm2_scale=0.5, o_scale=3.0)
    assert_close(out, ref)
    plain = dense.batch_decode(q, case.kv_cache, case.block_tables, case.seq_lens, bmm1_scale=0.1)
    torch.testing.assert_close(ref, plain * 1.5)


@pytest.mark.parametrize("o_scale", [1.0, 0.25, 4.0], ids=lambda s: f"o_scale{s}")
def test_fp8_output(o_scale):
    """fp8 output stores o_real / o_scale (nearest even), so out * o_scale ~ o_real."""
    case = paged_case([17, 64, 0], kv_format="fp8", seed=7)
    q = randq(3, 8, 64, seed=7)
    out = poisoned(3, 8, 64, dtype=FP8_DTYPE)
    out, ref = run(case, q, out=out, bmm1_scale=0.125, bmm2_scale=2.0 / o_scale, o_scale=o_scale)
    assert_close(out, ref, stored_scale=o_scale)


def test_fp8_output_saturates():
    case = paged_case([12], kv_format="fp8", seed=8, scale=4.0)
    q = randq(1, 4, 64, seed=8)
    out = poisoned(1, 4, 64, dtype=FP8_DTYPE)
    out, ref = run(case, q, out=out, bmm1_scale=0.125, bmm2_scale=300.0, o_scale=1.0 / 512)
    assert float((ref * 512).abs().max()) > 448, "the case must overflow e4m3"
    assert_close(out, ref, stored_scale=1.0 / 512)
    assert float(out.float().abs().max()) == 448.0


@pytest.mark.parametrize("kind", ["moderate", "dominating"])
def test_sinks(kind):
    case = paged_case([1, 33, 0, 80], seed=9)
    q = randq(4, 8, 64, seed=9)
    sinks = torch.linspace(-2, 2, 8) if kind == "moderate" else torch.full((8,), 40.0)
    out, ref = run(case, q, bmm1_scale=0.125, sinks=sinks)
    assert_close(out, ref)
    no_sink = dense.batch_decode(q, case.kv_cache, case.block_tables, case.seq_lens, bmm1_scale=0.125)
    shrink = ref.norm() / no_sink.norm()
    assert shrink < (1e-6 if kind == "dominating" else 1.0)


@pytest.mark.parametrize("offset", [None, 1, 2, 5, 30, "zero"], ids=lambda o: f"w=L-{o}" if isinstance(o, int) else str(o))
def test_window_boundary(offset):
    """window_left = L-1 sees everything; L-2 drops key 0; 0 sees only the query's own key."""
    L = 37
    case = paged_case([L, L], seed=10)
    q = randq(2, 4, 64, seed=10)
    w = -1 if offset is None else 0 if offset == "zero" else L - offset
    out, ref = run(case, q, bmm1_scale=0.125, window_left=w)
    assert_close(out, ref)
    full = dense.batch_decode(q, case.kv_cache, case.block_tables, case.seq_lens, bmm1_scale=0.125)
    if offset in (None, 1):
        torch.testing.assert_close(ref, full)
    else:
        assert not torch.allclose(ref, full)
    if offset == "zero":  # only the last key: the output is that key's value
        v_last = torch.stack([case.v_tokens[b][L - 1] for b in range(2)]).double()
        torch.testing.assert_close(ref, v_last.repeat_interleave(2, dim=1))


def test_window_with_mixed_lengths():
    case = paged_case([1, 5, 6, 100], page=32, seed=11)
    q = randq(4, 4, 64, seed=11)
    out, ref = run(case, q, bmm1_scale=0.125, window_left=4)
    assert_close(out, ref)


def _random_mask(batch, q_len, seed):
    g = torch.Generator().manual_seed(seed)
    words = 2 * math.ceil(q_len / 32)
    return torch.randint(0, 1 << 16, (batch, q_len, words), generator=g, dtype=torch.int32).to(torch.uint16)


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "explicit-mask"])
@pytest.mark.parametrize("q_len", [2, 3, 4, 5, 8], ids=lambda n: f"Q{n}")
def test_spec_decode(q_len, masked):
    lens = [q_len, 30, 0, 70]
    case = paged_case(lens, seed=20 + q_len)
    q = randq(len(lens) * q_len, 8, 64, seed=q_len)
    mask = _random_mask(len(lens), q_len, q_len) if masked else None
    out, ref = run(case, q, q_len=q_len, bmm1_scale=0.125, mask=mask, sinks=torch.randn(8))
    assert_close(out, ref)
    assert (out[2 * q_len : 3 * q_len].float() == 0).all()


def test_spec_decode_causal_equals_lower_triangular_mask():
    q_len, lens = 6, [6, 25]
    case = paged_case(lens, seed=31)
    q = randq(2 * q_len, 4, 64, seed=31)
    tri = torch.zeros(2, q_len, 2, dtype=torch.int32)
    for r in range(q_len):
        tri[:, r, 0] = (1 << (r + 1)) - 1
    causal, _ = run(case, q, q_len=q_len, bmm1_scale=0.125)
    explicit, ref = run(case, q, q_len=q_len, bmm1_scale=0.125, mask=tri.to(torch.uint16))
    assert_close(explicit, ref)
    torch.testing.assert_close(causal, explicit, rtol=0, atol=0)


def test_spec_decode_second_mask_word():
    """q_len 20 uses word 1 of each mask row (bits of drafts 16..19)."""
    q_len, lens = 20, [24, 40]
    case = paged_case(lens, seed=32)
    q = randq(2 * q_len, 4, 64, seed=32)
    out, ref = run(case, q, q_len=q_len, bmm1_scale=0.125, mask=_random_mask(2, q_len, 32))
    assert_close(out, ref)


@pytest.mark.parametrize("q_len", [2, 4], ids=lambda n: f"Q{n}")
def test_spec_decode_with_window(q_len):
    case = paged_case([40, 33], seed=33)
    q = randq(2 * q_len, 4, 64, seed=33)
    out, ref = run(case, q, q_len=q_len, bmm1_scale=0.125, window_left=6, mask=_random_mask(2, q_len, 3))
    assert_close(out, ref)


def test_q_len_none_means_one():
    case = paged_case([10, 20], seed=34)
    q = randq(2, 4, 64, seed=34)
    out, ref = run(case, q, q_len=None, bmm1_scale=0.125)
    assert_close(out, ref)


def test_all_empty_requests_give_zeros():
    case = paged_case([0, 0], seed=35, pages_per_seq=2)
    q = randq(2, 4, 64, seed=35)
    out = xqa_batch_decode_with_kv_cache(q, case.kv_cache, workspace(), case.block_tables, case.seq_lens, 0,
                                         out=poisoned(2, 4, 64, dtype=torch.bfloat16))
    assert (out.float() == 0).all()


def test_uint32_seq_lens_and_strided_cache():
    """uint32 lengths; a cache whose non-last dims have arbitrary strides (a slice of a wider pool)."""
    case = paged_case([21, 48], seed=36, form="tuple")
    wide_k = torch.full((case.kv_cache[0].shape[0], 16, 3, 64), float("nan"), dtype=torch.bfloat16)
    wide_v = wide_k.clone()
    wide_k[:, :, 1:3] = case.kv_cache[0]
    wide_v[:, :, 0:2] = case.kv_cache[1]
    k, v = wide_k[:, :, 1:3], wide_v[:, :, 0:2]
    assert not k.is_contiguous()
    q = randq(2, 4, 64, seed=36)
    lens = case.seq_lens.to(torch.uint32)
    out = xqa_batch_decode_with_kv_cache(q, (k, v), workspace(), case.block_tables, lens, 48, bmm1_scale=0.125)
    ref = dense.batch_decode(q, case.kv_cache, case.block_tables, case.seq_lens, bmm1_scale=0.125)
    assert_close(out, ref)


@pytest.mark.parametrize("kv_format, layout, form, out_fp8", [
    ("fp8", "HND", "tuple", False), ("fp8", "NHD", "shared", True), ("nvfp4", "HND", "shared", False),
    ("nvfp4", "NHD", "tuple", False), ("bfloat16", "HND", "stacked", False),
], ids=["fp8-HND-tuple", "fp8-NHD-shared-out-fp8", "nvfp4-HND-shared", "nvfp4-NHD-tuple", "bf16-HND-stacked"])
def test_feature_combinations(kv_format, layout, form, out_fp8):
    """Spec decode + explicit mask + window + sinks + tensor scales + o_scale, on quantised caches."""
    q_len, lens = 3, [3, 0, 50, 129]
    case = paged_case(lens, d=128, kv_format=kv_format, layout=layout, form=form, page=32, seed=40)
    q = randq(len(lens) * q_len, 8, 128, seed=40)
    out = poisoned(*q.shape, dtype=FP8_DTYPE if out_fp8 else q.dtype)
    o_scale = 0.5
    out, ref = run(case, q, out=out, q_len=q_len, bmm1_scale=scale_arg(0.09, True), bmm2_scale=scale_arg(1.1, True),
                   o_scale=o_scale, window_left=20, sinks=torch.randn(8), mask=_random_mask(len(lens), q_len, 40))
    assert_close(out, ref, stored_scale=o_scale if out_fp8 else 1.0)


def test_empty_batch_and_all_empty_match_dense():
    case = paged_case([0, 0, 0], seed=42, pages_per_seq=2)
    q = randq(3, 4, 64, seed=42)
    out, ref = run(case, q, bmm1_scale=0.125, sinks=torch.ones(4))
    assert_close(out, ref)
    assert (out.float() == 0).all()
    none = xqa_batch_decode_with_kv_cache(q[:0], case.kv_cache, workspace(), case.block_tables[:0], case.seq_lens[:0], 0)
    assert none.shape == (0, 4, 64)
    assert dense.batch_decode(q[:0], case.kv_cache, case.block_tables[:0], case.seq_lens[:0]).shape == (0, 4, 64)
