"""Input validation of ``single_decode_with_kv_cache``: one test per error."""

import pytest
import torch
from validation_cases import BF16, FP8, case, expect, meta, strided_last

from kvattn.decode import single_decode_with_kv_cache


def valid():
    return dict(q=torch.randn(8, 64, dtype=BF16), k=torch.randn(10, 2, 64, dtype=BF16),
                v=torch.randn(10, 2, 64, dtype=BF16))


def _set(**changes):
    def mutate(kw):
        for k, v in changes.items():
            kw[k] = v(kw) if callable(v) else v
    return mutate


CASES = [
    case("q-dtype", _set(q=lambda kw: kw["q"].float()), TypeError, "q"),
    case("q-rank", _set(q=lambda kw: kw["q"][None]), ValueError, "q"),
    case("q-head-dim", _set(q=torch.randn(8, 80, dtype=BF16)), ValueError, "q"),
    case("q-stride", _set(q=lambda kw: strided_last(kw["q"])), ValueError, "q"),
    case("q-head-ratio", _set(q=torch.randn(3, 64, dtype=BF16)), ValueError, "q"),
    case("k-dtype", _set(k=lambda kw: kw["k"].half()), TypeError, "k"),
    case("k-rank", _set(k=lambda kw: kw["k"][None]), ValueError, "k"),
    case("k-device", _set(k=lambda kw: meta(kw["k"])), ValueError, "k"),
    case("k-stride", _set(k=lambda kw: strided_last(kw["k"])), ValueError, "k"),
    case("k-head-dim", _set(k=torch.randn(10, 2, 32, dtype=BF16), v=torch.randn(10, 2, 32, dtype=BF16)),
         ValueError, "k"),
    case("v-dtype-differs-from-k", _set(v=lambda kw: kw["v"].to(FP8)), TypeError, "v"),
    case("v-shape", _set(v=torch.randn(11, 2, 64, dtype=BF16)), ValueError, "v"),
    case("kv_layout", _set(kv_layout="BHD"), ValueError, "kv_layout"),
    case("pos_encoding_mode", _set(pos_encoding_mode="ROPE"), ValueError, "pos_encoding_mode"),
    case("use_tensor_cores", _set(use_tensor_cores=1), TypeError, "use_tensor_cores"),
    case("window_left", _set(window_left=-5), ValueError, "window_left"),
    case("logits_soft_cap-negative", _set(logits_soft_cap=-1.0), ValueError, "logits_soft_cap"),
    case("logits_soft_cap-str", _set(logits_soft_cap="1"), TypeError, "logits_soft_cap"),
    case("sm_scale-inf", _set(sm_scale=float("inf")), ValueError, "sm_scale"),
    case("q_scale-str", _set(q_scale="2"), TypeError, "q_scale"),
    case("k_scale-tensor", _set(k_scale=torch.ones(1)), TypeError, "k_scale"),
    case("v_scale-nan", _set(v_scale=float("nan")), ValueError, "v_scale"),
    case("rope_scale-zero", _set(rope_scale=0.0), ValueError, "rope_scale"),
    case("rope_theta-negative", _set(rope_theta=-1.0), ValueError, "rope_theta"),
    case("return_lse", _set(return_lse=1), TypeError, "return_lse"),
]


def test_valid_baseline_runs():
    assert single_decode_with_kv_cache(**valid()).shape == (8, 64)


@pytest.mark.parametrize("mutate, exc, name", CASES)
def test_error(mutate, exc, name):
    kw = valid()
    mutate(kw)
    expect(single_decode_with_kv_cache, kw, exc, name)
