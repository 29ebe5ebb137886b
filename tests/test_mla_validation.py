"""Input validation of ``xqa_batch_decode_with_kv_cache_mla``: one test per error."""

import pytest
import torch
from validation_cases import BF16, case, expect, meta, strided_last, set_args

from kvattn.mla import xqa_batch_decode_with_kv_cache_mla


def valid():
    return dict(query=torch.randn(2, 1, 16, 576, dtype=BF16), kv_cache=torch.randn(4, 32, 576, dtype=BF16),
                workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), qk_nope_head_dim=128, kv_lora_rank=512,
                qk_rope_head_dim=64, block_tables=torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
                seq_lens=torch.tensor([40, 64], dtype=torch.int32), max_seq_len=64)


CASES = [
    case("qk_nope_head_dim", set_args(qk_nope_head_dim=64), ValueError, "qk_nope_head_dim"),
    case("kv_lora_rank", set_args(kv_lora_rank=256), ValueError, "kv_lora_rank"),
    case("qk_rope_head_dim", set_args(qk_rope_head_dim=32), ValueError, "qk_rope_head_dim"),
    case("kv_lora_rank-float", set_args(kv_lora_rank=512.0), TypeError, "kv_lora_rank"),
    case("query-dtype-fp16", set_args(query=lambda kw: kw["query"].half()), TypeError, "query"),
    case("query-rank", set_args(query=lambda kw: kw["query"][:, 0]), ValueError, "query"),
    case("query-q-len-0", set_args(query=torch.randn(2, 0, 16, 576, dtype=BF16)), ValueError, "query"),
    case("query-q-len-5-above-the-limit", set_args(query=torch.randn(2, 5, 16, 576, dtype=BF16)), ValueError,
         "query"),
    case("out-3d-with-q-len-2", set_args(query=torch.randn(2, 2, 16, 576, dtype=BF16),
                                         out=torch.empty(2, 16, 512, dtype=BF16)), ValueError, "out"),
    case("out-q-len-3-for-q-len-2", set_args(query=torch.randn(2, 2, 16, 576, dtype=BF16),
                                             out=torch.empty(2, 3, 16, 512, dtype=BF16)), ValueError, "out"),
    case("out-tokens-and-heads-do-not-fold", set_args(query=torch.randn(2, 2, 16, 576, dtype=BF16),
                                                      out=torch.empty(2, 2, 32, 512, dtype=BF16)[:, :, :16]),
         ValueError, "out"),
    case("lse-3d-shape-with-q-len-2", set_args(query=torch.randn(2, 2, 16, 576, dtype=BF16), return_lse=True,
                                               lse=torch.empty(2, 16)), ValueError, "lse"),
    case("lse-tokens-and-heads-do-not-fold", set_args(query=torch.randn(2, 2, 16, 576, dtype=BF16),
                                                      return_lse=True, lse=torch.empty(2, 2, 32)[:, :, :16]),
         ValueError, "lse"),
    case("query-dim", set_args(query=torch.randn(2, 1, 16, 512, dtype=BF16)), ValueError, "query"),
    case("query-stride", set_args(query=lambda kw: strided_last(kw["query"])), ValueError, "query"),
    case("kv_cache-dtype", set_args(kv_cache=lambda kw: kw["kv_cache"].half()), TypeError, "kv_cache"),
    case("kv_cache-dim", set_args(kv_cache=torch.randn(4, 32, 512, dtype=BF16)), ValueError, "kv_cache"),
    case("kv_cache-4d-plane-2", set_args(kv_cache=torch.randn(4, 2, 32, 576, dtype=BF16)), ValueError, "kv_cache"),
    case("kv_cache-rank", set_args(kv_cache=lambda kw: kw["kv_cache"][0]), ValueError, "kv_cache"),
    case("kv_cache-device", set_args(kv_cache=lambda kw: meta(kw["kv_cache"])), ValueError, "kv_cache"),
    case("kv_cache-stride", set_args(kv_cache=lambda kw: strided_last(kw["kv_cache"])), ValueError, "kv_cache"),
    case("sinks-not-none", set_args(sinks=[torch.zeros(16)]), ValueError, "sinks"),
    case("block_tables-dtype", set_args(block_tables=lambda kw: kw["block_tables"].long()), TypeError, "block_tables"),
    case("block_tables-rows", set_args(block_tables=lambda kw: kw["block_tables"][:1]), ValueError, "block_tables"),
    case("seq_lens-dtype", set_args(seq_lens=lambda kw: kw["seq_lens"].float()), TypeError, "seq_lens"),
    case("max_seq_len-over-capacity", set_args(max_seq_len=65), ValueError, "max_seq_len"),
    case("out-dtype", set_args(out=torch.empty(2, 16, 512, dtype=torch.float16)), TypeError, "out"),
    case("out-q-len-2-for-q-len-1", set_args(out=torch.empty(2, 2, 16, 512, dtype=BF16)), ValueError, "out"),
    case("bmm1_scale-tensor-device", set_args(bmm1_scale=meta(torch.ones(1))), ValueError, "bmm1_scale"),
    case("bmm2_scale-str", set_args(bmm2_scale="x"), TypeError, "bmm2_scale"),
    case("enable_pdl", set_args(enable_pdl=0), TypeError, "enable_pdl"),
    case("workspace-dtype", set_args(workspace_buffer=torch.zeros(8)), TypeError, "workspace_buffer"),
    case("query-zero-heads", set_args(query=torch.randn(2, 1, 0, 576, dtype=BF16)), ValueError, "query"),
    case("out-not-a-tensor", set_args(out=(1, 2)), TypeError, "out"),
    case("out-int32", set_args(out=torch.empty(2, 16, 512, dtype=torch.int32)), TypeError, "out"),
]


def test_valid_baseline_runs():
    assert xqa_batch_decode_with_kv_cache_mla(**valid()).shape == (2, 16, 512)


@pytest.mark.parametrize("q_len", [2, 4], ids=lambda q: f"Q{q}")
def test_valid_mtp_and_4d_outputs_run(q_len):
    """Q tokens give [B, Q, Hq, 512]; Q = 1 takes a 4-D out [B, 1, Hq, 512] as well."""
    kw = valid()
    kw["query"] = torch.randn(2, q_len, 16, 576, dtype=BF16)
    assert xqa_batch_decode_with_kv_cache_mla(**kw).shape == (2, q_len, 16, 512)
    kw = valid()
    out = torch.empty(2, 1, 16, 512, dtype=BF16)
    assert xqa_batch_decode_with_kv_cache_mla(**kw, out=out) is out


@pytest.mark.parametrize("mutate, exc, name", CASES)
def test_error(mutate, exc, name):
    kw = valid()
    mutate(kw)
    expect(xqa_batch_decode_with_kv_cache_mla, kw, exc, name)
