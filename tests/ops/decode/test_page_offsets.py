"""Token offsets where the page ids load (the decode kernel's PAGE_OFFSETS, candidate (b) of
lab/notes/formats.md "Formats: where the fp8 decode loop's instructions go"): which launches the
plan gives it, and that it reads exactly what the per-row offsets read -- outputs bit-identical
with the config's ``page_offsets`` off, unusable page ids included (zeros, never outside the
cache: docs/semantics.md "Unusable page ids and lengths")."""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.testing import make_paged_kv, poison_

from ..oracle import ON_GPU
from .test_balanced_plan import FAKED, SW36, _plan_of



@FAKED
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float16], ids=["fp8", "fp16"])
def test_plan_takes_page_offsets_and_the_config_field_turns_them_off(kv_dtype, monkeypatch):
    from dataclasses import replace

    plan = _plan_of(monkeypatch, kv_dtype=kv_dtype, **SW36)
    cfg = plan.config_for(SW36["max_len"])
    assert plan.page_offsets_mode == 2  # one table, K and V of equal strides
    assert plan.launches(SW36["max_len"])[0].constexprs["PAGE_OFFSETS"] == 2
    assert decode_launch._page_offsets(plan, replace(cfg, page_offsets=False)) == 0
    with decode_configs.override(page_offsets=False):
        assert not decode_configs.config("sm90", "fp8", 128, 16, False, "main").page_offsets


def _run(case, q, tables, layout, kv_cache, launches, on):
    before = len(launches)
    out = poison_(torch.empty_like(q))
    with decode_configs.override(page_offsets=on):
        kvattn.decode.xqa_batch_decode_with_kv_cache(
            q, kv_cache, torch.zeros(1 << 22, dtype=torch.uint8, device=q.device), tables, case.seq_lens,
            case.max_seq_len, bmm1_scale=0.2, kv_layout=layout, out=out)
    if ON_GPU:
        torch.cuda.synchronize()
    return out, {launch.constexprs["PAGE_OFFSETS"] for launch in launches[before:]}


@pytest.mark.parametrize("fmt", ["float16", "fp8"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("v_strides", ["equal", "padded"], ids=["v-shares-k", "v-own-offsets"])
def test_page_offsets_read_what_row_offsets_read(fmt, layout, v_strides, kernel_device, triton_backend,
                                                 monkeypatch, split_launches):
    """Bit-identical outputs with and without PAGE_OFFSETS (2: V takes K's offsets; 1: V's strides
    differ, its own offsets), with unusable ids in used table entries (huge, negative, one past the
    pool), which read as zeros and never fault."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    hkv, group, d, page = 2, 4, 64, 16
    case = make_paged_kv([40, 300, 17], num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.float16,
                         kv_format=fmt, layout=layout, form="tuple", device=kernel_device, seed=3)
    k, v = case.kv_cache
    if v_strides == "padded":  # the same values in a pool of 16 more elements a page: other strides
        big = torch.zeros(v.shape[0], v[0].numel() + 16, dtype=v.dtype, device=v.device)
        big[:, :v[0].numel()] = v.reshape(v.shape[0], -1)
        v = big[:, :v[0].numel()].view(v.shape)
        assert v.stride() != k.stride()
    q = torch.randn(3, hkv * group, d, generator=torch.Generator().manual_seed(5)).to(kernel_device, torch.float16)
    tables = case.block_tables.clone()
    tables[0, 0], tables[1, 3], tables[1, 7], tables[2, 1] = 2**31 - 1, -(2**31), -1, k.shape[0]
    on, modes_on = _run(case, q, tables, layout, (k, v), split_launches, True)
    off, modes_off = _run(case, q, tables, layout, (k, v), split_launches, False)
    assert modes_on == {2 if v_strides == "equal" else 1} and modes_off == {0}
    assert torch.isfinite(on.float()).all()
    assert torch.equal(on, off)
