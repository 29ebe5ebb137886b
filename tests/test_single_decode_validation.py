"""Input validation of ``single_decode_with_kv_cache``: one test per error."""

import pytest
import torch
from validation_cases import BF16, FP8, case, expect, meta, strided_last, set_args

from kvattn.decode import single_decode_with_kv_cache


def valid():
    return dict(q=torch.randn(8, 64, dtype=BF16), k=torch.randn(10, 2, 64, dtype=BF16),
                v=torch.randn(10, 2, 64, dtype=BF16))


CASES = [
    case("q-dtype", set_args(q=lambda kw: kw["q"].float()), TypeError, "q"),
    case("q-rank", set_args(q=lambda kw: kw["q"][None]), ValueError, "q"),
    case("q-head-dim", set_args(q=torch.randn(8, 80, dtype=BF16)), ValueError, "q"),
    case("q-stride", set_args(q=lambda kw: strided_last(kw["q"])), ValueError, "q"),
    case("q-head-ratio", set_args(q=torch.randn(3, 64, dtype=BF16)), ValueError, "q"),
    # A 16-bit k of the other 16-bit dtype: the query is named, with both dtypes.
    case("k-other-16-bit-dtype", set_args(k=lambda kw: kw["k"].half(), v=lambda kw: kw["v"].half()), TypeError, "q"),
    case("k-dtype", set_args(k=lambda kw: kw["k"].float(), v=lambda kw: kw["v"].float()), TypeError, "k"),
    case("q-zero-heads", set_args(q=torch.randn(0, 64, dtype=BF16)), ValueError, "q"),
    case("k-zero-heads", set_args(k=torch.randn(10, 0, 64, dtype=BF16), v=torch.randn(10, 0, 64, dtype=BF16)),
         ValueError, "k"),
    case("k-HND-read-as-NHD", set_args(k=torch.randn(2, 10, 64, dtype=BF16), v=torch.randn(2, 10, 64, dtype=BF16)),
         ValueError, "k"),
    case("out-not-a-tensor", set_args(out=[0.0]), TypeError, "out"),
    case("out-int32", set_args(out=torch.empty(8, 64, dtype=torch.int32)), TypeError, "out"),
    case("k-rank", set_args(k=lambda kw: kw["k"][None]), ValueError, "k"),
    case("k-device", set_args(k=lambda kw: meta(kw["k"])), ValueError, "k"),
    case("k-stride", set_args(k=lambda kw: strided_last(kw["k"])), ValueError, "k"),
    case("k-head-dim", set_args(k=torch.randn(10, 2, 32, dtype=BF16), v=torch.randn(10, 2, 32, dtype=BF16)),
         ValueError, "k"),
    case("v-dtype-differs-from-k", set_args(v=lambda kw: kw["v"].to(FP8)), TypeError, "v"),
    case("v-shape", set_args(v=torch.randn(11, 2, 64, dtype=BF16)), ValueError, "v"),
    case("kv_layout", set_args(kv_layout="BHD"), ValueError, "kv_layout"),
    case("pos_encoding_mode", set_args(pos_encoding_mode="ROPE"), ValueError, "pos_encoding_mode"),
    case("use_tensor_cores", set_args(use_tensor_cores=1), TypeError, "use_tensor_cores"),
    case("window_left", set_args(window_left=-5), ValueError, "window_left"),
    case("logits_soft_cap-negative", set_args(logits_soft_cap=-1.0), ValueError, "logits_soft_cap"),
    case("logits_soft_cap-str", set_args(logits_soft_cap="1"), TypeError, "logits_soft_cap"),
    case("sm_scale-inf", set_args(sm_scale=float("inf")), ValueError, "sm_scale"),
    case("q_scale-str", set_args(q_scale="2"), TypeError, "q_scale"),
    case("k_scale-tensor", set_args(k_scale=torch.ones(1)), TypeError, "k_scale"),
    case("v_scale-nan", set_args(v_scale=float("nan")), ValueError, "v_scale"),
    case("rope_scale-zero", set_args(rope_scale=0.0), ValueError, "rope_scale"),
    case("rope_theta-negative", set_args(rope_theta=-1.0), ValueError, "rope_theta"),
    case("return_lse", set_args(return_lse=1), TypeError, "return_lse"),
]


def test_valid_baseline_runs():
    assert single_decode_with_kv_cache(**valid()).shape == (8, 64)


@pytest.mark.parametrize("mutate, exc, name", CASES)
def test_error(mutate, exc, name):
    kw = valid()
    mutate(kw)
    expect(single_decode_with_kv_cache, kw, exc, name)


def test_layout_mixup_names_kv_layout():
    kw = valid()
    kw.update(k=kw["k"].transpose(0, 1).contiguous(), v=kw["v"].transpose(0, 1).contiguous())  # HND, read as NHD
    with pytest.raises(ValueError, match=r"^k: shape \[2, 10, 64\] read as NHD gives 10 KV heads.*kv_layout='HND'"):
        single_decode_with_kv_cache(**kw)
    kw["kv_layout"] = "HND"
    assert single_decode_with_kv_cache(**kw).shape == (8, 64)


def test_dtype_mixup_names_both_dtypes():
    kw = valid()
    kw["q"] = kw["q"].half()
    with pytest.raises(TypeError, match=r"^q: expected the dtype of k \(bfloat16.*got float16"):
        single_decode_with_kv_cache(**kw)
