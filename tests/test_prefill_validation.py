"""Input validation of ``trtllm_batch_context_with_kv_cache``: one test per error."""

import pytest
import torch
from validation_cases import BF16, FP8, case, expect, meta, paged, strided_last, set_args

from kvattn.formats import FP4Tensor
from kvattn.prefill import trtllm_batch_context_with_kv_cache


def valid():
    c = paged(layout="HND")
    cq = torch.tensor([0, 5, 15], dtype=torch.int32)
    ckv = torch.tensor([0, 5, 25], dtype=torch.int32)
    return dict(query=torch.randn(15, 8, 64, dtype=BF16), kv_cache=c.kv_cache,
                workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), block_tables=c.block_tables,
                seq_lens=c.seq_lens, max_q_len=10, max_kv_len=20, bmm1_scale=0.125, bmm2_scale=1.0, batch_size=2,
                cum_seq_lens_q=cq, cum_seq_lens_kv=ckv)


def _nvfp4(kw):
    c = paged(kv_format="nvfp4", layout="HND")
    kw.update(kv_cache=c.kv_cache, block_tables=c.block_tables, kv_block_scales=c.kv_cache_sf)


def _fp4_parts():
    t = FP4Tensor.empty(15, 8, 64, "cpu")
    return t.data, t.scale


CASES = [
    case("query-dtype", set_args(query=lambda kw: kw["query"].float()), TypeError, "query"),
    case("query-rank", set_args(query=lambda kw: kw["query"][0]), ValueError, "query"),
    case("query-head-dim", set_args(query=torch.randn(15, 8, 48, dtype=BF16)), ValueError, "query"),
    case("query-stride", set_args(query=lambda kw: strided_last(kw["query"])), ValueError, "query"),
    case("query-head-ratio", set_args(query=torch.randn(15, 3, 64, dtype=BF16)), ValueError, "query"),
    case("query-fp8-with-bf16-cache", set_args(query=lambda kw: kw["query"].to(FP8)), TypeError, "kv_cache"),
    case("kv_cache-other-16-bit-dtype", set_args(kv_cache=lambda kw: kw["kv_cache"].half()), TypeError, "query"),
    case("kv_cache-dtype", set_args(kv_cache=lambda kw: kw["kv_cache"].float()), TypeError, "kv_cache"),
    case("kv_cache-device", set_args(kv_cache=lambda kw: meta(kw["kv_cache"])), ValueError, "kv_cache"),
    case("kv_cache-stride", set_args(kv_cache=lambda kw: strided_last(kw["kv_cache"])), ValueError, "kv_cache"),
    case("kv_layout", set_args(kv_layout="HDN"), ValueError, "kv_layout"),
    case("block_tables-split-shape", set_args(uses_shared_paged_kv_idx=False), ValueError, "block_tables"),
    case("block_tables-shared-3d", set_args(block_tables=lambda kw: torch.stack([kw["block_tables"]] * 2, 1)),
         ValueError, "block_tables"),
    case("block_tables-rows", set_args(block_tables=lambda kw: kw["block_tables"][:1]), ValueError, "block_tables"),
    case("uses_shared_paged_kv_idx-type", set_args(uses_shared_paged_kv_idx=0), TypeError, "uses_shared_paged_kv_idx"),
    case("batch_size-negative", set_args(batch_size=-1), ValueError, "batch_size"),
    case("batch_size-float", set_args(batch_size=2.0), TypeError, "batch_size"),
    case("seq_lens-count", set_args(seq_lens=torch.tensor([5], dtype=torch.int32)), ValueError, "seq_lens"),
    case("seq_lens-dtype", set_args(seq_lens=lambda kw: kw["seq_lens"].to(torch.int16)), TypeError, "seq_lens"),
    case("max_kv_len-over-capacity", set_args(max_kv_len=10_000), ValueError, "max_kv_len"),
    case("max_q_len-over-max_kv_len", set_args(max_q_len=21), ValueError, "max_q_len"),
    case("max_q_len-negative", set_args(max_q_len=-1), ValueError, "max_q_len"),
    case("cum_seq_lens_q-shape", set_args(cum_seq_lens_q=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
         "cum_seq_lens_q"),
    case("cum_seq_lens_q-dtype", set_args(cum_seq_lens_q=lambda kw: kw["cum_seq_lens_q"].float()), TypeError,
         "cum_seq_lens_q"),
    case("cum_seq_lens_kv-device", set_args(cum_seq_lens_kv=lambda kw: meta(kw["cum_seq_lens_kv"])), ValueError,
         "cum_seq_lens_kv"),
    case("window_left", set_args(window_left=-3), ValueError, "window_left"),
    case("sinks-count", set_args(sinks=[torch.zeros(3)]), ValueError, "sinks"),
    case("sinks-list-of-two", set_args(sinks=[torch.zeros(8), torch.zeros(8)]), ValueError, "sinks"),
    case("skip_softmax-negative", set_args(skip_softmax_threshold_scale_factor=-1.0), ValueError,
         "skip_softmax_threshold_scale_factor"),
    case("o_sf_vec_size", set_args(o_sf_vec_size=32), ValueError, "o_sf_vec_size"),
    case("o_sf_scale-zero", set_args(out_dtype="nvfp4", o_sf_scale=0.0), ValueError, "o_sf_scale"),
    case("out_dtype-str", set_args(out_dtype="int8"), ValueError, "out_dtype"),
    case("out_dtype-dtype", set_args(out_dtype=torch.float32), TypeError, "out_dtype"),
    case("out-dtype-mismatch", set_args(out_dtype=torch.float16, out=torch.empty(15, 8, 64, dtype=BF16)), TypeError,
         "out"),
    case("out-shape", set_args(out=torch.empty(15, 8, 32, dtype=BF16)), ValueError, "out"),
    case("out-tensor-for-nvfp4", set_args(out_dtype="nvfp4", out=torch.empty(15, 8, 32, dtype=torch.uint8)), TypeError,
         "out"),
    case("out-fp4tensor-without-nvfp4", set_args(out_dtype=BF16, out=FP4Tensor.empty(15, 8, 64, "cpu")), TypeError,
         "out"),
    case("out.data-shape", set_args(out=FP4Tensor(torch.empty(15, 8, 64, dtype=torch.uint8),
                                               FP4Tensor.empty(15, 8, 64, "cpu").scale)), ValueError, "out.data"),
    case("out.scale-rows", set_args(out=FP4Tensor(torch.empty(15, 8, 32, dtype=torch.uint8),
                                               torch.empty(8, 32, dtype=FP8))), ValueError, "out.scale"),
    case("kv_block_scales-with-bf16-cache", set_args(kv_block_scales=lambda kw: kw["kv_cache"].to(FP8)[..., :4]),
         ValueError, "kv_block_scales"),
    # (missing scales: named by the release's name, kv_cache_sf, whichever the call used)
    case("kv_block_scales-missing", lambda kw: (_nvfp4(kw), kw.pop("kv_block_scales")), ValueError,
         "kv_cache_sf"),
    case("kv_cache_sf-with-bf16-cache", set_args(kv_cache_sf=lambda kw: kw["kv_cache"].to(FP8)[..., :4]),
         ValueError, "kv_cache_sf"),
    case("kv_cache_sf-and-kv_block_scales", lambda kw: (_nvfp4(kw), kw.update(kv_cache_sf=kw["kv_block_scales"])),
         TypeError, "kv_block_scales"),
    case("causal-int", set_args(causal=1), TypeError, "causal"),
    case("causal-false-with-window", set_args(causal=False, window_left=16), ValueError, "window_left"),
    case("use_fp16_softmax-str", set_args(use_fp16_softmax="yes"), TypeError, "use_fp16_softmax"),
    case("uses_spcompress-int", set_args(uses_spcompress=0), TypeError, "uses_spcompress"),
    case("multi_ctas_kv_counter_buffer-float", set_args(multi_ctas_kv_counter_buffer=torch.zeros(8)), TypeError,
         "multi_ctas_kv_counter_buffer"),
    case("backend", set_args(backend="fa3"), ValueError, "backend"),
    case("return_lse-int", set_args(return_lse=1), TypeError, "return_lse"),
    case("enable_pdl", set_args(enable_pdl="on"), TypeError, "enable_pdl"),
    case("bmm1_scale-none", set_args(bmm1_scale=None), TypeError, "bmm1_scale"),
    case("query-zero-heads", set_args(query=torch.randn(15, 0, 64, dtype=BF16)), ValueError, "query"),
    case("query-fp16-with-bf16-cache", set_args(query=lambda kw: kw["query"].half()), TypeError, "query"),
    case("kv_cache-NHD-read-as-HND", set_args(kv_cache=lambda kw: paged(layout="NHD").kv_cache), ValueError,
         "kv_cache"),
    case("out-int32", set_args(out=torch.empty(15, 8, 64, dtype=torch.int32)), TypeError, "out"),
    case("out-not-a-tensor", set_args(out=[0.0]), TypeError, "out"),
    case("o_sf_scale-inf", set_args(out_dtype="nvfp4", o_sf_scale=float("inf")), ValueError, "o_sf_scale"),
    case("o_sf_scale-nan", set_args(out_dtype="nvfp4", o_sf_scale=float("nan")), ValueError, "o_sf_scale"),
    case("o_sf_scale-str", set_args(out_dtype="nvfp4", o_sf_scale="1"), TypeError, "o_sf_scale"),
    case("out.scale_start_index-negative",
         set_args(out=lambda kw: FP4Tensor(*_fp4_parts(), scale_start_index=-1)), ValueError, "out.scale_start_index"),
]


def test_valid_baseline_runs():
    assert trtllm_batch_context_with_kv_cache(**valid()).shape == (15, 8, 64)


@pytest.mark.parametrize("mutate, exc, name", CASES)
def test_error(mutate, exc, name):
    kw = valid()
    mutate(kw)
    expect(trtllm_batch_context_with_kv_cache, kw, exc, name)


def test_release_positional_call_with_lse_at_24():
    """A call written for FlashInfer 0.7.2.post1 (every argument positional, kv_cache_sf at 20, causal
    at 23, lse at 24 without return_lse): runs, writes the LSE it is given, returns the output only."""
    kw = valid()
    lse = torch.full((15, 8), float("nan"))
    names = ("query", "kv_cache", "workspace_buffer", "block_tables", "seq_lens", "max_q_len", "max_kv_len",
             "bmm1_scale", "bmm2_scale", "batch_size", "cum_seq_lens_q", "cum_seq_lens_kv")
    args = [kw[n] for n in names] + [-1, None, None, None, None, "HND", None, None, None, None, True, True, lse,
                                     False, torch.zeros(64, dtype=torch.uint8), False, False, "trtllm-gen"]
    assert len(args) == 30 and args[23] is True and args[24] is lse
    got = trtllm_batch_context_with_kv_cache(*args)
    want, want_lse = trtllm_batch_context_with_kv_cache(**dict(kw, return_lse=True))
    assert isinstance(got, torch.Tensor) and torch.equal(got, want)
    assert torch.equal(lse, want_lse)
    # causal=False at 23: another result (rows see keys past their position)
    args[23] = False
    assert not torch.equal(trtllm_batch_context_with_kv_cache(*args), want)
