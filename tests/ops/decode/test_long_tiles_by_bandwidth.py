"""Which decode launches take the long tiles (128 keys, 8 warps, 3 stages) by the GPU's peak copy
bandwidth an SM (``configs.main_replaces_long``): an H100-class GPU keeps them where the H100
measured them, an H200-class one takes the main table's tiles instead, except the spans of ragged
one-KV-head launches whose balanced deal the main tiles make worse (``plan._Plan._long_tiles_past``).
An H200 and an H100 simulated on the CPU: sm90's tables, 132 SMs, 60 MB of L2, the peak bandwidth
the driver's memory clock and bus width give; launches recorded, not run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import triton

from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.runtime import device as _device

from ..oracle import ON_GPU
from .test_balanced_plan import SM_COUNT, _plan_of

H200 = 2 * 3201e6 * 6144 / 8  # 4.92 TB/s: 37 GB/s an SM
H100 = 2 * 2619e6 * 5120 / 8  # 3.35 TB/s: 25 GB/s an SM
H100_NVL = 2 * 2619e6 * 6144 / 8  # 4.02 TB/s: 30 GB/s an SM (not measured: keeps the long tiles)
LONG, MAIN = (128, 8, 3), (64, 4, 4)

FAKED = pytest.mark.skipif(ON_GPU, reason="the plan of a faked sm90 GPU, built from CPU tensors under the interpreter")


def _tile(cfg) -> tuple:
    return cfg.block_n, cfg.num_warps, cfg.num_stages


def _plan_on(monkeypatch, bandwidth, **call):
    monkeypatch.setattr(decode_launch._device, "memory_bandwidth", lambda device: bandwidth)
    return _plan_of(monkeypatch, kv_dtype=torch.float16, **call)


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
                                                                       memory_bus_width=6144))
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
# the longest span at which an H200-class GPU keeps the main tiles (None: every span).
LONG_ROWS = [
    pytest.param(dict(batch=16, max_len=4096, page=16, num_heads=32, num_kv_heads=8), None, id="16x4096-p16-h32-8"),
    pytest.param(dict(batch=64, max_len=8192, page=64, num_heads=32, num_kv_heads=8), None, id="64x8192-p64-h32-8"),
    pytest.param(dict(batch=10, max_len=49133, page=64, num_heads=64, num_kv_heads=8, layout="HND"), None,
                 id="sw16-10x49133-p64-HND-h64-8"),
    pytest.param(dict(batch=57, max_len=26788, page=32, num_heads=16, num_kv_heads=2, layout="HND"), None,
                 id="sw06-57x26788-p32-HND-h16-2"),
    # 16 rows a KV head: both tiles' merge caps a request at 16 units
    pytest.param(dict(batch=22, max_len=40000, page=16, num_heads=16, num_kv_heads=1), None, id="22x40000-p16-h16-1"),
    # 8 rows on 1 KV head: spans of at most 16 x 512 keys (the main tiles' unit cap x balance_min_chunk)
    pytest.param(dict(batch=64, max_len=8192, page=16, num_heads=8, num_kv_heads=1), 8192, id="64x8192-p16-h8-1"),
]


@FAKED
@pytest.mark.parametrize("call,_", LONG_ROWS)
@pytest.mark.parametrize("bandwidth", [H100, H100_NVL, 0.0], ids=["h100", "h100-nvl", "unknown"])
def test_h100_class_gpus_keep_the_long_tiles(call, _, bandwidth, monkeypatch):
    plan = _plan_on(monkeypatch, bandwidth, **call)
    assert _tile(plan.cfg) == _tile(plan.config_for(call["max_len"])) == LONG
    assert plan.cfg_long is None


@FAKED
@pytest.mark.parametrize("call,long_past", LONG_ROWS)
def test_h200_class_gpus_take_the_main_tiles_instead(call, long_past, monkeypatch):
    """Equal batches at 2 or 8 KV heads (a unit is 2 or 8 programs), 16 query rows a KV head (both
    tiles' merge caps a request at 16 units), and, at 8 rows on 1 KV head, spans whose units the
    main tiles' cap cannot lengthen past balance_min_chunk (64 x 8192: 16 x 512 keys)."""
    plan = _plan_on(monkeypatch, H200, **call)
    main = decode_configs.config("sm90", "float16", 128, plan.block_m, False, "main")
    assert plan.cfg is main and plan.config_for(call["max_len"]) is main and _tile(main) == MAIN
    if long_past is None:
        assert plan.cfg_long is None and plan.config_for(1 << 20) is main
    else:
        assert plan.long_span == long_past and _tile(plan.config_for(long_past + 1)) == LONG


# The sweep's sw12 and sw07: ragged batches at 8 query heads on 1 KV head, slower on the H200 under
# the main tiles (66.4 -> 89.5 us, 186 -> 220); and 120 requests of the same heads, which no
# streaming span hides the boundary of.
RAGGED_ONE_HEAD = [
    pytest.param(dict(batch=45, max_len=51550, page=64, num_heads=8, num_kv_heads=1), 14, id="sw12-45-to-51550-p64"),
    pytest.param(dict(batch=22, max_len=88289, page=16, num_heads=8, num_kv_heads=1), 6, id="sw07-22-to-88289-p16"),
    pytest.param(dict(batch=120, max_len=30000, page=64, num_heads=8, num_kv_heads=1), None, id="120-to-30000-p64"),
]


@FAKED
@pytest.mark.parametrize("call,splits", RAGGED_ONE_HEAD)
def test_one_kv_head_keeps_the_long_tiles_past_the_main_tiles_unit_cap(call, splits, monkeypatch):
    """8 rows on 1 KV head: the main tiles' 4-warp merge loads 2 partials a round against the long
    tiles' 4, so a request's unit cap halves (16 against 32); past 16 x 512 keys that lengthens the
    longest request's units, and past 8 splits a uniform batch no longer deals. Those spans keep
    the long tiles, with the H100's launch exactly; shorter ones take the main tiles (the
    streaming tiles first, up to their span, on either GPU)."""
    from kvattn.ops.common.balance import unit_cap

    plan = _plan_on(monkeypatch, H200, **call)
    assert _tile(plan.cfg) == MAIN and _tile(plan.cfg_long) == LONG
    assert plan.long_span == unit_cap(2) * plan.cfg.balance_min_chunk == 16 * 512
    edge = max(plan.long_span, plan.stream_span)
    assert plan.config_for(edge + 1) is plan.cfg_long
    if plan.stream_span < plan.long_span:
        assert plan.config_for(plan.long_span) is plan.cfg
    span = call["max_len"]
    split = plan.launches(span)[0]
    assert split.constexprs["BLOCK_N"] == 128 and split.options["num_warps"] == 8
    if splits is not None:
        assert split.constexprs["BALANCED"] and split.fixed["num_splits"] == splits and split.grid[0] == SM_COUNT
        assert split.constexprs["MERGE_BLOCK_S"] == 4 and unit_cap(4) == 32
    h200 = _launch(plan, span)
    h100 = _launch(_plan_on(monkeypatch, H100, **call), span)
    assert h200 == h100


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
        assert _tile(old.cfg) == LONG and old.cfg_long is None
        old_launches = [_launch(old, n) for n in spans]
    assert plan.cfg_long is not None
    h100 = _plan_on(monkeypatch, H100, **call)
    # (the override's configs differ from the H100's in that field only, which no launch reads)
    assert old_launches == [_launch(h100, n) for n in spans]


@FAKED
@pytest.mark.parametrize("call,_", RAGGED_ONE_HEAD[:2])
def test_main_tiles_with_the_long_tiles_merge_round_as_a_config_override(call, _, monkeypatch):
    """``--ab mm:decode:block_n=64,num_warps=4,num_stages=4,balance_merge_values=32`` (a tuning arm,
    not a rule): 4-warp programs merge 4 partials a round, as the long tiles' 8-warp ones do at 16
    values a thread, so a request keeps the 32-unit cap, sw07's 12 uniform splits deal (3 rounds),
    and with equal caps the plan keeps no long tiles at any span."""
    from kvattn.ops.common.balance import unit_cap

    _plan_on(monkeypatch, H200, **call)
    facts = next(iter(decode_launch._PLANS))
    with decode_configs.override(block_n=64, num_warps=4, num_stages=4, balance_merge_values=32):
        plan = decode_launch._Plan(facts)
        split = plan.launches(call["max_len"])[0]
    assert plan.cfg_long is None and _tile(plan.cfg) == MAIN
    assert split.constexprs["BALANCED"] and split.grid[0] == 2 * SM_COUNT
    assert split.constexprs["MERGE_BLOCK_S"] == 4 and unit_cap(4) == 32
