"""Input validation of ``xqa``: one test per error."""

import pytest
import torch
from validation_cases import BF16, FP8, case, expect, meta, strided_last, set_args

from kvattn.xqa import xqa


def valid():
    pool = 4 * 16 * 2  # 4 pages of 16 tokens, 2 KV heads
    return dict(q=torch.randn(2, 1, 8, 64, dtype=BF16), k_cache=torch.randn(pool, 64, dtype=BF16),
                v_cache=torch.randn(pool, 64, dtype=BF16), page_table=torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
                seq_lens=torch.tensor([[20], [32]], dtype=torch.uint32), output=torch.empty(2, 1, 8, 64, dtype=BF16),
                workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), semaphores=torch.zeros(8, dtype=torch.uint32),
                num_kv_heads=2, page_size=16)


CASES = [
    case("q-dtype", set_args(q=lambda kw: kw["q"].float()), TypeError, "q"),
    case("q-rank", set_args(q=lambda kw: kw["q"][:, 0]), ValueError, "q"),
    case("q-beam-width-2", set_args(q=torch.randn(2, 2, 8, 64, dtype=BF16)), ValueError, "q"),
    case("q-stride", set_args(q=lambda kw: strided_last(kw["q"])), ValueError, "q"),
    case("q-head-ratio", set_args(q=torch.randn(2, 1, 5, 64, dtype=BF16), output=torch.empty(2, 1, 5, 64, dtype=BF16)),
         ValueError, "q"),
    case("num_kv_heads-zero", set_args(num_kv_heads=0), ValueError, "num_kv_heads"),
    case("num_kv_heads-float", set_args(num_kv_heads=2.0), TypeError, "num_kv_heads"),
    case("page_size-8", set_args(page_size=8), ValueError, "page_size"),
    case("page_size-256", set_args(page_size=256), ValueError, "page_size"),
    # A 16-bit cache of the other 16-bit dtype: the query is named, with both dtypes.
    case("k_cache-other-16-bit-dtype", set_args(k_cache=lambda kw: kw["k_cache"].half(),
                                                v_cache=lambda kw: kw["v_cache"].half()), TypeError, "q"),
    case("k_cache-dtype", set_args(k_cache=lambda kw: kw["k_cache"].float()), TypeError, "k_cache"),
    case("v_cache-other-16-bit-dtype", set_args(v_cache=lambda kw: kw["v_cache"].half()), TypeError, "v_cache"),
    case("v_cache-fewer-pages", set_args(v_cache=lambda kw: kw["v_cache"][:3 * 16 * 2]), ValueError, "v_cache"),
    case("v_cache-4d-fewer-pages", set_args(k_cache=torch.randn(4, 16, 2, 64, dtype=BF16),
                                            v_cache=torch.randn(3, 16, 2, 64, dtype=BF16)), ValueError, "v_cache"),
    case("k_cache-4d-HND-read-as-NHD", set_args(k_cache=torch.randn(4, 2, 16, 64, dtype=BF16)), ValueError,
         "k_cache"),
    case("q-zero-heads", set_args(q=torch.randn(2, 1, 0, 64, dtype=BF16), output=torch.empty(2, 1, 0, 64, dtype=BF16)),
         ValueError, "q"),
    case("output-not-a-tensor", set_args(output=None), TypeError, "output"),
    case("k_cache-head-dim", set_args(k_cache=lambda kw: kw["k_cache"][:, :32].contiguous()), ValueError, "k_cache"),
    case("k_cache-pool-size", set_args(k_cache=lambda kw: kw["k_cache"][:-2]), ValueError, "k_cache"),
    case("k_cache-stride", set_args(k_cache=lambda kw: strided_last(kw["k_cache"])), ValueError, "k_cache"),
    case("k_cache-device", set_args(k_cache=lambda kw: meta(kw["k_cache"])), ValueError, "k_cache"),
    case("v_cache-dtype-differs", set_args(v_cache=lambda kw: kw["v_cache"].to(FP8)), TypeError, "v_cache"),
    case("v_cache-4d-page-size", set_args(v_cache=torch.randn(4, 32, 2, 64, dtype=BF16)), ValueError, "v_cache"),
    case("kv_layout", set_args(kv_layout="XYZ"), ValueError, "kv_layout"),
    case("page_table-dtype", set_args(page_table=lambda kw: kw["page_table"].long()), TypeError, "page_table"),
    case("page_table-rows", set_args(page_table=lambda kw: kw["page_table"][:1]), ValueError, "page_table"),
    case("page_table-device", set_args(page_table=lambda kw: meta(kw["page_table"])), ValueError, "page_table"),
    case("seq_lens-dtype", set_args(seq_lens=lambda kw: kw["seq_lens"].to(torch.int64)), TypeError, "seq_lens"),
    case("seq_lens-count", set_args(seq_lens=torch.tensor([[20]], dtype=torch.uint32)), ValueError, "seq_lens"),
    case("output-dtype", set_args(output=torch.empty(2, 1, 8, 64, dtype=torch.float16)), TypeError, "output"),
    case("output-shape", set_args(output=torch.empty(2, 8, 64, dtype=BF16)), ValueError, "output"),
    case("output-fp8-with-bf16-cache", set_args(output=torch.empty(2, 1, 8, 64, dtype=FP8)), TypeError, "output"),
    case("workspace-dtype", set_args(workspace_buffer=torch.zeros(8, dtype=torch.int32)), TypeError, "workspace_buffer"),
    case("semaphores-dtype", set_args(semaphores=torch.zeros(8, dtype=torch.int32)), TypeError, "semaphores"),
    case("semaphores-device", set_args(semaphores=meta(torch.zeros(8, dtype=torch.uint32))), ValueError, "semaphores"),
    case("sinks-shape", set_args(sinks=torch.zeros(8)), ValueError, "sinks"),
    case("sinks-dtype", set_args(sinks=torch.zeros(2, 4, dtype=torch.float64)), TypeError, "sinks"),
    case("sliding_win_size-negative", set_args(sliding_win_size=-1), ValueError, "sliding_win_size"),
    case("sm_count-zero", set_args(sm_count=0), ValueError, "sm_count"),
    case("q_scale-str", set_args(q_scale="1"), TypeError, "q_scale"),
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


def test_layout_mixup_names_kv_layout():
    kw = valid()
    kw.update(k_cache=torch.randn(4, 2, 16, 64, dtype=BF16), v_cache=torch.randn(4, 2, 16, 64, dtype=BF16))
    with pytest.raises(ValueError, match="^k_cache: expected NHD pages.*is kv_layout='HND' meant"):
        xqa(**kw)
    xqa(**kw, kv_layout="HND")


def test_larger_v_pool_is_accepted():
    kw = valid()
    kw["v_cache"] = torch.cat((kw["v_cache"], kw["v_cache"][:32]))  # one page more than K
    assert xqa(**kw) is None
