"""Page runs (the decode kernel's PAGE_RUNS): a tile's addresses a run of rows in one page at a time,
one page id and 64-bit offset a run, a row's int32 offset in its page. Which launches the plan
gives them, and that they read exactly what the token offsets read: outputs bit-identical with the
config's ``page_runs`` off, unusable page ids included (zeros, never outside the cache:
docs/semantics.md "Unusable page ids and lengths")."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import kvattn
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.testing import make_paged_kv, poison_

from ..oracle import ON_GPU
from .test_balanced_plan import FAKED, SW36, _plan_of


@FAKED
@pytest.mark.parametrize("page,layout", [(64, "NHD"), (64, "HND"), (16, "NHD"), (32, "HND")])
def test_plan_takes_page_runs_on_16bit_tiles_of_whole_pages_or_in_one(page, layout, monkeypatch):
    """bf16 / fp16 main tiles (64 keys, 4 warps) on pages of 16-64 take the runs; the config field,
    a plan without the page offsets, tiles not cut whole from key 0 (a window / first keys) and a
    page whose rows' offsets pass int32 turn them off."""
    plan = _plan_of(monkeypatch, batch=64, max_len=8192, page=page, num_heads=32, num_kv_heads=8,
                    kv_dtype=torch.float16, layout=layout)
    cfg = plan.config_for(8192)
    assert cfg.block_n < 32 * cfg.num_warps
    assert plan.launches(8192)[0].constexprs["PAGE_RUNS"] is True
    assert not decode_launch._page_runs(plan, replace(cfg, page_runs=False))
    assert not decode_launch._page_runs(plan, replace(cfg, page_offsets=False))
    with decode_configs.override(page_runs=False):
        assert not decode_configs.config("sm90", "bfloat16", 128, 16, False, "main").page_runs
    monkeypatch.setattr(plan, "whole_tiles", False)
    assert not decode_launch._page_runs(plan, cfg)
    monkeypatch.setattr(plan, "whole_tiles", True)
    k_p, _, k_h = plan.k_strides
    monkeypatch.setattr(plan, "k_strides", (k_p, 2**31 // (page - 1), k_h))
    assert not decode_launch._page_runs(plan, cfg)


@FAKED
def test_plan_keeps_token_offsets_where_a_tile_has_a_key_a_thread(monkeypatch):
    """fp8's 128-key tiles on 4 warps (sw36, pages of 16) keep the token offsets: there Triton loads
    one page id a thread already."""
    plan = _plan_of(monkeypatch, kv_dtype=torch.float8_e4m3fn, **SW36)
    cfg = plan.config_for(SW36["max_len"])
    assert cfg.block_n >= 32 * cfg.num_warps
    split = plan.launches(SW36["max_len"])[0]
    assert split.constexprs["PAGE_OFFSETS"] == 2 and split.constexprs["PAGE_RUNS"] is False


# The interpreter's tiles everywhere: 32 keys on 4 warps hold up to 4 pages of 8 or lie in one of
# 64 (the GPU's D 64 tiles of 128 keys have a key a thread: no runs, tile_page_runs)
TILE = dict(block_n=32) if ON_GPU else {}


def _run(case, q, tables, layout, kv_cache, launches, on, q_len=1, window_left=-1, **fields):
    fields = {**TILE, **fields}
    before = len(launches)
    out = poison_(torch.empty_like(q))
    with decode_configs.override(page_runs=on, **fields):
        kvattn.decode.xqa_batch_decode_with_kv_cache(
            q, kv_cache, torch.zeros(1 << 22, dtype=torch.uint8, device=q.device), tables, case.seq_lens,
            case.max_seq_len, bmm1_scale=0.2, kv_layout=layout, out=out, q_len_per_req=q_len,
            window_left=window_left)
    if ON_GPU:
        torch.cuda.synchronize()
    return out, {launch.constexprs["PAGE_RUNS"] for launch in launches[before:]}


def _launch_split(case, q, tables, launches, on):
    """``launch_decode`` over K and V page tables of their own (``tables [B, 2, P]``, an NHD cache)."""
    before = len(launches)
    out = poison_(torch.empty_like(q))
    k, v = case.kv_cache
    with decode_configs.override(page_runs=on, **TILE):
        decode_launch.launch_decode(q, k, v, out, paged=True, k_table=tables[:, 0], v_table=tables[:, 1],
                                    seq_lens=case.seq_lens, max_seq_len=case.max_seq_len, logit_factor=0.2)
    if ON_GPU:
        torch.cuda.synchronize()
    assert not launches[before].constexprs["SAME_TABLE"]
    return out, {launch.constexprs["PAGE_RUNS"] for launch in launches[before:]}


@pytest.mark.parametrize("fmt", ["float16", "fp8"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page", [8, 16, 64], ids=lambda p: f"page{p}")
def test_page_runs_read_what_token_offsets_read(fmt, layout, page, kernel_device, triton_backend, monkeypatch,
                                                split_launches):
    """Bit-identical outputs with and without PAGE_RUNS: tiles of several whole pages (8, 16) and
    tiles inside one page (64, at either half of it on the interpreter's 32-key tiles), ragged
    lengths ending inside a tile, and unusable ids in used table entries (huge, negative, one past
    the pool), which read as zeros and never fault."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    hkv, group, d = 2, 4, 64
    case = make_paged_kv([40, 300, 17, 129], num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.float16,
                         kv_format=fmt, layout=layout, form="tuple", device=kernel_device, seed=3)
    q = torch.randn(4, hkv * group, d, generator=torch.Generator().manual_seed(5)).to(kernel_device, torch.float16)
    tables = case.block_tables.clone()
    k = case.kv_cache[0]
    tables[0, 0], tables[1, 2], tables[1, -(-300 // page) - 1], tables[3, 1] = 2**31 - 1, -(2**31), -1, k.shape[0]
    on, runs_on = _run(case, q, tables, layout, case.kv_cache, split_launches, True)
    off, runs_off = _run(case, q, tables, layout, case.kv_cache, split_launches, False)
    assert runs_on == {True} and runs_off == {False}
    assert torch.isfinite(on.float()).all()
    assert torch.equal(on, off)


@pytest.mark.parametrize("variant", ["split-tables", "v-own-strides", "no-page-ahead", "drafts", "balanced"])
def test_page_runs_variants_read_what_token_offsets_read(variant, kernel_device, triton_backend, monkeypatch,
                                                         split_launches):
    """The same with K and V on tables of their own (a bad V id alone reads a zero value), V's
    strides other than K's (V's runs of its own), page ids loaded in the tile's iteration
    (``page_ahead`` off), two draft rows a request, and a ragged batch's balanced launch (lanes of
    whole tiles, merged in the kernel)."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    hkv, group, d, page, layout = 2, 4, 64, 16, "NHD"
    lens = [600, 3, 0, 97, 5] if variant == "balanced" else [40, 300, 17]
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.float16,
                         layout=layout, form="tuple", device=kernel_device, seed=4,
                         split_tables=variant == "split-tables")
    k, v = case.kv_cache
    tables = case.block_tables.clone()
    if variant == "split-tables":
        tables[1, 1, 3] = -7  # request 1's V page of tokens 48..63 only
    else:
        tables[0 if variant == "balanced" else 1, 3] = -1
    if variant == "v-own-strides":  # the same values in a pool of 16 more elements a page
        big = torch.zeros(v.shape[0], v[0].numel() + 16, dtype=v.dtype, device=v.device)
        big[:, :v[0].numel()] = v.reshape(v.shape[0], -1)
        v = big[:, :v[0].numel()].view(v.shape)
        assert v.stride() != k.stride()
    q_len = 2 if variant == "drafts" else 1
    q = torch.randn(len(lens) * q_len, hkv * group, d, generator=torch.Generator().manual_seed(6)).to(
        kernel_device, torch.float16)
    if variant == "split-tables":  # (the public decode calls take one table: the launcher itself)
        on, runs_on = _launch_split(case, q, tables, split_launches, True)
        off, runs_off = _launch_split(case, q, tables, split_launches, False)
    else:
        kwargs = dict(q_len=q_len, page_ahead=variant != "no-page-ahead")
        if variant == "balanced":  # (test_decode.py's balanced-split overrides)
            kwargs.update(min_chunk=32, waves=4, max_splits=2, balance_waves=4, balance_min_chunk=32)
        on, runs_on = _run(case, q, tables, layout, (k, v), split_launches, True, **kwargs)
        off, runs_off = _run(case, q, tables, layout, (k, v), split_launches, False, **kwargs)
    assert runs_on == {True} and runs_off == {False}
    assert torch.isfinite(on.float()).all()
    assert torch.equal(on, off)
    if variant == "balanced":
        assert all(launch.constexprs["BALANCED"] for launch in split_launches)


def test_windows_keep_token_offsets(kernel_device, triton_backend, monkeypatch, split_launches):
    """A window's first key is no multiple of the tile: its launches keep the token offsets."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    case = make_paged_kv([40, 300, 17], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16,
                         form="tuple", device=kernel_device, seed=7)
    q = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(8)).to(kernel_device, torch.float16)
    _, runs = _run(case, q, case.block_tables, "NHD", case.kv_cache, split_launches, True, window_left=50)
    assert runs == {False}
    assert all(launch.constexprs["PAGE_OFFSETS"] for launch in split_launches)
