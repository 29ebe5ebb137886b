"""RoPE single decode (one query row a KV head, contiguous cache) takes 64-key tiles instead of the
halved RoPE tile on an H200-class GPU (``configs._SM90_ROPE_WIDE``, ``plan._Plan.__init__``), for
its streaming (TMA) launch and its pipelined one alike; an H100-class GPU and RoPE-less calls keep
their tiles. Simulated on the CPU (sm90's tables, 132 SMs); launches recorded, not run."""

from __future__ import annotations

import pytest

from kvattn.ops.decode import configs as decode_configs

from .test_balanced_plan import FAKED
from .test_long_tiles_by_bandwidth import H100, H200, _single_plan_on


@FAKED
@pytest.mark.parametrize("kv_len", [4096, 32768, 131072], ids=lambda n: f"L{n}")
def test_rope_single_decode_takes_64_key_tiles_on_an_h200(monkeypatch, kv_len):
    plan, cfg = _single_plan_on(monkeypatch, H200, kv_len, "ROPE_LLAMA")
    halved = decode_configs.config("sm90", plan.kv_format, 128, plan.block_m, True)
    assert halved.block_n == 32 and cfg.block_n == 64 == cfg.rope_wide_block_n
    assert cfg.tma == (kv_len == 4096)  # (4096: the streaming launch, read by TMA)
    _, cfg100 = _single_plan_on(monkeypatch, H100, kv_len, "ROPE_LLAMA")
    assert cfg100.block_n == 32


@FAKED
def test_single_decode_without_rope_keeps_its_tiles(monkeypatch):
    _, cfg = _single_plan_on(monkeypatch, H200, 32768, "NONE")
    _, cfg100 = _single_plan_on(monkeypatch, H100, 32768, "NONE")
    assert cfg.block_n == cfg100.block_n and cfg.rope_wide_block_n == 0
