"""``kvattn.workspace_size``: the bytes the workspace carving takes at most for a call, checked
against the carving itself (runtime/workspace.py, ops/prefill/staging.py) on CPU tensors, and
the least workspace every function accepts."""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn import _inputs
from kvattn.formats import FP8_DTYPE
from kvattn.ops.decode.configs import DecodeConfig
from kvattn.runtime import workspace as carving
from kvattn.ops.mla.configs import MLAConfig
from kvattn.ops.prefill import staging


def _at_offset(nbytes: int, offset: int) -> torch.Tensor:
    """A workspace of ``nbytes`` whose data starts ``offset`` bytes past a 16-byte boundary."""
    base = torch.zeros(nbytes + 32, dtype=torch.uint8)
    start = (-base.data_ptr() + offset) % 16
    return base[start:start + nbytes]


def test_fixed_head_is_the_carvings():
    assert _inputs.MIN_WORKSPACE_BYTES == carving.ALIGN + carving.COUNTER_BYTES


@pytest.mark.parametrize("function, config, rows, width", [
    (kvattn.xqa_batch_decode_with_kv_cache, DecodeConfig, 3 * 2, 64 + 1),
    (kvattn.xqa, DecodeConfig, 3 * 2, 64 + 1),
    (kvattn.xqa_batch_decode_with_kv_cache_mla, MLAConfig, 3, 512 + 1),
], ids=["decode-B3-Q2-D64", "xqa-B3-Q2-D64", "mla-B3"])
@pytest.mark.parametrize("max_seq_len", [1, 5000, 300_000], ids=["len1", "len5000", "len300000-invariant-bound"])
def test_split_partials_of_the_most_splits_fit_exactly(function, config, rows, width, max_seq_len):
    heads = 4
    size = kvattn.workspace_size(function, batch_size=3, num_qo_heads=heads, head_dim=64, max_seq_len=max_seq_len,
                                 q_len_per_req=2)
    splits = max(config.max_splits, 2, -(-max_seq_len // config.invariant_span))
    per_split = rows * heads * width
    assert carving.partials_fit(size, per_split, 0) == splits
    assert carving.partials_fit(size - 1, per_split, 0) == splits - 1  # not a byte to spare
    for offset in range(16):  # every alignment: the partials' views are whole
        ws = _at_offset(size, offset)
        numel_o = splits * rows * heads * (width - 1)
        part_o, part_lse = carving._partials_views(ws, numel_o, splits * rows * heads)
        assert part_o.numel() == numel_o and part_lse.numel() == splits * rows * heads


def _prefill_inputs(batch, hq, hkv, d, page, pages_per_seq, qdt, kvdt):
    query = torch.zeros(1, hq, d, dtype=qdt)
    k = torch.zeros(batch * pages_per_seq, page, hkv, d).to(kvdt)
    table = torch.arange(batch * pages_per_seq, dtype=torch.int32).view(batch, pages_per_seq)
    return query, k, table


@pytest.mark.parametrize("qdt, kvdt, page, d", [
    (torch.bfloat16, FP8_DTYPE, 64, 128), (torch.float16, FP8_DTYPE, 16, 64), (FP8_DTYPE, FP8_DTYPE, 32, 128),
    (torch.bfloat16, torch.bfloat16, 16, 128),
], ids=["bf16q-fp8kv-p64-D128", "fp16q-fp8kv-p16-D64", "fp8q-fp8kv-p32-D128", "bf16-p16-D128"])
def test_prefill_staging_fits_at_every_alignment(qdt, kvdt, page, d):
    batch, hq, hkv, max_kv = 2, 16, 2, 4000
    size = kvattn.workspace_size(kvattn.trtllm_batch_context_with_kv_cache, batch_size=batch, num_qo_heads=hq,
                                 num_kv_heads=hkv, head_dim=d, max_seq_len=max_kv, max_q_len=max_kv,
                                 page_size=page, query_dtype=qdt, kv_dtype=kvdt)
    assert size > _inputs.MIN_WORKSPACE_BYTES  # these calls stage
    query, k, table = _prefill_inputs(batch, hq, hkv, d, page, -(-max_kv // page), qdt, kvdt)
    for offset in range(16):
        assert staging.plan(query, k, table, _at_offset(size, offset), max_kv, max_kv) is not None, offset
    # Without the head, or short of the staged pages, the call stages nothing.
    assert staging.plan(query, k, table, _at_offset(size - _inputs.MIN_WORKSPACE_BYTES, 0), max_kv, max_kv) is None


def test_prefill_that_does_not_stage_needs_the_head_only():
    """A 16-bit cache in pages of 64 is read as it is; short queries do not pay for a staging pass."""
    kw = dict(batch_size=2, num_qo_heads=8, num_kv_heads=8, head_dim=128, max_seq_len=4096)
    f = kvattn.trtllm_batch_context_with_kv_cache
    assert kvattn.workspace_size(f, page_size=64, **kw) == _inputs.MIN_WORKSPACE_BYTES
    assert kvattn.workspace_size(f, page_size=16, kv_dtype=FP8_DTYPE, max_q_len=1, **kw) == \
        _inputs.MIN_WORKSPACE_BYTES


@pytest.mark.parametrize("function, message", [
    (kvattn.single_decode_with_kv_cache, "single_decode_with_kv_cache takes no workspace"),
    ("decode", "expected one of the functions taking a workspace_buffer"),
], ids=["single-decode", "unknown-name"])
def test_functions_without_a_workspace_are_named(function, message):
    with pytest.raises(ValueError, match=f"^function: .*{message}"):
        kvattn.workspace_size(function, batch_size=1, num_qo_heads=8, max_seq_len=16)


def test_bad_sizes_name_the_argument():
    with pytest.raises(ValueError, match="^batch_size: expected an int >= 0"):
        kvattn.workspace_size(kvattn.xqa, batch_size=-1, num_qo_heads=8, max_seq_len=16)
    with pytest.raises(ValueError, match="^num_kv_heads: expected a divisor of num_qo_heads=8"):
        kvattn.workspace_size(kvattn.trtllm_batch_context_with_kv_cache, batch_size=1, num_qo_heads=8,
                              num_kv_heads=3, max_seq_len=16)


def _decode_call(ws):
    torch.manual_seed(0)
    kv = torch.randn(4, 2, 16, 2, 64, dtype=torch.bfloat16)
    return dict(query=torch.randn(2, 8, 64, dtype=torch.bfloat16), kv_cache=kv, workspace_buffer=ws,
                block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                seq_lens=torch.tensor([20, 32], dtype=torch.int32), max_seq_len=32)


def test_a_workspace_below_the_fixed_head_is_an_error_on_cpu_too():
    kw = _decode_call(torch.zeros(16, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"^workspace_buffer: expected at least 16400 bytes .*got 16$"):
        kvattn.xqa_batch_decode_with_kv_cache(**kw)
    kw["workspace_buffer"] = torch.zeros(_inputs.MIN_WORKSPACE_BYTES, dtype=torch.uint8)
    assert kvattn.xqa_batch_decode_with_kv_cache(**kw).shape == (2, 8, 64)
