"""Which decode launches take the long tiles (128 keys, 8 warps, 3 stages) by the GPU's peak copy
bandwidth an SM (``configs.main_replaces_long``): an H100-class GPU keeps them where the H100
measured them, an H200-class one takes the main table's tiles instead, merging as many partials a
round as the long tiles at one KV head, where the round sets a request's unit cap
(``plan._Plan._merge_round_of``).
An H200 and an H100 simulated on the CPU: sm90's tables, 132 SMs, 60 MB of L2, the peak bandwidth
the driver's memory clock and bus width give; launches recorded, not run."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import triton

import kvattn
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.runtime import device as _device

from .test_balanced_plan import FAKED, SM_COUNT, _faked_h200, _plan_of

H200 = 2 * 3201e6 * 6016 / 8  # 4.81 TB/s (the bus width an H200's driver reports): 36.5 GB/s an SM
H100 = 2 * 2619e6 * 5120 / 8  # 3.35 TB/s: 25 GB/s an SM
H100_NVL = 2 * 2619e6 * 6144 / 8  # 4.02 TB/s: 30 GB/s an SM (not measured: keeps the long tiles)
LONG, MAIN = (128, 8, 3), (64, 4, 4)



def _tile(cfg) -> tuple:
    return cfg.block_n, cfg.num_warps, cfg.num_stages


def _plan_on(monkeypatch, bandwidth, kv_dtype=torch.float16, **call):
    monkeypatch.setattr(decode_launch._device, "memory_bandwidth", lambda device: bandwidth)
    return _plan_of(monkeypatch, kv_dtype=kv_dtype, **call)


def _single_plan_on(monkeypatch, bandwidth, kv_len, mode):
    """``(plan, config of its span)`` of one single-decode call (32 / 32 heads, D 128, a float16
    contiguous cache of ``kv_len`` keys, ``pos_encoding_mode=mode``) on a faked GPU of peak copy
    ``bandwidth``."""
    _faked_h200(monkeypatch)
    monkeypatch.setattr(decode_launch._device, "memory_bandwidth", lambda device: bandwidth)
    q = torch.empty(32, 128, dtype=torch.float16)
    k = torch.empty(kv_len, 32, 128, dtype=torch.float16)
    kvattn.decode.single_decode_with_kv_cache(q, k, torch.empty_like(k), pos_encoding_mode=mode)
    (plan,) = decode_launch._PLANS.values()
    return plan, plan.config_for(kv_len)


def _launch(plan, span) -> tuple:
    split, combine, *_ = plan.launches(span)
    return (split.grid, split.fixed, split.constexprs, split.options, combine is None or combine.grid)


@pytest.mark.parametrize("bandwidth,replaced", [
    (H200, True), (H100, False), (H100_NVL, False), (0.0, False),  # 0: unknown (a CPU, an old driver)
], ids=["h200", "h100", "h100-nvl", "unknown"])
def test_main_table_replaces_the_long_tiles_past_32_gbps_an_sm(bandwidth, replaced):
    assert decode_configs.LONG_MAX_SM_GBPS == 32.0
    assert decode_configs.main_replaces_long("sm90", "bfloat16", 128, 16, False, sm_count=SM_COUNT,
                                             bandwidth=bandwidth) is replaced


@pytest.mark.parametrize("overrides", [dict(rope=True), dict(block_m=32), dict(fmt="fp8"), dict(head_dim=64),
                                       dict(arch="default"), dict(arch="interpreter")],
                         ids=["rope", "block_m32", "fp8", "D64", "non-hopper", "interpreter"])
def test_only_where_the_long_tiles_are_measured(overrides):
    args = {**dict(arch="sm90", fmt="bfloat16", head_dim=128, block_m=16, rope=False), **overrides}
    assert not decode_configs.main_replaces_long(args["arch"], args["fmt"], args["head_dim"], args["block_m"],
                                                 args["rope"], sm_count=SM_COUNT, bandwidth=H200)


def test_the_bandwidth_bound_is_the_long_configs_field():
    """``long_max_sm_gbps`` is a config field, so ``--ab NAME:decode:long_max_sm_gbps=...`` times
    either rule on either GPU: 1000 gives an H200 the long tiles back, 0 gives an H100 the main ones."""
    args = ("sm90", "bfloat16", 128, 16, False)
    with decode_configs.override(long_max_sm_gbps=1000):
        assert not decode_configs.main_replaces_long(*args, sm_count=SM_COUNT, bandwidth=H200)
    with decode_configs.override(long_max_sm_gbps=0):
        assert decode_configs.main_replaces_long(*args, sm_count=SM_COUNT, bandwidth=H100)


def test_peak_bandwidth_from_the_memory_clock_and_bus_width(monkeypatch):
    """torch's properties where it has the fields; else the driver's attributes through Triton; else
    unknown (0); the CPU has none."""
    assert _device.memory_bandwidth(torch.device("cpu")) == 0.0
    derive = _device._memory_bandwidth_at.__wrapped__
    monkeypatch.setattr(_device, "_props_at", lambda i: SimpleNamespace(memory_clock_rate=3201000,
                                                                       memory_bus_width=6016))
    assert derive(0) == pytest.approx(H200)
    monkeypatch.setattr(_device, "_props_at", lambda i: SimpleNamespace())
    utils = SimpleNamespace(get_device_properties=lambda i: {"mem_clock_rate": 2619000, "mem_bus_width": 5120})
    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=SimpleNamespace(utils=utils)))
    assert derive(0) == pytest.approx(H100)

    def no_driver(i):
        raise RuntimeError("0 active drivers")

    monkeypatch.setattr(triton.runtime, "driver", SimpleNamespace(active=SimpleNamespace(
        utils=SimpleNamespace(get_device_properties=no_driver))))
    assert derive(0) == 0.0


# Launches the long tiles take on the H100 (the sweep's and the grid's rows of those shapes), and
# whether an H200-class GPU widens the main tiles' merge round (None: the main config as it is).
LONG_ROWS = [
    pytest.param(dict(batch=16, max_len=4096, page=16, num_heads=32, num_kv_heads=8), None, id="16x4096-p16-h32-8"),
    pytest.param(dict(batch=64, max_len=8192, page=64, num_heads=32, num_kv_heads=8), None, id="64x8192-p64-h32-8"),
    pytest.param(dict(batch=10, max_len=49133, page=64, num_heads=64, num_kv_heads=8, layout="HND"), None,
                 id="sw16-10x49133-p64-HND-h64-8"),
    pytest.param(dict(batch=57, max_len=26788, page=32, num_heads=16, num_kv_heads=2, layout="HND"), None,
                 id="sw06-57x26788-p32-HND-h16-2"),
    # 16 rows a KV head: both tiles' merge caps a request at 16 units
    pytest.param(dict(batch=22, max_len=40000, page=16, num_heads=16, num_kv_heads=1), None, id="22x40000-p16-h16-1"),
    # 8 rows on 1 KV head: the long tiles' round (measured level with the main table's: 85.7 / 85.4 us)
    pytest.param(dict(batch=64, max_len=8192, page=16, num_heads=8, num_kv_heads=1), True, id="64x8192-p16-h8-1"),
]


@FAKED
@pytest.mark.parametrize("call,_", LONG_ROWS)
@pytest.mark.parametrize("bandwidth", [H100, H100_NVL, 0.0], ids=["h100", "h100-nvl", "unknown"])
def test_h100_class_gpus_keep_the_long_tiles(call, _, bandwidth, monkeypatch):
    plan = _plan_on(monkeypatch, bandwidth, **call)
    assert _tile(plan.cfg) == _tile(plan.config_for(call["max_len"])) == LONG
    assert plan.cfg.balance_merge_values == 16


@FAKED
@pytest.mark.parametrize("call,wide", LONG_ROWS)
def test_h200_class_gpus_take_the_main_tiles_instead(call, wide, monkeypatch):
    """Equal batches at 2 or 8 KV heads (a unit is 2 or 8 programs) and 16 query rows a KV head
    (both tiles' merge caps a request at 16 units) keep the main table's config; 8 rows on 1 KV
    head take it at the long tiles' merge round."""
    plan = _plan_on(monkeypatch, H200, **call)
    main = decode_configs.config("sm90", "float16", 128, plan.block_m, False, "main")
    assert _tile(plan.cfg) == _tile(plan.config_for(call["max_len"])) == MAIN == _tile(main)
    if wide is None:
        assert plan.cfg is main and plan.config_for(1 << 20) is main
    else:
        assert plan.cfg == replace(main, balance_merge_values=32)


# The sweep's sw12 and sw07: ragged batches at 8 query heads on 1 KV head, slower on the H200 under
# the main tiles at their own merge round (66.4 -> 89.5 us, 186 -> 220) and level or faster at the
# long tiles' round (62.3, 187); and 120 requests of the same heads, past one plan's balanced batch.
RAGGED_ONE_HEAD = [
    pytest.param(dict(batch=45, max_len=51550, page=64, num_heads=8, num_kv_heads=1), True, id="sw12-45-to-51550-p64"),
    pytest.param(dict(batch=22, max_len=88289, page=16, num_heads=8, num_kv_heads=1), True, id="sw07-22-to-88289-p16"),
    pytest.param(dict(batch=120, max_len=30000, page=64, num_heads=8, num_kv_heads=1), False, id="120-to-30000-p64"),
]


@FAKED
@pytest.mark.parametrize("call,deals", RAGGED_ONE_HEAD)
def test_one_kv_head_takes_the_long_tiles_merge_round(call, deals, monkeypatch):
    """8 rows on 1 KV head: the main tiles' 4-warp merge at 16 values a thread loads 2 partials a
    round against the long tiles' 4, which halves a request's unit cap (16 against 32). At 32
    values a thread the 4-warp programs merge 4 a round: the long tiles' cap, on the main tiles;
    and the plan's launch is the tuning arm ``mm`` measured (main tiles, ``balance_merge_values=32``)."""
    from kvattn.ops.common.balance import unit_cap

    plan = _plan_on(monkeypatch, H200, **call)
    assert _tile(plan.cfg) == MAIN
    span = call["max_len"]
    split = plan.launches(span)[0]
    assert split.constexprs["BLOCK_N"] == 64 and split.options["num_warps"] == 4
    if deals:
        assert plan.cfg.balance_merge_values == 32
        assert split.constexprs["BALANCED"] and split.grid[0] == 2 * SM_COUNT
        assert split.constexprs["MERGE_BLOCK_S"] == 4 and unit_cap(4) == 32
    facts = next(iter(decode_launch._PLANS))
    with decode_configs.override(block_n=64, num_warps=4, num_stages=4, balance_merge_values=32):
        arm = decode_launch._Plan(facts)
        assert arm.cfg.balance_merge_values == 32  # the arm's own round, not widened again
        arm_launch = _launch(arm, span)
    if deals:
        assert _launch(plan, span) == arm_launch


@FAKED
@pytest.mark.parametrize("call,_", RAGGED_ONE_HEAD)
def test_the_old_rule_as_a_config_override(call, _, monkeypatch):
    """``--ab old:decode:long_max_sm_gbps=1000`` (the previous rule on an H200) plans the H100's
    launches on the H200 at every span."""
    spans = (4096, 8192, 8193, 20000, call["max_len"])
    plan = _plan_on(monkeypatch, H200, **call)
    facts = next(iter(decode_launch._PLANS))
    with decode_configs.override(long_max_sm_gbps=1000):
        old = decode_launch._Plan(facts)
        assert _tile(old.cfg) == LONG
        old_launches = [_launch(old, n) for n in spans]
    assert _tile(plan.cfg) == MAIN
    h100 = _plan_on(monkeypatch, H100, **call)
    # (the override's configs differ from the H100's in that field only, which no launch reads)
    assert old_launches == [_launch(h100, n) for n in spans]


COMBINED = [  # uniform launches merged by the combine launch where the main tiles replace the long ones
    pytest.param(dict(batch=2, max_len=14739, page=32, num_heads=64, num_kv_heads=8), id="2-to-14739-p32-64-8"),
    pytest.param(dict(batch=5, max_len=37785, page=64, num_heads=16, num_kv_heads=2, layout="HND"),
                 id="5-to-37785-p64-16-2"),
]


@FAKED
@pytest.mark.parametrize("call", COMBINED)
@pytest.mark.parametrize("bandwidth", [H200, H100], ids=["h200", "h100"])
def test_combined_uniform_launches_take_three_stages(call, bandwidth, monkeypatch):
    """A few requests cut into many splits and merged by the combine launch: on an H200 the main
    tiles at 3 stages (three programs an SM, a split count for them: configs.combine_stages), the
    config's 4 otherwise; an H100 keeps its long tiles as measured."""
    plan = _plan_on(monkeypatch, bandwidth, **call)
    span = call["max_len"]
    split, combine, *_ = plan.launches(span)
    assert combine is not None and not split.constexprs["MERGE"]
    if bandwidth == H200:
        assert _tile(plan.cfg) == MAIN and plan.cfg.combine_stages == 3
        assert (split.constexprs["BLOCK_N"], split.options["num_warps"], split.options["num_stages"]) == (64, 4, 3)
        slots = decode_configs.resident_slots(replace(plan.cfg, num_stages=3), sm_count=SM_COUNT,
                                              kv_format=plan.kv_format, head_dim=plan.head_dim, rope_query=False)
        assert slots == 3 * SM_COUNT and split.grid[0] > 2 * SM_COUNT  # more, shorter splits
        with decode_configs.override(combine_stages=0):  # the --ab arm of the previous launch
            facts = next(iter(decode_launch._PLANS))
            arm = decode_launch._Plan(facts).launches(span)[0]
        assert arm.options["num_stages"] == 4 and arm.grid[0] <= 2 * SM_COUNT
    else:  # the launch the H100 was measured with, whatever the field says
        assert _tile(plan.cfg) == LONG
        with decode_configs.override(combine_stages=0):
            facts = next(iter(decode_launch._PLANS))
            assert _launch(decode_launch._Plan(facts), span) == _launch(plan, span)


@FAKED
def test_long_combined_splits_keep_four_stages(monkeypatch):
    """Splits of more than COMBINE_STAGES_KEYS keys at 4 stages (2 requests of 80360 keys at 64/8
    heads: 16 splits of 5022, near the copy limit already; 168 -> 173 us at 3) keep them."""
    call = dict(batch=2, max_len=80360, page=16, num_heads=64, num_kv_heads=8)
    plan = _plan_on(monkeypatch, H200, **call)
    split, combine, *_ = plan.launches(call["max_len"])
    assert combine is not None and plan.cfg.combine_stages == 3
    assert call["max_len"] > decode_configs.COMBINE_STAGES_KEYS * split.fixed["num_splits"]
    assert split.options["num_stages"] == 4


@FAKED
def test_merged_launches_keep_four_stages(monkeypatch):
    """Launches that merge in the kernel (here the balanced split of 10 equal long requests) keep
    the main tiles' 4 stages on an H200 (at 3: 494 -> 513 us)."""
    call = dict(batch=10, max_len=49133, page=64, num_heads=64, num_kv_heads=8, layout="HND")
    plan = _plan_on(monkeypatch, H200, **call)
    split, combine, *_ = plan.launches(call["max_len"])
    assert combine is None and split.constexprs["MERGE"] and split.options["num_stages"] == 4
