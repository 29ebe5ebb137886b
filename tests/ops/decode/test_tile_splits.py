"""Splits of one tile for paged launches of fewer programs than SMs (``configs.tile_splits``,
``plan._Plan.num_splits``): on an H200-class GPU such a launch is bound by each program's chain of
tiles, so its splits may be as short as one tile instead of ``min_chunk`` keys; an H100-class GPU
keeps ``min_chunk`` as measured there, and so do launches of one program an SM or more and fp8
launches that merge in the kernel with the keys in M. Simulated on the CPU (sm90's tables, 132
SMs); launches recorded, not run."""

from __future__ import annotations

import pytest
import torch

from kvattn.ops.decode import configs as decode_configs

from .test_balanced_plan import FAKED, SM_COUNT
from .test_long_tiles_by_bandwidth import H100, H200, _plan_on


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _splits(monkeypatch, bandwidth, **call):
    plan = _plan_on(monkeypatch, bandwidth, **call)
    span = call["max_len"]
    split, combine, *_ = plan.launches(span)
    return plan, plan.config_for(span), split.fixed["num_splits"], split.grid[0], combine


@FAKED
@pytest.mark.parametrize("batch,max_len,page,num_heads,num_kv_heads", [
    pytest.param(2, 1193, 32, 16, 2, id="2x1193-p32-h16-2"),
    pytest.param(2, 900, 64, 8, 1, id="2x900-p64-h8-1"),
    pytest.param(3, 350, 64, 64, 8, id="3x350-p64-h64-8"),
])
def test_few_programs_split_down_to_one_tile_on_an_h200(monkeypatch, batch, max_len, page, num_heads, num_kv_heads):
    call = dict(batch=batch, max_len=max_len, page=page, num_heads=num_heads, num_kv_heads=num_kv_heads)
    plan, cfg, splits, grid, _ = _splits(monkeypatch, H200, **call)
    assert cfg.block_n < cfg.min_chunk
    assert plan.items * _cdiv(max_len, cfg.min_chunk) < SM_COUNT  # the launch min_chunk would give
    assert splits == min(_cdiv(max_len, cfg.block_n), cfg.max_splits) > _cdiv(max_len, cfg.min_chunk)
    assert grid == plan.items * splits
    _, cfg100, splits100, _, _ = _splits(monkeypatch, H100, **call)
    assert splits100 == _cdiv(max_len, cfg100.min_chunk)


@FAKED
def test_one_program_an_sm_or_more_keeps_min_chunk(monkeypatch):
    """16 requests of 1000 keys at 8 KV heads: 128 items, 4 splits of min_chunk keys is 512
    programs, past the SM count."""
    call = dict(batch=16, max_len=1000, page=64, num_heads=32, num_kv_heads=8)
    plan, cfg, splits, _, _ = _splits(monkeypatch, H200, **call)
    assert plan.items * _cdiv(1000, cfg.min_chunk) >= SM_COUNT
    _, _, splits100, _, _ = _splits(monkeypatch, H100, **call)
    assert splits == splits100


@FAKED
def test_fp8_keys_in_m_merged_in_the_kernel_keeps_its_splits(monkeypatch):
    """2 x 1338 fp8 keys, 32 / 8 heads: 16 items merged in the kernel with the keys in M at 6
    splits; more would move the merge to the combine launch (rows in M), measured slower."""
    call = dict(batch=2, max_len=1338, page=64, num_heads=32, num_kv_heads=8, kv_dtype=torch.float8_e4m3fn)
    plan = _plan_on(monkeypatch, H200, **call)
    split, combine, *_ = plan.launches(1338)
    cfg = plan.config_for(1338)
    assert split.constexprs["KEYS_IN_M"] and split.constexprs["MERGE"] and combine is None
    assert split.fixed["num_splits"] == _cdiv(1338, cfg.min_chunk)
    assert plan.items * split.fixed["num_splits"] < SM_COUNT


@pytest.mark.parametrize("paged,bandwidth,expected", [
    (True, H200, True), (True, H100, False), (True, 0.0, False), (False, H200, False),
], ids=["paged-h200", "paged-h100", "paged-unknown", "contiguous-h200"])
def test_the_rule_by_gpu_and_cache(paged, bandwidth, expected):
    cfg = decode_configs.config("sm90", "bfloat16", 128, 16, False)
    assert decode_configs.tile_splits(cfg, paged=paged, sm_count=SM_COUNT, bandwidth=bandwidth) is expected


def test_the_bandwidth_bound_is_the_configs_field():
    """The bound is the config's ``long_max_sm_gbps``, as for the other H200-only rules, so
    ``--ab NAME:decode:long_max_sm_gbps=...`` times either side of it on either GPU."""
    with decode_configs.override(long_max_sm_gbps=1000):
        cfg = decode_configs.config("sm90", "bfloat16", 128, 16, False)
        assert not decode_configs.tile_splits(cfg, paged=True, sm_count=SM_COUNT, bandwidth=H200)
    with decode_configs.override(long_max_sm_gbps=0):
        cfg = decode_configs.config("sm90", "bfloat16", 128, 16, False)
        assert decode_configs.tile_splits(cfg, paged=True, sm_count=SM_COUNT, bandwidth=H100)
