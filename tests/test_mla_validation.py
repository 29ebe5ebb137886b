"""Input validation of ``xqa_batch_decode_with_kv_cache_mla``: one test per error."""

import pytest
import torch
from validation_cases import BF16, case, expect, meta, strided_last

from kvattn.mla import xqa_batch_decode_with_kv_cache_mla


def valid():
    return dict(query=torch.randn(2, 1, 16, 576, dtype=BF16), kv_cache=torch.randn(4, 32, 576, dtype=BF16),
                workspace_buffer=torch.zeros(1024, dtype=torch.uint8), qk_nope_head_dim=128, kv_lora_rank=512,
                qk_rope_head_dim=64, block_tables=torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
                seq_lens=torch.tensor([40, 64], dtype=torch.int32), max_seq_len=64)


def _set(**changes):
    def mutate(kw):
        for k, v in changes.items():
            kw[k] = v(kw) if callable(v) else v
    return mutate


CASES = [
    case("qk_nope_head_dim", _set(qk_nope_head_dim=64), ValueError, "qk_nope_head_dim"),
    case("kv_lora_rank", _set(kv_lora_rank=256), ValueError, "kv_lora_rank"),
    case("qk_rope_head_dim", _set(qk_rope_head_dim=32), ValueError, "qk_rope_head_dim"),
    case("kv_lora_rank-float", _set(kv_lora_rank=512.0), TypeError, "kv_lora_rank"),
    case("query-dtype-fp16", _set(query=lambda kw: kw["query"].half()), TypeError, "query"),
    case("query-rank", _set(query=lambda kw: kw["query"][:, 0]), ValueError, "query"),
    case("query-q-len-2", _set(query=torch.randn(2, 2, 16, 576, dtype=BF16)), ValueError, "query"),
    case("query-dim", _set(query=torch.randn(2, 1, 16, 512, dtype=BF16)), ValueError, "query"),
    case("query-stride", _set(query=lambda kw: strided_last(kw["query"])), ValueError, "query"),
    case("kv_cache-dtype", _set(kv_cache=lambda kw: kw["kv_cache"].half()), TypeError, "kv_cache"),
    case("kv_cache-dim", _set(kv_cache=torch.randn(4, 32, 512, dtype=BF16)), ValueError, "kv_cache"),
    case("kv_cache-4d-plane-2", _set(kv_cache=torch.randn(4, 2, 32, 576, dtype=BF16)), ValueError, "kv_cache"),
    case("kv_cache-rank", _set(kv_cache=lambda kw: kw["kv_cache"][0]), ValueError, "kv_cache"),
    case("kv_cache-device", _set(kv_cache=lambda kw: meta(kw["kv_cache"])), ValueError, "kv_cache"),
    case("kv_cache-stride", _set(kv_cache=lambda kw: strided_last(kw["kv_cache"])), ValueError, "kv_cache"),
    case("sinks-not-none", _set(sinks=[torch.zeros(16)]), ValueError, "sinks"),
    case("block_tables-dtype", _set(block_tables=lambda kw: kw["block_tables"].long()), TypeError, "block_tables"),
    case("block_tables-rows", _set(block_tables=lambda kw: kw["block_tables"][:1]), ValueError, "block_tables"),
    case("seq_lens-dtype", _set(seq_lens=lambda kw: kw["seq_lens"].float()), TypeError, "seq_lens"),
    case("max_seq_len-over-capacity", _set(max_seq_len=65), ValueError, "max_seq_len"),
    case("out-dtype", _set(out=torch.empty(2, 16, 512, dtype=torch.float16)), TypeError, "out"),
    case("out-shape-with-q-len", _set(out=torch.empty(2, 1, 16, 512, dtype=BF16)), ValueError, "out"),
    case("bmm1_scale-tensor-device", _set(bmm1_scale=meta(torch.ones(1))), ValueError, "bmm1_scale"),
    case("bmm2_scale-str", _set(bmm2_scale="x"), TypeError, "bmm2_scale"),
    case("enable_pdl", _set(enable_pdl=0), TypeError, "enable_pdl"),
    case("workspace-dtype", _set(workspace_buffer=torch.zeros(8)), TypeError, "workspace_buffer"),
]


def test_valid_baseline_runs():
    assert xqa_batch_decode_with_kv_cache_mla(**valid()).shape == (2, 16, 512)


@pytest.mark.parametrize("mutate, exc, name", CASES)
def test_error(mutate, exc, name):
    kw = valid()
    mutate(kw)
    expect(xqa_batch_decode_with_kv_cache_mla, kw, exc, name)
