"""Keys in the products' M dim (the decode kernel's KEYS_IN_M: S^T = K Q^T, O^T = V^T P^T): which
launches the plan gives it (fp8 caches, at most 8 query rows a KV head, no RoPE / ALiBi, the
config's ``keys_in_m``), on a faked sm90 H200 (launches recorded, not run), and that it computes
what the reference does (Triton's interpreter on the CPU: the fp8 byte path; the GPU's word path
takes the same products)."""

from __future__ import annotations

import pytest
import torch

from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch

from .test_balanced_plan import FAKED, SW36, _plan_of
from .test_decode import decode_case



@FAKED
@pytest.mark.parametrize("kv_dtype,heads,taken", [
    (torch.float8_e4m3fn, (64, 8), True),  # sw36: 8 rows a KV head
    (torch.float8_e4m3fn, (32, 8), True),  # 4 rows
    (torch.float8_e4m3fn, (128, 8), False),  # 16 rows: the 16-row tile already full
    (torch.float16, (64, 8), False),  # 16-bit caches keep their code
], ids=["fp8-g8", "fp8-g4", "fp8-g16", "fp16-g8"])
def test_plan_puts_keys_in_m_for_fp8_with_at_most_8_rows(kv_dtype, heads, taken, monkeypatch):
    call = dict(SW36, num_heads=heads[0], num_kv_heads=heads[1])
    plan = _plan_of(monkeypatch, kv_dtype=kv_dtype, **call)
    split = plan.launches(call["max_len"])[0]
    assert split.constexprs["KEYS_IN_M"] is taken
    assert split.constexprs["BLOCK_M"] == (decode_launch.KEYS_IN_M_ROWS if taken else plan.block_m)
    assert plan.block_m == 16  # the tables are still read at 16 rows a program


@FAKED
@pytest.mark.parametrize("max_len,keys_in_m", [(1024, False), (1025, True)], ids=["short-1024", "main-1025"])
def test_short_request_tiles_keep_fp8_rows_in_m_at_8_rows(max_len, keys_in_m, monkeypatch):
    """The short-request table's launches (spans <= SHORT_SPAN) put fp8's 4 rows a KV head in M, the
    main table's put the keys there; both run 8 rows a program (never the padded 16)."""
    call = dict(SW36, num_heads=32, num_kv_heads=8, max_len=max_len, batch=64)
    plan = _plan_of(monkeypatch, kv_dtype=torch.float8_e4m3fn, **call)
    split = plan.launches(max_len)[0]
    assert (plan.config_for(max_len) is plan.cfg_short) is not keys_in_m
    assert split.constexprs["KEYS_IN_M"] is keys_in_m
    assert split.constexprs["BLOCK_M"] == decode_launch.KEYS_IN_M_ROWS


@FAKED
@pytest.mark.parametrize("call", [
    dict(batch=12, max_len=16219, page=32, num_heads=8, num_kv_heads=1),
    dict(batch=2, max_len=3639, page=16, num_heads=16, num_kv_heads=2, layout="HND"),
], ids=["12-to-16219-p32-8-1", "2-to-3639-p16-16-2"])
def test_fp8_launches_merged_by_the_combine_launch_keep_the_rows_in_m(call, monkeypatch):
    """A few fp8 requests cut into many splits, merged by the combine launch: the rows in M at 8
    rows (``plan._Plan.combine_form``; all 7 such rows of the sweep measured faster or level), the
    keys in M where the config's ``combine_keys_in_m`` says so (``--ab NAME:decode:combine_keys_in_m=1``)."""
    plan = _plan_of(monkeypatch, kv_dtype=torch.float8_e4m3fn, **call)
    split, combine, *_ = plan.launches(call["max_len"])
    assert combine is not None and not split.constexprs["MERGE"]
    assert plan.config_for(call["max_len"]) is plan.cfg and plan.cfg.keys_in_m  # the table's own field
    assert split.constexprs["KEYS_IN_M"] is False and split.constexprs["BLOCK_M"] == decode_launch.KEYS_IN_M_ROWS
    with decode_configs.override(combine_keys_in_m=True):
        facts = next(iter(decode_launch._PLANS))
        arm = decode_launch._Plan(facts).launches(call["max_len"])[0]
    assert arm.constexprs["KEYS_IN_M"] is True and arm.grid == split.grid


@FAKED
def test_keys_in_m_is_the_configs_field(monkeypatch):
    """``keys_in_m`` is a config field, so ``--ab NAME:decode:keys_in_m=0`` times the rows-in-M
    kernel (at 8 rows) from the same tree."""
    from dataclasses import replace

    plan = _plan_of(monkeypatch, kv_dtype=torch.float8_e4m3fn, **SW36)
    cfg = plan.config_for(SW36["max_len"])
    assert cfg.keys_in_m and decode_launch._keys_in_m(plan, cfg)
    assert not decode_launch._keys_in_m(plan, replace(cfg, keys_in_m=False))
    with decode_configs.override(keys_in_m=False):
        assert not decode_configs.config("sm90", "fp8", 128, 16, False, "main").keys_in_m


@pytest.mark.parametrize("case", [
    dict(lens=[1, 17, 300, 0], hkv=2, group=8),
    dict(lens=[40, 300], hkv=1, group=8, layout="HND", sinks=True),
    dict(lens=[5, 260], hkv=2, group=4, q_len=2, mask=True, window=100),
    dict(lens=[33, 129], hkv=2, group=2, q_len=3),
], ids=["g8", "g8-HND-sinks", "g4-drafts2-mask-window", "g2-drafts3"])
@pytest.mark.parametrize("keys_in_m", [True, False], ids=["keys-in-m", "rows-in-m"])
def test_keys_in_m_matches_the_reference(case, keys_in_m, kernel_device, triton_backend, monkeypatch, split_launches):
    with decode_configs.override(keys_in_m=keys_in_m):
        decode_case(kernel_device, monkeypatch, fmt="fp8", d=64, **case)
    seen = {launch.constexprs["KEYS_IN_M"] for launch in split_launches}
    assert seen == {keys_in_m}
