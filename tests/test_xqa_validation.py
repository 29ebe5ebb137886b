"""Input validation of ``xqa``: one test per error."""

import pytest
import torch
from validation_cases import BF16, FP8, case, expect, meta, strided_last

from kvattn.xqa import xqa


def valid():
    pool = 4 * 16 * 2  # 4 pages of 16 tokens, 2 KV heads
    return dict(q=torch.randn(2, 1, 8, 64, dtype=BF16), k_cache=torch.randn(pool, 64, dtype=BF16),
                v_cache=torch.randn(pool, 64, dtype=BF16), page_table=torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
                seq_lens=torch.tensor([[20], [32]], dtype=torch.uint32), output=torch.empty(2, 1, 8, 64, dtype=BF16),
                workspace_buffer=torch.zeros(1024, dtype=torch.uint8), semaphores=torch.zeros(8, dtype=torch.uint32),
                num_kv_heads=2, page_size=16)


def _set(**changes):
    def mutate(kw):
        for k, v in changes.items():
            kw[k] = v(kw) if callable(v) else v
    return mutate


CASES = [
    case("q-dtype", _set(q=lambda kw: kw["q"].float()), TypeError, "q"),
    case("q-rank", _set(q=lambda kw: kw["q"][:, 0]), ValueError, "q"),
    case("q-beam-width-2", _set(q=torch.randn(2, 2, 8, 64, dtype=BF16)), ValueError, "q"),
    case("q-stride", _set(q=lambda kw: strided_last(kw["q"])), ValueError, "q"),
    case("q-head-ratio", _set(q=torch.randn(2, 1, 5, 64, dtype=BF16), output=torch.empty(2, 1, 5, 64, dtype=BF16)),
         ValueError, "q"),
    case("num_kv_heads-zero", _set(num_kv_heads=0), ValueError, "num_kv_heads"),
    case("num_kv_heads-float", _set(num_kv_heads=2.0), TypeError, "num_kv_heads"),
    case("page_size-8", _set(page_size=8), ValueError, "page_size"),
    case("page_size-256", _set(page_size=256), ValueError, "page_size"),
    case("k_cache-dtype", _set(k_cache=lambda kw: kw["k_cache"].half()), TypeError, "k_cache"),
    case("k_cache-head-dim", _set(k_cache=lambda kw: kw["k_cache"][:, :32].contiguous()), ValueError, "k_cache"),
    case("k_cache-pool-size", _set(k_cache=lambda kw: kw["k_cache"][:-2]), ValueError, "k_cache"),
    case("k_cache-stride", _set(k_cache=lambda kw: strided_last(kw["k_cache"])), ValueError, "k_cache"),
    case("k_cache-device", _set(k_cache=lambda kw: meta(kw["k_cache"])), ValueError, "k_cache"),
    case("v_cache-dtype-differs", _set(v_cache=lambda kw: kw["v_cache"].to(FP8)), TypeError, "v_cache"),
    case("v_cache-4d-page-size", _set(v_cache=torch.randn(4, 32, 2, 64, dtype=BF16)), ValueError, "v_cache"),
    case("kv_layout", _set(kv_layout="XYZ"), ValueError, "kv_layout"),
    case("page_table-dtype", _set(page_table=lambda kw: kw["page_table"].long()), TypeError, "page_table"),
    case("page_table-rows", _set(page_table=lambda kw: kw["page_table"][:1]), ValueError, "page_table"),
    case("page_table-device", _set(page_table=lambda kw: meta(kw["page_table"])), ValueError, "page_table"),
    case("seq_lens-dtype", _set(seq_lens=lambda kw: kw["seq_lens"].to(torch.int64)), TypeError, "seq_lens"),
    case("seq_lens-count", _set(seq_lens=torch.tensor([[20]], dtype=torch.uint32)), ValueError, "seq_lens"),
    case("output-dtype", _set(output=torch.empty(2, 1, 8, 64)), TypeError, "output"),
    case("output-shape", _set(output=torch.empty(2, 8, 64, dtype=BF16)), ValueError, "output"),
    case("output-fp8-with-bf16-cache", _set(output=torch.empty(2, 1, 8, 64, dtype=FP8)), TypeError, "output"),
    case("workspace-dtype", _set(workspace_buffer=torch.zeros(8, dtype=torch.int32)), TypeError, "workspace_buffer"),
    case("semaphores-dtype", _set(semaphores=torch.zeros(8, dtype=torch.int32)), TypeError, "semaphores"),
    case("semaphores-device", _set(semaphores=meta(torch.zeros(8, dtype=torch.uint32))), ValueError, "semaphores"),
    case("sinks-shape", _set(sinks=torch.zeros(8)), ValueError, "sinks"),
    case("sinks-dtype", _set(sinks=torch.zeros(2, 4, dtype=torch.float64)), TypeError, "sinks"),
    case("sliding_win_size-negative", _set(sliding_win_size=-1), ValueError, "sliding_win_size"),
    case("sm_count-zero", _set(sm_count=0), ValueError, "sm_count"),
    case("q_scale-str", _set(q_scale="1"), TypeError, "q_scale"),
    case("kv_scale-shape", lambda kw: kw.update(k_cache=kw["k_cache"].to(FP8), v_cache=kw["v_cache"].to(FP8),
                                                kv_scale=torch.ones(2)), ValueError, "kv_scale"),
    case("kv_scale-dtype", lambda kw: kw.update(k_cache=kw["k_cache"].to(FP8), v_cache=kw["v_cache"].to(FP8),
                                                kv_scale=torch.ones(1, dtype=torch.float16)), TypeError, "kv_scale"),
]


def test_valid_baseline_runs():
    kw = valid()
    assert xqa(**kw) is None
    assert torch.isfinite(kw["output"].float()).all()


@pytest.mark.parametrize("mutate, exc, name", CASES)
def test_error(mutate, exc, name):
    kw = valid()
    mutate(kw)
    expect(xqa, kw, exc, name)
