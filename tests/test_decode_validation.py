"""Input validation of ``xqa_batch_decode_with_kv_cache``: one test per error."""

import pytest
import torch
from validation_cases import BF16, FP8, case, expect, meta, paged, strided_last, set_args

from kvattn.decode import xqa_batch_decode_with_kv_cache


def valid():
    c = paged()
    return dict(query=torch.randn(2, 8, 64, dtype=BF16), kv_cache=c.kv_cache,
                workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), block_tables=c.block_tables,
                seq_lens=c.seq_lens, max_seq_len=20)


def _nvfp4(kw):
    c = paged(kv_format="nvfp4")
    kw.update(kv_cache=c.kv_cache, block_tables=c.block_tables, kv_cache_sf=c.kv_cache_sf)


CASES = [
    case("query-not-tensor", set_args(query=[1.0]), TypeError, "query"),
    case("query-dtype", set_args(query=lambda kw: kw["query"].float()), TypeError, "query"),
    case("query-rank", set_args(query=lambda kw: kw["query"][0]), ValueError, "query"),
    case("query-head-dim", set_args(query=torch.randn(2, 8, 96, dtype=BF16)), ValueError, "query"),
    case("query-stride", set_args(query=lambda kw: strided_last(kw["query"])), ValueError, "query"),
    case("query-head-ratio", set_args(query=torch.randn(2, 7, 64, dtype=BF16)), ValueError, "query"),
    case("kv_layout", set_args(kv_layout="NDH"), ValueError, "kv_layout"),
    case("kv_layout-type", set_args(kv_layout=1), ValueError, "kv_layout"),
    case("kv_cache-dtype", set_args(kv_cache=lambda kw: kw["kv_cache"].float()), TypeError, "kv_cache"),
    case("kv_cache-other-half", set_args(kv_cache=lambda kw: kw["kv_cache"].half()), TypeError, "query"),
    case("kv_cache-plane-3", set_args(kv_cache=lambda kw: torch.cat([kw["kv_cache"], kw["kv_cache"][:, :1]], 1)),
         ValueError, "kv_cache"),
    case("kv_cache-rank", set_args(kv_cache=lambda kw: kw["kv_cache"][0]), ValueError, "kv_cache"),
    case("kv_cache-tuple-3", set_args(kv_cache=lambda kw: tuple(kw["kv_cache"][:, 0] for _ in range(3))),
         ValueError, "kv_cache"),
    case("kv_cache-tuple-dtypes", set_args(kv_cache=lambda kw: (kw["kv_cache"][:, 0], kw["kv_cache"][:, 1].half())),
         TypeError, "kv_cache"),
    case("kv_cache-head-dim", set_args(kv_cache=lambda kw: kw["kv_cache"][..., :32]), ValueError, "kv_cache"),
    case("kv_cache-stride", set_args(kv_cache=lambda kw: strided_last(kw["kv_cache"])), ValueError, "kv_cache"),
    case("kv_cache-device", set_args(kv_cache=lambda kw: meta(kw["kv_cache"])), ValueError, "kv_cache"),
    case("block_tables-dtype", set_args(block_tables=lambda kw: kw["block_tables"].long()), TypeError, "block_tables"),
    case("block_tables-rows", set_args(block_tables=lambda kw: kw["block_tables"][:1]), ValueError, "block_tables"),
    case("block_tables-rank", set_args(block_tables=lambda kw: kw["block_tables"][:, None]), ValueError,
         "block_tables"),
    case("block_tables-device", set_args(block_tables=lambda kw: meta(kw["block_tables"])), ValueError,
         "block_tables"),
    case("seq_lens-dtype", set_args(seq_lens=lambda kw: kw["seq_lens"].long()), TypeError, "seq_lens"),
    case("seq_lens-count", set_args(seq_lens=torch.tensor([5], dtype=torch.int32)), ValueError, "seq_lens"),
    case("seq_lens-device", set_args(seq_lens=lambda kw: meta(kw["seq_lens"])), ValueError, "seq_lens"),
    case("max_seq_len-over-capacity", set_args(max_seq_len=10_000), ValueError, "max_seq_len"),
    case("max_seq_len-negative", set_args(max_seq_len=-1), ValueError, "max_seq_len"),
    case("max_seq_len-float", set_args(max_seq_len=20.0), TypeError, "max_seq_len"),
    case("workspace-dtype", set_args(workspace_buffer=torch.zeros(16)), TypeError, "workspace_buffer"),
    case("workspace-strided", set_args(workspace_buffer=torch.zeros(64, dtype=torch.uint8)[::2]), ValueError,
         "workspace_buffer"),
    case("workspace-device", set_args(workspace_buffer=lambda kw: meta(kw["workspace_buffer"])), ValueError,
         "workspace_buffer"),
    case("bmm1_scale-str", set_args(bmm1_scale="1"), TypeError, "bmm1_scale"),
    case("bmm1_scale-float64-tensor", set_args(bmm1_scale=torch.tensor([1.0], dtype=torch.float64)), TypeError,
         "bmm1_scale"),
    case("bmm1_scale-two-elements", set_args(bmm1_scale=torch.ones(2)), ValueError, "bmm1_scale"),
    case("bmm1_scale-nan", set_args(bmm1_scale=float("nan")), ValueError, "bmm1_scale"),
    case("bmm2_scale-device", set_args(bmm2_scale=meta(torch.ones(1))), ValueError, "bmm2_scale"),
    case("window_left", set_args(window_left=-2), ValueError, "window_left"),
    case("window_left-float", set_args(window_left=3.0), TypeError, "window_left"),
    case("sinks-dtype", set_args(sinks=torch.zeros(8, dtype=torch.float16)), TypeError, "sinks"),
    case("sinks-count", set_args(sinks=torch.zeros(4)), ValueError, "sinks"),
    case("sinks-device", set_args(sinks=meta(torch.zeros(8))), ValueError, "sinks"),
    case("enable_pdl", set_args(enable_pdl="yes"), TypeError, "enable_pdl"),
    case("q_len_per_req-not-dividing", set_args(q_len_per_req=3), ValueError, "q_len_per_req"),
    case("q_len_per_req-zero", set_args(q_len_per_req=0), ValueError, "q_len_per_req"),
    case("o_scale-zero", set_args(o_scale=0.0), ValueError, "o_scale"),
    case("mask-dtype", set_args(mask=torch.zeros(2, 1, 2, dtype=torch.int16)), TypeError, "mask"),
    case("mask-shape", set_args(mask=torch.zeros(2, 1, 1, dtype=torch.int32).to(torch.uint16)), ValueError, "mask"),
    case("mask-device", set_args(mask=meta(torch.zeros(2, 1, 2, dtype=torch.int32).to(torch.uint16))), ValueError,
         "mask"),
    case("out-dtype", set_args(out=torch.empty(2, 8, 64, dtype=torch.float16)), TypeError, "out"),
    case("out-shape", set_args(out=torch.empty(2, 8, 32, dtype=BF16)), ValueError, "out"),
    case("out-device", set_args(out=meta(torch.empty(2, 8, 64, dtype=BF16))), ValueError, "out"),
    case("out-fp8-with-bf16-cache", set_args(out=torch.empty(2, 8, 64, dtype=FP8)), TypeError, "out"),
    case("kv_cache_sf-with-bf16-cache", set_args(kv_cache_sf=lambda kw: kw["kv_cache"].to(FP8)[..., :4]), ValueError,
         "kv_cache_sf"),
    case("kv_cache_sf-missing", lambda kw: (_nvfp4(kw), kw.pop("kv_cache_sf")), ValueError, "kv_cache_sf"),
    case("kv_cache_sf-shape", lambda kw: (_nvfp4(kw), kw.update(kv_cache_sf=kw["kv_cache_sf"][..., :2])),
         ValueError, "kv_cache_sf"),
    case("kv_cache_sf-dtype", lambda kw: (_nvfp4(kw), kw.update(kv_cache_sf=kw["kv_cache_sf"].float())),
         TypeError, "kv_cache_sf"),
    case("query-zero-heads", set_args(query=torch.randn(2, 0, 64, dtype=BF16)), ValueError, "query"),
    case("kv_cache-zero-heads", set_args(kv_cache=lambda kw: kw["kv_cache"][:, :, :, :0]), ValueError, "kv_cache"),
    # A 16-bit cache of the other 16-bit dtype: the query is named, with both dtypes.
    case("query-fp16-with-bf16-cache", set_args(query=lambda kw: kw["query"].half()), TypeError, "query"),
    case("kv_cache-HND-read-as-NHD", set_args(kv_cache=lambda kw: paged(layout="HND").kv_cache), ValueError,
         "kv_cache"),
    case("kv_cache-NHD-read-as-HND", set_args(kv_layout="HND"), ValueError, "kv_cache"),
    case("out-not-a-tensor", set_args(out=[0.0]), TypeError, "out"),
    case("out-int32", set_args(out=torch.empty(2, 8, 64, dtype=torch.int32)), TypeError, "out"),
]


def test_valid_baseline_runs():
    out = xqa_batch_decode_with_kv_cache(**valid())
    assert out.shape == (2, 8, 64)


@pytest.mark.parametrize("mutate, exc, name", CASES)
def test_error(mutate, exc, name):
    kw = valid()
    mutate(kw)
    expect(xqa_batch_decode_with_kv_cache, kw, exc, name)


@pytest.mark.parametrize("given, meant", [("NHD", "HND"), ("HND", "NHD")])
def test_layout_mixup_names_kv_layout(given, meant):
    kw = valid()
    kw["kv_cache"] = paged(layout=meant).kv_cache  # 2 KV heads, pages of 16: the other reading gives 16 heads
    kw["kv_layout"] = given
    with pytest.raises(ValueError, match=f"^kv_cache: shape .* read as {given} gives 16 KV heads, which does not "
                                         f"divide the query's 8 heads.*kv_layout='{meant}' meant"):
        xqa_batch_decode_with_kv_cache(**kw)


def test_dtype_mixup_names_both_dtypes():
    kw = valid()
    kw["query"] = kw["query"].half()
    with pytest.raises(TypeError, match=r"^query: expected the dtype of kv_cache \(bfloat16.*got float16"):
        xqa_batch_decode_with_kv_cache(**kw)
