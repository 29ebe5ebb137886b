"""Launches of one query row an item on an H200-class GPU run the config's ``one_row_stages``:
paged MHA launches that split their items three stages (three programs an SM,
``plan._Plan.config_for``), single decode past the streaming spans its contiguous tiles at two
(``plan._Plan.__init__``). A launch that does not split, GQA launches and an H100-class GPU keep
the table's stages. Simulated on the CPU (sm90's tables, 132 SMs); launches recorded, not run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvattn.ops.decode import configs as decode_configs

from .test_balanced_plan import FAKED
from .test_long_tiles_by_bandwidth import H100, H200, _single_plan_on
from .test_tile_splits import _splits


@FAKED
@pytest.mark.parametrize("batch,max_len,page", [
    pytest.param(1, 92435, 64, id="1x92435-p64-h32-32"),
    pytest.param(4, 32854, 64, id="4x32854-p64-h32-32"),
    pytest.param(5, 4857, 32, id="5x4857-p32-h32-32"),
])
def test_mha_launches_that_split_run_three_stages_on_an_h200(monkeypatch, batch, max_len, page):
    call = dict(batch=batch, max_len=max_len, page=page, num_heads=32, num_kv_heads=32)
    plan, cfg, splits, _, _ = _splits(monkeypatch, H200, **call)
    main = decode_configs.config("sm90", plan.kv_format, 128, plan.block_m, False)
    assert plan.rows == 1 and cfg.one_row_stages == 3 != main.num_stages
    assert cfg.num_stages == 3 and splits > 1
    plan100, cfg100, *_ = _splits(monkeypatch, H100, **call)
    assert plan100.cfg_one_row is None and cfg100 is plan100.cfg


@FAKED
def test_mha_launch_that_does_not_split_keeps_the_tables_stages(monkeypatch):
    """112 requests of up to 6586 keys on pages of 16: 3584 items, one split each."""
    call = dict(batch=112, max_len=6586, page=16, num_heads=32, num_kv_heads=32)
    plan, cfg, splits, _, _ = _splits(monkeypatch, H200, **call)
    assert splits == 1 and cfg.num_stages == plan.cfg.num_stages != plan.cfg.one_row_stages


@FAKED
def test_gqa_launch_keeps_the_tables_stages(monkeypatch):
    call = dict(batch=4, max_len=32854, page=64, num_heads=32, num_kv_heads=8)
    plan, cfg, splits, _, _ = _splits(monkeypatch, H200, **call)
    assert plan.rows == 4 and splits > 1
    assert plan.cfg_one_row is None and cfg.num_stages != cfg.one_row_stages


@FAKED
@pytest.mark.parametrize("kv_len", [32768, 131072], ids=lambda n: f"L{n}")
def test_single_decode_past_the_streaming_spans_runs_two_stages_on_an_h200(monkeypatch, kv_len):
    """The one-row contiguous tiles (``configs._SM90_CONTIG_PIPELINED_STAGES``): pipelined on an
    H200-class GPU, the same tiles and splits; an H100-class GPU keeps them unpipelined."""
    plan, cfg = _single_plan_on(monkeypatch, H200, kv_len, "NONE")
    contig = decode_configs.config("sm90", plan.kv_format, 128, plan.block_m, False, "contig")
    assert contig.num_stages == 1 and cfg == replace(contig, num_stages=2)
    plan100, cfg100 = _single_plan_on(monkeypatch, H100, kv_len, "NONE")
    assert cfg100 == contig
    assert plan.num_splits(kv_len, cfg) == plan100.num_splits(kv_len, cfg100) == 16


@FAKED
def test_single_decode_within_the_streaming_spans_keeps_its_tiles(monkeypatch):
    plan, cfg = _single_plan_on(monkeypatch, H200, 4096, "NONE")
    assert cfg.evict_first and cfg == decode_configs.config("sm90", plan.kv_format, 128, plan.block_m, False, "stream")
