"""The split plan of the launches the warp-specialised MLA kernel runs (``configs.SEESAW_PLAN``:
pieces of one 128-key tile pair, one split up to 256 keys), planned on the CPU from host facts with
a Hopper of 132 SMs faked, as the benchmark's sweep rows would be (lab/notes/mla-ragged.md "MLA:
splits of one tile pair on the seesaw")."""

from __future__ import annotations

import pytest
import torch

from kvattn.formats import FP8_DTYPE
from kvattn.ops.mla import configs as mla_configs
from kvattn.ops.mla import plan as mla_plan

pytestmark = pytest.mark.skipif(mla_plan.mla_gluon_ws_kernel is None, reason="needs Gluon (Triton >= 3.5)")


def _plan(monkeypatch, *, batch, heads, page=64, dtype=torch.bfloat16, lse=False):
    monkeypatch.setattr(mla_plan, "arch", lambda device, interp: "sm90")
    monkeypatch.setattr(mla_plan._device, "sm_count", lambda device: 132)
    pages = 4096
    facts = mla_plan.MLAFacts(
        device=torch.device("cpu"), interpreter=False, q_shape=(batch, heads, 576), q_stride=(heads * 576, 576, 1),
        q_dtype=dtype, kv_shape=(pages, page, 576), kv_stride=(page * 576, 576, 1), kv_dtype=dtype,
        table_stride=(512, 1), out_stride=(heads * 512, 512, 1), ws_numel=256 << 20, has_logit=False,
        has_out_scale=False, aligned4=True, aligned16=True, gluon_on=True, gluon_ws_on=True,
        lse_stride=heads if lse else None)
    return mla_plan._Plan(facts)


def _launch(plan, span):
    split, combine, *_ = plan.launches(span)
    return split, combine, split.fixed["num_splits"], bool(split.constexprs["BALANCED"])


def test_seesaw_splits_a_small_ragged_batch_into_tile_pairs(monkeypatch):
    """sw74's launch (bf16, 32 heads on the 64-head programs, 6 requests, longest 2993 keys): 22
    splits over the grid's 132 programs, balanced, units of at least 128 keys (the 256 floor gave
    12 uniform splits of 256)."""
    plan = _plan(monkeypatch, batch=6, heads=32)
    split, combine, splits, balanced = _launch(plan, 2993)
    assert plan.ws and split.kernel is mla_plan.mla_gluon_ws_kernel
    assert plan.cfg.min_chunk == 128 and plan.cfg.min_split_span == 256
    assert (splits, balanced, split.grid[0]) == (22, True, 132)
    assert split.constexprs["MIN_CHUNK"] == 128 and combine.constexprs["MIN_CHUNK"] == 128
    with mla_configs.override(min_chunk=256):  # the previous rule, as --ab times it
        old = _plan(monkeypatch, batch=6, heads=32)
        split, _, splits, balanced = _launch(old, 2993)
        assert old.ws and split.kernel is mla_plan.mla_gluon_ws_kernel  # (the same kernel under the override)
        assert (splits, balanced, split.grid[0]) == (12, False, 72)


@pytest.mark.parametrize("span,splits", [(1, 1), (200, 1), (256, 1), (257, 3), (300, 3), (1433, 12)])
def test_seesaw_keeps_one_split_up_to_256_keys(span, splits, monkeypatch):
    """5 requests, 64 heads: the span's pairs set the split count past 256 keys, one split up to it
    (no combine launch for a program of at most two pairs)."""
    split, combine, got, _ = _launch(_plan(monkeypatch, batch=5, heads=64, page=16), span)
    assert got == splits and (combine is None) == (splits == 1)


def test_other_kernels_keep_the_256_key_floor(monkeypatch):
    """The Gluon kernel that stores an LSE (return_lse) and the Triton kernels keep the table's plan."""
    lse_plan = _plan(monkeypatch, batch=6, heads=32, lse=True)
    assert not lse_plan.ws and lse_plan.cfg.min_chunk == 256 and lse_plan.cfg.min_split_span == 0
    # fp8 Hq 16 over short programs (sw76's launch): heads in N, Triton, the table's plan
    tri = _plan(monkeypatch, batch=5, heads=16, page=16, dtype=FP8_DTYPE).for_span(1428)
    assert not tri.ws and tri.cfg.heads_as_n and tri.cfg.min_chunk == 256
    assert _launch(tri, 1428)[2] == 6


def test_fp8_seesaw_takes_the_pair_plan(monkeypatch):
    """sw75's launch (e4m3 query and cache, 64 heads, 7 requests, longest 3110 keys): 18 balanced
    splits (was 13 uniform)."""
    plan = _plan(monkeypatch, batch=7, heads=64, page=16, dtype=FP8_DTYPE)
    assert plan.ws and plan.fp8_ws and plan.cfg.min_chunk == 128
    assert _launch(plan, 3110)[2:] == (18, True)


def test_plan_field_overrides_keep_the_padded_programs():
    """An override of the split plan's fields alone keeps the 64-head programs for fewer heads (so
    ``run.py --ab NAME:mla:min_chunk=...`` times the rule on the table's kernel); one of a kernel
    field does not. Such an override replaces the seesaw's plan whole."""
    with mla_configs.override(min_chunk=256, min_split_span=0, waves=2):
        wide = mla_configs.padded_heads("sm90", "bfloat16", 32)
        assert wide is not None and wide.block_h == 64 and wide.min_chunk == 256 and wide.waves == 2
        # an override of plan fields stands in for the seesaw's plan whole
        assert mla_configs.seesaw_plan("sm90", wide) == wide
    with mla_configs.override(waves=2):
        wide = mla_configs.padded_heads("sm90", "bfloat16", 32)
        assert mla_configs.seesaw_plan("sm90", wide).min_chunk == 256
        assert mla_configs.seesaw_plan("sm90", wide).min_split_span == 0
    wide = mla_configs.config("sm90", "bfloat16", 64)
    assert (mla_configs.seesaw_plan("sm90", wide).min_chunk, mla_configs.seesaw_plan("sm90", wide).min_split_span) \
        == (128, 256)
    with mla_configs.override(block_h=32):
        assert mla_configs.padded_heads("sm90", "bfloat16", 32) is None
    assert mla_configs.seesaw_plan("default", mla_configs.config("default", "bfloat16", 64)).min_chunk == 256


def test_num_splits_min_split_span():
    cfg = mla_configs.MLAConfig(64, 64, 8, 2, 1, min_chunk=128, min_split_span=256)
    kw = dict(items=5, sm_count=132, fit=1 << 20)
    assert mla_configs.num_splits(cfg, span=256, **kw) == 1
    assert mla_configs.num_splits(cfg, span=257, **kw) == 3
    assert mla_configs.num_splits(cfg, span=100000, **kw) == 26  # the wave bound
