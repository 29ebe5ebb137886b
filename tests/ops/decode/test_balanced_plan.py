"""The launch the decode plan builds for small batches on sm90's tables: the balanced one for few
long requests, the uniform one where its programs all run at once and are no longer than the
balanced plan's units (an H200 simulated on the CPU: its SM count and L2 size, launches recorded,
not run)."""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.ops.common.combine import lanes_combine_kernel
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.runtime import fast_launch

from ..oracle import ON_GPU

SM_COUNT = 132
# Tests of plans built on a faked sm90 H200 (from CPU tensors under the interpreter)
FAKED = pytest.mark.skipif(ON_GPU, reason="the plan of a faked sm90 GPU, built from CPU tensors under the interpreter")
# The sweep's sw36: 24 x 48740 keys, pages of 16, 64 query heads on 8 KV heads, HND
SW36 = dict(batch=24, max_len=48740, page=16, num_heads=64, num_kv_heads=8, layout="HND")


def _faked_h200(monkeypatch):
    """sm90's tables, 132 SMs and 60 MB of L2 for plans built from CPU tensors; launches recorded."""
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    monkeypatch.setattr(decode_launch, "arch", lambda device, interpreter: "sm90")
    monkeypatch.setattr(decode_launch._device, "sm_count", lambda device: SM_COUNT)
    monkeypatch.setattr(decode_launch._device, "l2_bytes", lambda device: 60 << 20)
    monkeypatch.setattr(fast_launch.Launch, "__call__", lambda self, call: None)
    monkeypatch.setattr(decode_launch, "_PLANS", {})  # (plans of the faked GPU stay out of the real cache)


def _plan_of(monkeypatch, *, batch, max_len, page, num_heads, num_kv_heads, kv_dtype, layout="NHD", head_dim=128):
    """The plan of one decode call of ``batch`` requests up to ``max_len`` keys on a faked H200."""
    _faked_h200(monkeypatch)
    pages = batch * -(-max_len // page)
    shape = (pages, page, num_kv_heads, head_dim) if layout == "NHD" else (pages, num_kv_heads, page, head_dim)
    k = torch.empty(shape, dtype=kv_dtype)
    tables = torch.zeros(batch, pages // batch, dtype=torch.int32)
    lens = torch.full((batch,), max(1, max_len // 2), dtype=torch.int32)
    lens[0] = max_len
    q = torch.empty(batch, num_heads, head_dim, dtype=torch.float16)
    ws = torch.zeros(256 << 20, dtype=torch.uint8)
    kvattn.decode.xqa_batch_decode_with_kv_cache(q, (k, torch.empty_like(k)), ws, tables, lens, max_len,
                                                 bmm1_scale=0.1, bmm2_scale=1.0, out=torch.empty_like(q),
                                                 kv_layout=layout)
    (plan,) = decode_launch._PLANS.values()
    return plan


def _slots(plan, span, balanced=False):
    cfg = plan.config_for(span)
    return decode_configs.resident_slots(cfg, sm_count=SM_COUNT, kv_format=plan.kv_format, head_dim=plan.head_dim,
                                         rope_query=False, balanced=balanced)


@FAKED
@pytest.mark.parametrize("batch,max_len,page,splits", [
    pytest.param(45, 51550, 64, 14, id="45-requests-to-51550-p64-h8-1"),
    pytest.param(22, 88289, 16, 6, id="22-requests-to-88289-p16-h8-1"),
])
def test_few_long_requests_take_the_balanced_launch_over_one_wave(batch, max_len, page, splits, monkeypatch):
    """8 query heads on 1 KV head, D 128, one long-tile program an SM: the launch is the balanced
    one whatever the lengths (a ragged batch deals its units, an equal one keeps the last-wave
    split count inside it), with no combine launch and a grid of one program an SM (one wave of
    resident programs, which deal the units among themselves).
    45 requests: the last-wave rule's 14 splits, merged in the kernel in 4 rounds, 630 programs
    over 132 slots; 22 requests: 6 splits, one wave, but pieces of 14,305 keys against the
    balanced plan's shortest units of 512 (configs.balance_min_span)."""
    plan = _plan_of(monkeypatch, batch=batch, max_len=max_len, page=page, num_heads=8, num_kv_heads=1,
                    kv_dtype=torch.float16)
    split, combine, _, _, merged = plan.launches(max_len)
    assert split.constexprs["BALANCED"] and merged and combine is None
    assert split.fixed["num_splits"] == splits
    assert split.grid[0] == SM_COUNT and split.fixed["num_items"] == batch * splits
    cfg = plan.config_for(max_len)
    rounds = -(-splits // split.constexprs["MERGE_BLOCK_S"])
    assert rounds <= decode_launch.MAX_BALANCED_ROUNDS
    assert _slots(plan, max_len, balanced=True) == SM_COUNT
    min_span = decode_configs.balance_min_span(cfg, items=plan.items, splits=splits, slots=SM_COUNT)
    assert max_len >= min_span == (0 if plan.items * splits > SM_COUNT else splits * 512 + 1)


@FAKED
@pytest.mark.parametrize("batch,max_len,page,heads,fmt,layout,splits,combine", [
    pytest.param(4, 3799, 64, (64, 8), "fp8", "HND", 8, True, id="4-requests-to-3799-fp8-p64-HND-h64-8"),
    pytest.param(47, 1156, 16, (8, 1), "float16", "HND", 5, False, id="47-requests-to-1156-p16-HND-h8-1"),
    pytest.param(12, 273, 32, (32, 8), "float16", "NHD", 1, False, id="12-requests-to-273-p32-h32-8"),
    pytest.param(5, 612, 16, (64, 8), "float16", "NHD", 3, False, id="5-requests-to-612-p16-h64-8"),
])
def test_small_batches_of_short_requests_keep_the_uniform_launch(batch, max_len, page, heads, fmt, layout, splits,
                                                                  combine, monkeypatch):
    """Small batches of short requests, as the sweep draws them (sw13, sw35, sw27, sw08): the
    uniform launch's items x splits programs fit one wave and hold at most ``balance_min_chunk``
    keys each, so no balanced unit could be shorter; the plan keeps the uniform launch, its grid
    items x splits and its merge (a combine launch past MAX_MERGE_ROUNDS, as for fp8's 8 splits
    at 2 partials a round). Past ``splits`` such chunks of span, the same plan deals."""
    kv_dtype = torch.float8_e4m3fn if fmt == "fp8" else torch.float16
    plan = _plan_of(monkeypatch, batch=batch, max_len=max_len, page=page, num_heads=heads[0],
                    num_kv_heads=heads[1], kv_dtype=kv_dtype, layout=layout)
    split, comb, _, _, merged = plan.launches(max_len)
    assert not split.constexprs["BALANCED"]
    assert split.fixed["num_splits"] == splits
    assert split.grid[0] == split.fixed["num_items"] == plan.items * splits <= _slots(plan, max_len)
    assert (comb is not None) is combine and merged is (splits > 1 and not combine)
    cfg = plan.config_for(max_len)
    chunk = -(-cfg.balance_min_chunk // cfg.block_n) * cfg.block_n
    assert -(-max_len // splits) <= chunk
    # The boundary: the longest span whose uniform pieces are one chunk keeps the uniform launch,
    # one key more deals (where the split count and table stay those of max_len, and the table is
    # not the streaming one, which never deals).
    edge = splits * chunk
    if plan.config_for(edge + 1) is cfg and plan.num_splits(edge + 1, cfg) == splits:
        assert not plan.launches(edge)[0].constexprs["BALANCED"]
        assert plan.launches(edge + 1)[0].constexprs["BALANCED"] is (cfg is not plan.cfg_stream)


@FAKED
def test_a_plan_switches_between_its_uniform_and_balanced_launches_by_span(monkeypatch):
    """One plan (4 fp8 requests at 64/8 heads on pages of 64: 8 splits of 32 items, one wave of
    264 slots) serves spans of at most 8 x 512 keys with the uniform launch and longer ones with
    the balanced launch, in any order: the launches are memoised by (config, splits, balanced),
    not by (config, splits) alone."""
    plan = _plan_of(monkeypatch, batch=4, max_len=5000, page=64, num_heads=64, num_kv_heads=8,
                    kv_dtype=torch.float8_e4m3fn, layout="HND")
    cfg = plan.config_for(5000)
    assert all(plan.config_for(n) is cfg and plan.num_splits(n, cfg) == 8 for n in (3799, 4096, 4097, 5000))
    balanced = plan.launches(5000)[0]
    assert balanced.constexprs["BALANCED"] and balanced.grid[0] == _slots(plan, 5000, balanced=True) == 2 * SM_COUNT
    uniform = plan.launches(4096)[0]
    assert not uniform.constexprs["BALANCED"] and uniform.grid[0] == plan.items * 8 == 256
    assert plan.launches(4097)[0] is balanced and plan.launches(3799)[0] is uniform


@FAKED
@pytest.mark.parametrize("batch,max_len,page,heads", [
    # the sweep's sw57 / sw52: few requests whose K/V fits the streaming tiles' L2 bound
    pytest.param(2, 14739, 32, (64, 8), id="2-requests-to-14739-p32-h64-8"),
    pytest.param(11, 8338, 16, (16, 2), id="11-requests-to-8338-p16-h16-2"),
])
def test_streaming_tiles_keep_the_uniform_split(batch, max_len, page, heads, monkeypatch):
    """A launch on the streaming tiles (unpipelined 128-key tiles) is never the balanced one: dealt
    units serialise their unpipelined copies on one program (on the H200 the uniform split of the
    same tiles was 8-27 % faster on all four such sweep rows)."""
    plan = _plan_of(monkeypatch, batch=batch, max_len=max_len, page=page, num_heads=heads[0],
                    num_kv_heads=heads[1], kv_dtype=torch.float16)
    assert plan.cfg_stream is not None and plan.config_for(max_len) is plan.cfg_stream
    (launch, *_) = plan.launches(max_len)
    assert not launch.constexprs["BALANCED"]
    assert plan.balance(plan.cfg_stream, plan.num_splits(max_len)) is None


H200_BANDWIDTH = 4.8e12  # peak copy bandwidth the drivers report (bytes/s)
H100_BANDWIDTH = 3.35e12


@FAKED
@pytest.mark.parametrize("gpu", ["H200", "H100"])
@pytest.mark.parametrize("batch,max_len,page,heads,stream_on_h200", [
    # the sweep's sw57 / sw54: a long request among few, splits of 921 / 995 keys on the streaming tiles
    pytest.param(2, 14739, 32, (64, 8), False, id="2-requests-to-14739-p32-h64-8"),
    pytest.param(5, 5970, 16, (64, 8), False, id="5-requests-to-5970-p16-h64-8"),
    # sw52 / sw35: equal batches of splits of 695 / 231 keys
    pytest.param(11, 8338, 16, (16, 2), True, id="11-requests-to-8338-p16-h16-2"),
    pytest.param(47, 1156, 16, (8, 1), True, id="47-requests-to-1156-p16-h8-1"),
    # the decode grid's 1 x 32768: 993 keys a split, but one request keeps every program busy
    pytest.param(1, 32768, 16, (32, 8), True, id="1-request-of-32768-p16-h32-8"),
])
def test_long_splits_leave_the_streaming_tiles_on_an_h200(batch, max_len, page, heads, stream_on_h200, gpu,
                                                          monkeypatch):
    """On an H200 (copy bandwidth an SM past the long table's bound) a span of several requests
    whose streaming splits would hold more than ``configs.STREAM_SPLIT_KEYS`` keys takes the main
    tiles (pipelined; a ragged batch's launch may then be the balanced one); short splits and one
    request keep the streaming tiles, and so does every span on an H100, as measured there."""
    bandwidth = H200_BANDWIDTH if gpu == "H200" else H100_BANDWIDTH
    monkeypatch.setattr(decode_launch._device, "memory_bandwidth", lambda device: bandwidth)
    plan = _plan_of(monkeypatch, batch=batch, max_len=max_len, page=page, num_heads=heads[0],
                    num_kv_heads=heads[1], kv_dtype=torch.float16)
    assert plan.cfg_stream is not None and max_len <= plan.stream_span
    stream = gpu == "H100" or stream_on_h200
    assert (plan.config_for(max_len) is plan.cfg_stream) == stream
    splits = plan.num_splits(max_len, plan.cfg_stream)
    assert (batch == 1 or max_len <= decode_configs.STREAM_SPLIT_KEYS * splits) == stream_on_h200, splits


@FAKED
@pytest.mark.parametrize("gpu", ["H200", "H100"])
@pytest.mark.parametrize("batch,max_len,page,heads", [
    pytest.param(45, 51550, 64, (8, 1), id="sw12-45-requests-to-51550-p64-h8-1"),
    pytest.param(22, 88289, 16, (8, 1), id="sw07-22-requests-to-88289-p16-h8-1"),
    pytest.param(64, 12000, 16, (32, 8), id="64-requests-to-12000-p16-h32-8"),
])
def test_one_kv_head_lanes_take_the_combine_launch_on_an_h200(batch, max_len, page, heads, gpu, monkeypatch):
    """On an H200 a lanes launch of one program a unit (one KV head) leaves a ragged batch's
    requests of more than ``configs.COMBINE_UNITS`` units to the lanes combine launch, its lanes
    capped at ``configs.COMBINE_LANE_CAP`` a request; launches of more KV heads, and every launch
    on an H100 (not measured there), merge in the split kernel under the merge's unit cap."""
    bandwidth = H200_BANDWIDTH if gpu == "H200" else H100_BANDWIDTH
    monkeypatch.setattr(decode_launch._device, "memory_bandwidth", lambda device: bandwidth)
    plan = _plan_of(monkeypatch, batch=batch, max_len=max_len, page=page, num_heads=heads[0],
                    num_kv_heads=heads[1], kv_dtype=torch.float16)
    split, combine, _, _, merged = plan.launches(max_len)
    assert split.constexprs["BALANCED"] and split.constexprs["LANES"] and merged
    if gpu == "H200" and heads[1] == 1:
        assert combine is not None and combine.kernel is lanes_combine_kernel
        assert split.constexprs["MERGE_UNITS"] == combine.constexprs["MERGE_UNITS"] == decode_configs.COMBINE_UNITS
        assert split.constexprs["LANE_CAP"] == combine.constexprs["LANE_CAP"] == decode_configs.COMBINE_LANE_CAP
        assert combine.grid == (batch, heads[0]) and combine.constexprs["USE_PDL"] == plan.gdc
    else:
        assert combine is None and split.constexprs["MERGE_UNITS"] == 0
        assert split.constexprs["LANE_CAP"] != decode_configs.COMBINE_LANE_CAP or heads[1] != 1


@FAKED
def test_a_head_dim_256_balanced_grid_is_the_programs_that_fit(monkeypatch):
    """The balanced kernel at D 256 compiles to 212-218 registers a thread: two 4-warp programs an
    SM, not the three the unbalanced kernel fits, so its one-wave grid is 2 x the SMs (the sweep's
    sw24, 119 log-normal requests on pages of 16 at 16 / 8 heads)."""
    plan = _plan_of(monkeypatch, batch=119, max_len=7846, page=16, num_heads=16, num_kv_heads=8,
                    kv_dtype=torch.float16, head_dim=256)
    split = plan.launches(7846)[0]
    cfg = plan.config_for(7846)
    assert split.constexprs["BALANCED"] and split.grid[0] == 2 * SM_COUNT
    assert decode_configs.resident_slots(cfg, sm_count=SM_COUNT, kv_format=plan.kv_format, head_dim=256,
                                         rope_query=False) == 3 * SM_COUNT
