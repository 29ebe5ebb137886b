"""The balanced launch the decode plan builds for batches of few long requests on sm90's tables
(an H200 simulated on the CPU: its SM count and L2 size, launches recorded, not run)."""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.runtime import fast_launch

from ..oracle import ON_GPU

SM_COUNT = 132


@pytest.mark.skipif(ON_GPU, reason="the plan of a faked sm90 GPU, built from CPU tensors under the interpreter")
@pytest.mark.parametrize("batch,max_len,page,splits", [
    pytest.param(45, 51550, 64, 14, id="45-requests-to-51550-p64-h8-1"),
    pytest.param(22, 88289, 16, 6, id="22-requests-to-88289-p16-h8-1"),
])
def test_few_long_requests_take_the_balanced_launch_over_one_wave(batch, max_len, page, splits, monkeypatch):
    """8 query heads on 1 KV head, D 128, one long-tile program an SM: the launch is the balanced
    one whatever the lengths (a ragged batch deals its units, an equal one keeps the last-wave
    split count inside it), with no combine launch and a grid of one program an SM (one wave of
    resident programs, which deal the units among themselves).
    45 requests: the last-wave rule's 14 splits, merged in the kernel in 4 rounds."""
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    monkeypatch.setattr(decode_launch, "arch", lambda device, interpreter: "sm90")
    monkeypatch.setattr(decode_launch._device, "sm_count", lambda device: SM_COUNT)
    monkeypatch.setattr(decode_launch._device, "l2_bytes", lambda device: 60 << 20)
    monkeypatch.setattr(fast_launch.Launch, "__call__", lambda self, call: None)
    pages = batch * -(-max_len // page)
    k = torch.empty(pages, page, 1, 128, dtype=torch.float16)
    tables = torch.zeros(batch, pages // batch + 1, dtype=torch.int32)
    lens = torch.full((batch,), 64, dtype=torch.int32)
    lens[0] = max_len
    q = torch.empty(batch, 8, 128, dtype=torch.float16)
    ws = torch.zeros(256 << 20, dtype=torch.uint8)
    monkeypatch.setattr(decode_launch, "_PLANS", {})  # (plans of the faked GPU stay out of the real cache)
    kvattn.decode.xqa_batch_decode_with_kv_cache(q, (k, torch.empty_like(k)), ws, tables, lens, max_len,
                                                 bmm1_scale=0.1, bmm2_scale=1.0, out=torch.empty_like(q))
    (plan,) = decode_launch._PLANS.values()
    split, combine, _, _, merged = plan.launches(max_len)
    assert split.constexprs["BALANCED"] and merged and combine is None
    assert split.fixed["num_splits"] == splits
    assert split.grid[0] == SM_COUNT and split.fixed["num_items"] == batch * splits
    cfg = plan.config_for(max_len)
    rounds = -(-splits // split.constexprs["MERGE_BLOCK_S"])
    assert rounds <= decode_launch.MAX_BALANCED_ROUNDS
    assert decode_configs.resident_slots(cfg, sm_count=SM_COUNT, kv_format="float16", head_dim=128,
                                         rope_query=False) == SM_COUNT
