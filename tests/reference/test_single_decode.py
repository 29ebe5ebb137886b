"""Reference ``single_decode_with_kv_cache`` (CPU) against the dense float64 formulation."""

import math

import pytest
import torch
from .refcheck import assert_close, randq

from kvattn import dense
from kvattn.decode import single_decode_with_kv_cache
from kvattn.formats import FP8_DTYPE

pytestmark = pytest.mark.usefixtures("reference_backend")  # the plain-PyTorch backend, explicitly

LSE_ATOL = 2e-4  # float32 LSE of float32 logits, absolute (base 2)


def make_qkv(L, hq=8, hkv=2, d=64, dtype=torch.float16, kv_dtype=None, layout="NHD", seed=0):
    q = randq(hq, d, dtype=dtype, seed=seed)
    shape = (L, hkv, d) if layout == "NHD" else (hkv, L, d)
    k = randq(*shape, dtype=kv_dtype or dtype, seed=seed + 1)
    v = randq(*shape, dtype=kv_dtype or dtype, seed=seed + 2)
    return q, k, v


def check(q, k, v, **kw):
    out, lse = single_decode_with_kv_cache(q, k, v, return_lse=True, **kw)
    ref, ref_lse = dense.single_decode(q, k, v, **kw)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert_close(out, ref)
    assert torch.isfinite(lse).all()
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=LSE_ATOL)
    plain = single_decode_with_kv_cache(q, k, v, **kw)
    assert isinstance(plain, torch.Tensor)
    torch.testing.assert_close(plain, out, rtol=0, atol=0)
    return ref, ref_lse


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_layouts_and_dtypes(layout, dtype):
    q, k, v = make_qkv(57, dtype=dtype, layout=layout, seed=1)
    check(q, k, v, kv_layout=layout)


@pytest.mark.parametrize("L", [1, 2, 130], ids=lambda n: f"L{n}")
def test_lengths(L):
    q, k, v = make_qkv(L, seed=L)
    ref, lse = check(q, k, v)
    if L == 1:  # one key: the output is its value, the LSE its logit
        torch.testing.assert_close(ref, v[0].double().repeat_interleave(4, dim=0))


@pytest.mark.parametrize("group", [1, 2, 4, 8, 16], ids=lambda g: f"G{g}")
@pytest.mark.parametrize("d", [64, 128, 256], ids=lambda d: f"D{d}")
def test_head_dims_and_groups(d, group):
    q, k, v = make_qkv(33, hq=group, hkv=1, d=d, seed=d + group)
    check(q, k, v)


def test_scales():
    q, k, v = make_qkv(40, seed=3)
    check(q, k, v, sm_scale=0.2, q_scale=1.5, k_scale=0.7, v_scale=2.5)


def test_fp8_kv_with_dequant_scales():
    q, k, v = make_qkv(40, kv_dtype=FP8_DTYPE, dtype=torch.bfloat16, seed=4)
    check(q, k, v, k_scale=0.05, v_scale=0.3)


@pytest.mark.parametrize("soft_cap", [None, 2.0], ids=["nocap", "cap2"])
@pytest.mark.parametrize("mode", ["NONE", "ROPE_LLAMA", "ALIBI"])
def test_pos_encoding_and_soft_cap(mode, soft_cap):
    q, k, v = make_qkv(70, hq=12, hkv=3, seed=5)  # 12 heads: ALiBi's non-power-of-two slopes
    check(q, k, v, pos_encoding_mode=mode, logits_soft_cap=soft_cap, sm_scale=0.3)


def test_rope_parameters():
    q, k, v = make_qkv(90, d=128, seed=6)
    ref, _ = check(q, k, v, pos_encoding_mode="ROPE_LLAMA", rope_scale=4.0, rope_theta=5e5)
    default, _ = dense.single_decode(q, k, v, pos_encoding_mode="ROPE_LLAMA")
    assert not torch.allclose(ref, default)


@pytest.mark.parametrize("mode", ["NONE", "ROPE_LLAMA", "ALIBI"])
@pytest.mark.parametrize("offset", [1, 2, "zero"], ids=lambda o: f"w=L-{o}" if isinstance(o, int) else "w0")
def test_window_boundary(offset, mode):
    L = 29
    q, k, v = make_qkv(L, seed=7)
    w = 0 if offset == "zero" else L - offset
    ref, lse = check(q, k, v, window_left=w, pos_encoding_mode=mode, logits_soft_cap=5.0)
    full, _ = dense.single_decode(q, k, v, pos_encoding_mode=mode, logits_soft_cap=5.0)
    if offset == 1:
        torch.testing.assert_close(ref, full)
    else:
        assert not torch.allclose(ref, full)


def test_all_features_together():
    q, k, v = make_qkv(100, hq=16, hkv=4, d=128, dtype=torch.bfloat16, layout="HND", seed=8)
    check(q, k, v, kv_layout="HND", pos_encoding_mode="ALIBI", logits_soft_cap=8.0, window_left=60,
          sm_scale=0.15, q_scale=1.1, k_scale=0.9, v_scale=1.2, use_tensor_cores=True)


def test_lse_excludes_v_scale_and_is_base_2():
    q, k, v = make_qkv(5, seed=9)
    _, lse1 = single_decode_with_kv_cache(q, k, v, return_lse=True)
    _, lse2 = single_decode_with_kv_cache(q, k, v, return_lse=True, v_scale=10.0)
    torch.testing.assert_close(lse1, lse2, rtol=0, atol=0)
    logits = torch.einsum("hd,lhd->hl", q.double(), k.double().repeat_interleave(4, dim=1)) / math.sqrt(64)
    torch.testing.assert_close(lse1.double(), torch.logsumexp(logits, dim=-1) / math.log(2), rtol=0, atol=LSE_ATOL)


def test_empty_kv_gives_zero_output_and_minus_inf_lse():
    q, k, v = make_qkv(0, seed=10)
    out, lse = single_decode_with_kv_cache(q, k, v, return_lse=True)
    ref, ref_lse = dense.single_decode(q, k, v)
    assert (out.float() == 0).all() and (ref == 0).all()
    assert torch.isneginf(lse).all() and torch.isneginf(ref_lse).all()
