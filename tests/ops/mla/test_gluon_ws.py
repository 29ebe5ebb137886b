"""The warp-specialised Gluon MLA decode kernel (``kvattn.ops.mla.kernels_gluon_ws``).

GPU (Hopper): the public function against the oracles on the launches the kernel takes (a 16-bit
cache with a query of its dtype, Hq 33-128, or an e4m3 query over an e4m3 cache, Hq 17-128; pages of
a multiple of 64 tokens, or of 16 or 32, a tile over 4 / 2 pages), with a spy on the launcher
proving the kernel ran: fresh random inputs,
poisoned outputs, NaN in every unused cache slot, permuted pages, lengths 0 / 1 / off-tile / odd
and even tile counts, a request longer than one split, scales as floats and as device tensors,
CUDA-graph replay with new lengths, tables and scales.

CPU: the launch selection (a Hopper device faked), and the tuning variants of
``benchmarks/tune_mla.py`` reaching the launch. What the kernel compiles to for sm_90a is pinned
in ``test_codegen.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kvattn
from kvattn.formats import FP8_DTYPE
from kvattn.ops.mla import configs as mla_configs
from kvattn.ops.mla import plan as mla_launch
from kvattn.runtime import fast_launch
from kvattn.testing import relative_error

from .test_mla import BMM1, DIM, GPU_LENS, V_DIM, _fits, exact_mla, graph_replay_case, mla_case

ON_GPU = torch.cuda.is_available()
HOPPER = ON_GPU and torch.cuda.get_device_capability() == (9, 0)
GPU_ONLY = pytest.mark.skipif(not HOPPER, reason="the warp-specialised kernel runs on Hopper (sm_90)")


def _spy(monkeypatch, kernel_name):
    calls = []
    run = fast_launch.Launch.__call__

    def spy(self, *args, **kwargs):
        if self.kernel is getattr(mla_launch, kernel_name):
            calls.append(self.fixed["num_splits"])
        return run(self, *args, **kwargs)

    monkeypatch.setattr(fast_launch.Launch, "__call__", spy)
    mla_launch._PLANS.clear()
    return calls


@pytest.fixture
def ws_spy(monkeypatch):
    """Counts the launches of the warp-specialised kernel (its split count, each launch)."""
    yield _spy(monkeypatch, "mla_gluon_ws_kernel")
    mla_launch._PLANS.clear()


@pytest.fixture
def gluon_spy(monkeypatch):
    """Counts the launches of the other Gluon kernel (mla/kernels_gluon.py; its split count, each launch)."""
    yield _spy(monkeypatch, "mla_gluon_kernel")
    mla_launch._PLANS.clear()


ODD_EVEN = [64, 65, 128, 129, 191, 192, 193, 320, 0, 1, 63]  # 1 / 2 / 3 / 4 / 5 tiles, whole and partial
WS_CASES = [
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, page=page, seed=300 + hq + page), id=f"Hq{hq}-p{page}")
      for hq in (64, 128) for page in (64, 128, 256)],
    pytest.param(dict(lens=GPU_LENS, hq=96, seed=396), id="Hq96-padded-heads"),
    pytest.param(dict(lens=GPU_LENS, hq=40, seed=340), id="Hq40-padded-heads"),
    # fewer than 64 heads take the kernel's 64-head programs (configs.padded_heads), rows past them padded
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, page=page, seed=360 + hq), id=f"Hq{hq}-p{page}-padded-heads")
      for hq, page in ((17, 64), (32, 128), (16, 64), (8, 128), (1, 64))],
    pytest.param(dict(lens=ODD_EVEN, hq=16, seed=316, tensor_scales=True), id="Hq16-odd-even-tiles-tensor-scales"),
    pytest.param(dict(lens=ODD_EVEN, hq=24, seed=324, tensor_scales=True), id="Hq24-odd-even-tiles-tensor-scales"),
    pytest.param(dict(lens=ODD_EVEN, hq=128, seed=311), id="Hq128-odd-even-tiles"),
    pytest.param(dict(lens=ODD_EVEN, hq=64, page=128, seed=312), id="Hq64-p128-odd-even-tiles"),
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, tensor_scales=True, seed=320 + hq), id=f"Hq{hq}-tensor-scales")
      for hq in (64, 128)],
    pytest.param(dict(lens=[16384, 5, 9000], hq=128, seed=330), id="Hq128-long-split"),
    pytest.param(dict(lens=[30000], hq=64, seed=331), id="Hq64-long-split-B1"),
    pytest.param(dict(lens=GPU_LENS, hq=128, four_d=True, give_out=False, seed=332), id="Hq128-4d-out-allocated"),
    pytest.param(dict(lens=[100, 30, 0], hq=128, max_seq_len="capacity", seed=333), id="Hq128-max_seq_len-capacity"),
    pytest.param(dict(lens=[0, 0, 0], hq=128, max_seq_len="capacity", seed=334), id="Hq128-all-empty"),
    # pages of 16 and 32: a 64-key tile over 4 / 2 pages, one TMA box a page (Hq 16 / 32 in padded
    # 64-head programs); lengths 0 / 1 / inside a page / inside a tile / odd and even tile counts
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, page=page, seed=370 + hq + page), id=f"Hq{hq}-p{page}")
      for hq in (16, 32, 64, 128) for page in (16, 32)],
    *[pytest.param(dict(lens=ODD_EVEN + [15, 16, 17, 31, 33, 48, 80, 96], hq=hq, page=page, seed=380 + hq + page),
                   id=f"Hq{hq}-p{page}-odd-even-tiles-off-page") for hq in (32, 128) for page in (16, 32)],
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, page=page, tensor_scales=True, seed=390 + hq + page),
                   id=f"Hq{hq}-p{page}-tensor-scales") for hq, page in ((64, 16), (128, 32))],
    *[pytest.param(dict(lens=[16384, 5, 9000], hq=128, page=page, seed=398 + page), id=f"Hq128-p{page}-long-split")
      for page in (16, 32)],
    pytest.param(dict(lens=[100, 30, 0], hq=64, page=16, max_seq_len="capacity", seed=399),
                 id="Hq64-p16-max_seq_len-capacity"),
]


@GPU_ONLY
@pytest.mark.parametrize("kw", WS_CASES)
def test_ws_kernel_matches_oracles(kw, ws_spy, triton_backend, monkeypatch):
    mla_case(torch.device("cuda"), monkeypatch, **kw)
    assert ws_spy, "the warp-specialised kernel did not run"


@GPU_ONLY
@pytest.mark.parametrize("page", [64, 16, 32], ids=lambda p: f"p{p}")
@pytest.mark.parametrize("hq", [64, 128], ids=["Hq64", "Hq128"])
def test_ws_kernel_many_splits(hq, page, ws_spy, triton_backend, monkeypatch):
    """Short splits: many partials a request (some empty, some of one or a few tiles, odd and even
    counts), merged by the combine kernel."""
    with mla_configs.override(min_chunk=64, waves=16):
        mla_case(torch.device("cuda"), monkeypatch, lens=[1500, 3, 0, 970, 64, 2049, 129], hq=hq, page=page,
                 seed=340 + hq + page)
    assert ws_spy and max(ws_spy) > 1


@GPU_ONLY
@pytest.mark.parametrize("kw", [
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, page=page, seed=410 + hq + page), id=f"Hq{hq}-p{page}")
      for hq in (64, 128) for page in (16, 32)],
    pytest.param(dict(lens=ODD_EVEN + [15, 17, 33], hq=128, page=16, seed=415), id="Hq128-p16-odd-even-tiles"),
    pytest.param(dict(lens=[16384, 5, 9000], hq=64, page=32, seed=416), id="Hq64-p32-long-split"),
])
def test_gluon_kernel_over_small_pages_matches_oracles(kw, gluon_spy, triton_backend, monkeypatch):
    """``KVATTN_GLUON_WS=0``: mla/kernels_gluon.py's kernel over pages of 16 and 32 (its tile's
    copies one box a page), as a launch asking for the LSE takes it."""
    monkeypatch.setenv("KVATTN_GLUON_WS", "0")
    mla_case(torch.device("cuda"), monkeypatch, **kw)
    assert gluon_spy, "mla/kernels_gluon.py's kernel did not run"


@GPU_ONLY
def test_ws_switch_keeps_the_previous_gluon_kernel(ws_spy, triton_backend, monkeypatch):
    monkeypatch.setenv("KVATTN_GLUON_WS", "0")
    mla_case(torch.device("cuda"), monkeypatch, lens=GPU_LENS, hq=128, seed=350)
    assert not ws_spy


@GPU_ONLY
@pytest.mark.parametrize("page", [64, 16, 32], ids=lambda p: f"p{p}")
@pytest.mark.parametrize("hq", [64, 128], ids=["Hq64", "Hq128"])
def test_ws_cuda_graph_replay_follows_new_lengths_tables_and_scales(hq, page, ws_spy, triton_backend):
    graph_replay_case(hq, [700, 40, 2500, 0, 6000],
                      [(2, [1200, 0, 6000, 33, 64 * 17], 0.5), (3, [1, 6399, 65, 128, 0], 1.7)], pool=400, page=page)
    assert ws_spy


@GPU_ONLY
@pytest.mark.parametrize("ws", [True, False], ids=["ws", "gluon"])
@pytest.mark.parametrize("page", [16, 32, 64], ids=lambda p: f"p{p}")
def test_gluon_kernels_read_unusable_page_ids_as_zeros(page, ws, ws_spy, gluon_spy, triton_backend, monkeypatch):
    """Page ids outside the cache (-1, past the last page, INT_MIN) inside a request's pages, and
    so inside a tile over several pages of 16 / 32 next to usable ones: a zero key and value that
    keep their logit (docs/semantics.md "Unusable page ids"), as the cache with those ids pointing
    at a page of zeros gives; NaN in the cache's last, never-named page."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")  # (the device-value checks reject these ids; the kernels are tested)
    if not ws:
        monkeypatch.setenv("KVATTN_GLUON_WS", "0")
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(600 + page)
    width, lens = 640 // page, [640, 300, 129]
    pages = 3 * width + 2  # (the last one never named by the table)
    cache = torch.randn(pages, page, DIM, generator=g).to(device=device, dtype=torch.bfloat16)
    cache[-1] = float("nan")
    tables = torch.randperm(pages - 1, generator=g)[: 3 * width].view(3, width).to(torch.int32)
    bad = torch.zeros_like(tables, dtype=torch.bool)
    for b, col, wild in ((0, 1, -1), (0, width // 2 + 1, pages + 7), (1, 2, -2**31), (2, 128 // page, pages)):
        tables[b, col], bad[b, col] = wild, True
    q = torch.randn(3, 1, 64, DIM, generator=g).to(device=device, dtype=torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    out = torch.full((3, 64, V_DIM), float("nan"), dtype=torch.bfloat16, device=device)
    kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, torch.zeros(64 << 20, dtype=torch.uint8, device=device),
                                                  128, V_DIM, 64, tables.to(device), seq_lens, 640, out=out,
                                                  bmm1_scale=BMM1)
    zeroed = torch.cat([cache.cpu(), torch.zeros(1, page, DIM, dtype=torch.bfloat16)])
    exact = exact_mla(q, zeroed, torch.where(bad, pages, tables), seq_lens, BMM1, 1.0)
    assert not torch.isnan(out).any()
    assert relative_error(out.cpu(), exact) <= 1e-2
    assert (ws_spy if ws else gluon_spy), "the Gluon kernel did not run"


# The e4m3 form (an fp8 query over an fp8 cache): the same grid, plus head counts padded to the
# 64-head program from below (Hq 20 / 40), as fp8 scores take BLOCK_H 64 from 17 heads up.
WS_FP8_CASES = [
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, page=page, seed=500 + hq + page), id=f"fp8-Hq{hq}-p{page}")
      for hq in (64, 128) for page in (64, 128, 256)],
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, seed=500 + hq), id=f"fp8-Hq{hq}-padded-heads") for hq in (20, 40, 96)],
    pytest.param(dict(lens=ODD_EVEN, hq=128, seed=511), id="fp8-Hq128-odd-even-tiles"),
    pytest.param(dict(lens=ODD_EVEN, hq=64, page=128, seed=512), id="fp8-Hq64-p128-odd-even-tiles"),
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, tensor_scales=True, seed=520 + hq), id=f"fp8-Hq{hq}-tensor-scales")
      for hq in (64, 128)],
    pytest.param(dict(lens=[16384, 5, 9000], hq=128, seed=530), id="fp8-Hq128-long-split"),
    pytest.param(dict(lens=[30000], hq=64, seed=531), id="fp8-Hq64-long-split-B1"),
    pytest.param(dict(lens=GPU_LENS, hq=128, four_d=True, give_out=False, seed=532), id="fp8-Hq128-4d-out-allocated"),
    pytest.param(dict(lens=[100, 30, 0], hq=128, max_seq_len="capacity", seed=533),
                 id="fp8-Hq128-max_seq_len-capacity"),
    pytest.param(dict(lens=[0, 0, 0], hq=128, max_seq_len="capacity", seed=534), id="fp8-Hq128-all-empty"),
    # pages of 16 and 32 (a tile over 4 / 2 pages, one 64-byte-wide box a page and piece)
    *[pytest.param(dict(lens=GPU_LENS, hq=hq, page=page, seed=560 + hq + page), id=f"fp8-Hq{hq}-p{page}")
      for hq in (20, 64, 128) for page in (16, 32)],
    *[pytest.param(dict(lens=ODD_EVEN + [15, 17, 33], hq=128, page=page, seed=570 + page),
                   id=f"fp8-Hq128-p{page}-odd-even-tiles") for page in (16, 32)],
    pytest.param(dict(lens=[16384, 5, 9000], hq=128, page=16, seed=580), id="fp8-Hq128-p16-long-split"),
]


@GPU_ONLY
@pytest.mark.parametrize("kw", WS_FP8_CASES)
def test_ws_fp8_kernel_matches_oracles(kw, ws_spy, triton_backend, monkeypatch):
    mla_case(torch.device("cuda"), monkeypatch, kv_format="fp8", **kw)
    assert ws_spy, "the warp-specialised kernel did not run"


@GPU_ONLY
@pytest.mark.parametrize("hq", [64, 128], ids=["Hq64", "Hq128"])
def test_ws_fp8_kernel_many_splits(hq, ws_spy, triton_backend, monkeypatch):
    with mla_configs.override(min_chunk=64, waves=16):
        mla_case(torch.device("cuda"), monkeypatch, lens=[1500, 3, 0, 970, 64, 2049, 129], hq=hq, kv_format="fp8",
                 seed=540 + hq)
    assert ws_spy and max(ws_spy) > 1


@GPU_ONLY
@pytest.mark.parametrize("page", [64, 16], ids=lambda p: f"p{p}")
@pytest.mark.parametrize("max_splits", [1, 2], ids=lambda s: f"splits{s}")
def test_ws_fp8_kernel_takes_16_heads_with_long_programs(max_splits, page, ws_spy, triton_backend, monkeypatch):
    """fp8 scores at 16 heads: programs of at least PADDED_MIN_KEYS keys run the e4m3 form with the
    rows padded to 64 (the split count capped so GPU_LENS' 2048 keys make 1024-key programs), on a
    GPU those programs were measured on (an H200; an H100 keeps the heads-in-N kernel)."""
    from kvattn.runtime import device as _device
    device = torch.device("cuda")
    with mla_configs.override(max_splits=max_splits):
        mla_case(device, monkeypatch, lens=GPU_LENS, hq=16, page=page, kv_format="fp8",
                 seed=590 + max_splits + page)
    measured = mla_configs.padded_heads("sm90", "fp8", 16, True, sm_count=_device.sm_count(device),
                                        bandwidth=_device.memory_bandwidth(device)) is not None
    assert bool(ws_spy) == measured, "the warp-specialised kernel ran where it should not, or not where it should"


@GPU_ONLY
def test_ws_fp8_switch_keeps_the_triton_kernel(ws_spy, triton_backend, monkeypatch):
    """``KVATTN_GLUON_WS=0``: an fp8 launch runs the Triton kernel's fp8 scores (mla/gluon.py
    serves 16-bit caches only)."""
    monkeypatch.setenv("KVATTN_GLUON_WS", "0")
    mla_case(torch.device("cuda"), monkeypatch, lens=GPU_LENS, hq=128, kv_format="fp8", seed=550)
    assert not ws_spy


@GPU_ONLY
@pytest.mark.parametrize("page", [64, 16], ids=lambda p: f"p{p}")
@pytest.mark.parametrize("hq", [64, 128], ids=["Hq64", "Hq128"])
def test_ws_fp8_cuda_graph_replay_follows_new_lengths_tables_and_scales(hq, page, ws_spy, triton_backend):
    graph_replay_case(hq, [700, 40, 2500, 0, 6000],
                      [(2, [1200, 0, 6000, 33, 64 * 17], 0.5), (3, [1, 6399, 65, 128, 0], 1.7)], pool=400,
                      kv_format="fp8", page=page)
    assert ws_spy


# ---------------------------------------------------------------------------------------------
# CPU: launch selection
# ---------------------------------------------------------------------------------------------
def test_fewer_than_64_heads_of_a_16_bit_cache_take_the_64_head_programs():
    """sm90, 16-bit cache, 1-32 heads: the 64-head entry (the launcher gives it to the
    warp-specialised kernel where that fits the pages); not 33+ (already 64 a program), not an fp8
    query, not another GPU family, not under an override (tuning and tests pick their own)."""
    for hq, own in ((1, 16), (8, 16), (16, 16), (17, 32), (24, 32), (32, 32)):
        wide = mla_configs.padded_heads("sm90", "bfloat16", hq)
        assert wide is not None and wide.block_h == 64 and mla_configs.warp_specialized("sm90", "bfloat16", 64)
        assert mla_configs.config("sm90", "bfloat16", hq).block_h == own  # (the table's own entry)
    assert mla_configs.padded_heads("sm90", "float16", 20) is not None
    for hq in (33, 64, 128):
        assert mla_configs.padded_heads("sm90", "bfloat16", hq) is None, hq
    assert mla_configs.padded_heads("sm90", "fp8", 24, True) is None  # (fp8 scores take 64 from 17 heads up)
    # fp8 scores with heads in N: the padded e4m3 programs (for long programs only) on an H200, where
    # they were measured; not on an H100 or a GPU whose bandwidth is unknown (16-bit caches pad there too)
    h200, h100 = dict(sm_count=132, bandwidth=4.81e12), dict(sm_count=132, bandwidth=3.35e12)
    for hq in (1, 8, 16):
        wide = mla_configs.padded_heads("sm90", "fp8", hq, True, **h200)
        assert wide is not None and wide.block_h == 64 and wide.qk_fp8 and not wide.heads_as_n
        assert mla_configs.padded_heads("sm90", "fp8", hq, True, **h100) is None
        assert mla_configs.padded_heads("sm90", "fp8", hq, True) is None
        assert mla_configs.padded_heads("sm90", "bfloat16", hq, **h100) is not None
    assert mla_configs.padded_min_keys("fp8", True) == 1024 and mla_configs.padded_min_keys("bfloat16") == 0
    assert mla_configs.padded_heads("sm90", "fp8", 16) is None  # a 16-bit query over fp8 pages
    assert mla_configs.padded_heads("default", "bfloat16", 24) is None
    assert mla_configs.padded_heads("interpreter", "bfloat16", 24) is None
    with mla_configs.override(block_n=32):
        assert mla_configs.padded_heads("sm90", "bfloat16", 24) is None


def test_ws_kernel_takes_the_gluon_kernels_launches():
    """sm90, 16-bit cache, 64 heads a program: the launches mla/gluon.py serves (test_mla's _fits)
    take the warp-specialised kernel; no other entry does, and no other GPU family."""
    assert _fits(hq=128) and mla_configs.warp_specialized("sm90", "bfloat16", 64)
    assert mla_configs.warp_specialized("sm90", "float16", 64)
    assert not mla_configs.warp_specialized("sm90", "bfloat16", 32)
    assert not mla_configs.warp_specialized("sm90", "fp8", 64)  # a 16-bit query over fp8 pages
    assert mla_configs.warp_specialized("sm90", "fp8", 64, True)  # fp8 scores, heads in M
    assert not mla_configs.warp_specialized("sm90", "fp8", 16, True)  # fp8 scores with heads in N (Hq <= 16)
    assert not mla_configs.warp_specialized("default", "bfloat16", 64)
    assert not mla_configs.warp_specialized("interpreter", "bfloat16", 64)
    for hq in (33, 64, 96, 128):
        cfg = mla_configs.config("sm90", "bfloat16", hq)
        assert mla_configs.warp_specialized("sm90", "bfloat16", cfg.block_h)
    for hq in (17, 32, 64, 128):
        cfg = mla_configs.config("sm90", "fp8", hq, True)
        assert cfg.qk_fp8 and mla_configs.warp_specialized("sm90", "fp8", cfg.block_h, True)
        assert mla_launch._ws_fp8_fits(cfg, FP8_DTYPE, FP8_DTYPE, (100, 64, 576), (64 * 576, 576, 1), True)
    assert not mla_configs.warp_specialized("sm90", "fp8", mla_configs.config("sm90", "fp8", 16, True).block_h, True)


def facts_of(monkeypatch, *, hq=128, page=64, gluon=True, gluon_ws=True, dtype=torch.bfloat16, q_dtype=None,
             lse_stride=None, q_len=1, batch_invariant=False, bandwidth=4.81e12):
    """The host facts of a launch on a Hopper GPU (the device faked, no GPU needed; an H200's peak
    copy bandwidth unless told): query [4, hq, 576] of ``q_dtype`` (default ``dtype``; ``hq`` counts
    the rows, Q tokens x heads, with ``q_len``), a [100, page, 576] cache of ``dtype``."""
    from kvattn.runtime import device as _device
    monkeypatch.setattr(_device, "is_hopper", lambda device: True)
    monkeypatch.setattr(_device, "memory_bandwidth", lambda device: bandwidth)
    return mla_launch.MLAFacts(
        device=torch.device("cpu"), interpreter=False, q_shape=(4, hq, 576), q_stride=(hq * 576, 576, 1),
        q_dtype=q_dtype or dtype, kv_shape=(100, page, 576), kv_stride=(page * 576, 576, 1), kv_dtype=dtype,
        table_stride=(10, 1), out_stride=(hq * 512, 512, 1), ws_numel=64 << 20, has_logit=False,
        has_out_scale=False, aligned4=dtype == FP8_DTYPE, aligned16=True, gluon_on=gluon, gluon_ws_on=gluon_ws,
        lse_stride=lse_stride, q_len=q_len, batch_invariant=batch_invariant,
    )


def _plan(monkeypatch, **kw):
    """The launch plan of :func:`facts_of`'s facts."""
    return mla_launch._Plan(facts_of(monkeypatch, **kw))


def test_a_launch_asking_for_the_lse_keeps_the_gluon_kernel(monkeypatch):
    """``return_lse``: the warp-specialised kernel stores no final LSE, so the launch takes
    mla/gluon.py's kernel, which gets the LSE's pointer, row stride and switch."""
    launch = _plan(monkeypatch, lse_stride=128).launches(4096)[0]  # (Launch checks every parameter is named once)
    assert launch.kernel is mla_launch.mla_gluon_kernel
    assert launch.per_call["lse_ptr"] == "lse" and launch.fixed["stride_lse_b"] == 128
    assert launch.constexprs["STORE_LSE"] is True
    no_lse = _plan(monkeypatch).launches(4096)[0]
    assert no_lse.kernel is mla_launch.mla_gluon_ws_kernel and "lse_ptr" not in no_lse.per_call
    old = _plan(monkeypatch, gluon_ws=False).launches(4096)[0]
    assert old.per_call["lse_ptr"] == "part_lse" and old.constexprs["STORE_LSE"] is False  # (never read)


def test_ws_plan_launches_the_ws_kernel_unless_switched_off(monkeypatch):
    """The plan of a Hopper launch the Gluon kernel serves runs the warp-specialised split (4 warps a
    partition, 168 registers a thread before the partitions' split); ``KVATTN_GLUON_WS=0`` (the
    ``gluon_ws_on`` fact) keeps mla/gluon.py's launch, ``KVATTN_GLUON=0`` the Triton kernel's."""
    split = _plan(monkeypatch).launches(4096)[0]
    assert split.kernel is mla_launch.mla_gluon_ws_kernel
    assert split.options == dict(num_warps=4, maxnreg=168)
    assert _plan(monkeypatch, hq=64, page=128).launches(100)[0].kernel is mla_launch.mla_gluon_ws_kernel
    old = _plan(monkeypatch, gluon_ws=False).launches(4096)[0]
    assert old.kernel is mla_launch.mla_gluon_kernel and old.options == dict(num_warps=8)
    for kw in (dict(gluon=False), dict(page=8), dict(page=48), dict(hq=16, gluon_ws=False)):
        assert _plan(monkeypatch, **kw).launches(4096)[0].kernel is mla_launch.mla_split_kernel, kw
    # 16 heads: the 64-head programs, padded; without the warp-specialised kernel the Triton one
    assert _plan(monkeypatch, hq=16).launches(4096)[0].kernel is mla_launch.mla_gluon_ws_kernel


@pytest.mark.parametrize("hq,q_len,expect", [(128, 1, True), (64, 1, True), (16, 4, True), (32, 1, False),
                                              (16, 1, False)], ids=["hq128", "hq64", "hq16-q4", "hq32", "hq16"])
def test_bfloat16_partials_where_every_row_of_a_program_is_a_head(monkeypatch, hq, q_len, expect):
    """The warp-specialised launches of 64 rows a request or more (heads x query tokens) write
    bfloat16 split partials (a bfloat16 output: the host views the buffer so); fewer rows, other
    kernels and a launch asking for the LSE keep float32 ones."""
    plan = _plan(monkeypatch, hq=hq * q_len, q_len=q_len)
    assert plan.partials16 is expect and plan.launches(4096)[4] is expect
    assert _plan(monkeypatch, hq=hq * q_len, q_len=q_len, gluon_ws=False).launches(4096)[4] is False
    assert _plan(monkeypatch, hq=hq * q_len, q_len=q_len, lse_stride=hq * q_len).launches(4096)[4] is False


@pytest.mark.parametrize("out_dtype,partials16,expect", [
    (torch.bfloat16, True, torch.bfloat16), (torch.float32, True, torch.float32),
    (torch.bfloat16, False, torch.float32)], ids=["bf16-out-partials16", "fp32-out-partials16", "bf16-out-float32"])
def test_launch_hands_bfloat16_partials_only_to_a_bfloat16_output(monkeypatch, out_dtype, partials16, expect):
    """``launch_mla`` passes the split kernel its partial buffer viewed as bfloat16 when the plan
    says ``partials16`` and the output is bfloat16 (the kernel stages them only then); otherwise
    the float32 buffer."""
    seen = []

    class _Plan:
        def launches(self, span):
            split = lambda call: seen.append(call.tensors[5].dtype)  # noqa: E731 (part_o: the sixth tensor)
            return split, (lambda call: None), 4 * 16 * 512, 4 * 16, partials16

    monkeypatch.setattr(mla_launch, "_plan", lambda facts: _Plan())
    query, kv = torch.randn(2, 16, 576).to(torch.bfloat16), torch.randn(8, 64, 576).to(torch.bfloat16)
    table, lens = torch.arange(8, dtype=torch.int32).view(2, 4), torch.tensor([200, 256], dtype=torch.int32)
    mla_launch.launch_mla(query, kv, table, lens, torch.empty(2, 16, 512, dtype=out_dtype), max_seq_len=256)
    assert seen == [expect]


@pytest.mark.parametrize("page", [16, 32, 64, 128], ids=lambda p: f"p{p}")
def test_small_pages_take_the_gluon_kernels_with_a_box_a_page(page, monkeypatch):
    """Pages of 16 and 32 (a 64-key tile over 4 / 2 pages) take the kernels pages of 64+ take: the
    warp-specialised one (bf16 at 128 and at 16 heads, e4m3), mla/kernels_gluon.py's with the LSE
    or ``KVATTN_GLUON_WS=0``, each with the page size as its ``PAGE_SIZE`` and a TMA box of one page
    (pages of 64+: a tile's 64 rows) over the same ``[pages * page, 576]`` view; the balanced split's
    combine counts the Gluon kernels' 64-key tiles whatever the page."""
    box = (min(page, 64), 64)
    for kw, kernel in ((dict(), "mla_gluon_ws_kernel"), (dict(hq=16), "mla_gluon_ws_kernel"),
                       (dict(dtype=FP8_DTYPE), "mla_gluon_ws_kernel"), (dict(lse_stride=128), "mla_gluon_kernel"),
                       (dict(gluon_ws=False), "mla_gluon_kernel"), (dict(gluon=False), "mla_split_kernel")):
        plan = _plan(monkeypatch, page=page, **kw)
        split, combine = plan.launches(4096)[:2]
        assert split.kernel is getattr(mla_launch, kernel), kw
        assert split.constexprs["PAGE_SIZE"] == page, kw
        if kernel == "mla_split_kernel":
            assert not split.descriptors
            continue
        (rows,) = split.descriptors
        assert rows.shape == (100 * page, 576) and rows.block_shape == box, kw
        assert split.constexprs["BLOCK_N"] == 64 and plan.cfg.block_h == 64, kw
        # the balanced split: more splits than the uniform split gives these 4 requests, a ragged batch
        assert plan.balanced(8, 8192), kw
        balanced_split, balanced_combine = plan._split(8, True), plan._combine(8, True)
        assert balanced_split.constexprs["BALANCED"] and balanced_split.constexprs["PAGE_SIZE"] == page, kw
        assert balanced_split.descriptors[0].block_shape == box, kw
        assert balanced_combine.constexprs["BLOCK_N"] == 64, kw


def test_fp8_plan_launches_the_ws_kernel_where_it_fits(monkeypatch):
    """An e4m3 query over an e4m3 cache on sm90 with 64 heads a program: the warp-specialised split
    with a descriptor of 64-byte swizzled byte rows; the Triton kernel (fp8 scores) for everything
    else: ``KVATTN_GLUON_WS=0`` or ``KVATTN_GLUON=0``, a call asking for the LSE, 16 heads (heads in
    N), pages of 8 tokens, a 16-bit query over the fp8 cache."""
    fp8 = dict(dtype=FP8_DTYPE)
    for hq, page in ((128, 64), (64, 128), (20, 256), (128, 16), (64, 32)):
        plan = _plan(monkeypatch, hq=hq, page=page, **fp8)
        launch = plan.launches(4096)[0]  # (fast_launch.Launch checks that every kernel parameter is named once)
        assert plan.fp8_ws and launch.kernel is mla_launch.mla_gluon_ws_kernel
        assert launch.options == dict(num_warps=4, maxnreg=168)
        (rows,) = launch.descriptors
        assert (rows.layout.swizzle_byte_width, rows.layout.element_bitwidth) == (64, 8)
        assert rows.tensor == "kv" and rows.shape == (100 * page, 576) and rows.block_shape == (min(page, 64), 64)
        assert launch.constexprs["PAGE_SIZE"] == page and launch.constexprs["BLOCK_H"] == 64
    (bf16,) = _plan(monkeypatch).launches(4096)[0].descriptors
    assert (bf16.layout.swizzle_byte_width, bf16.layout.element_bitwidth) == (128, 16)
    for kw in (dict(gluon_ws=False), dict(gluon=False), dict(lse_stride=128), dict(page=8),
               dict(q_dtype=torch.bfloat16)):
        plan = _plan(monkeypatch, **fp8, **kw)
        assert not plan.fp8_ws and not plan.ws and not plan.gluon, kw
        assert plan.launches(4096)[0].kernel is mla_launch.mla_split_kernel, kw


@pytest.mark.parametrize("page", [64, 16], ids=lambda p: f"p{p}")
def test_fp8_16_heads_take_the_padded_programs_only_when_they_are_long(page, monkeypatch):
    """fp8 query and cache, 16 heads, 4 requests: a span whose padded programs hold at least 1024 keys
    (PADDED_MIN_KEYS) runs the e4m3 form at 64 rows; a shorter one the table's heads-in-N Triton
    kernel, as does every span without the warp-specialised kernel. 16-bit caches pad every span."""
    from kvattn.runtime import device as _device
    monkeypatch.setattr(_device, "sm_count", lambda device: 132)
    plan = _plan(monkeypatch, hq=16, page=page, dtype=FP8_DTYPE)
    assert plan.fp8_ws and plan.cfg.block_h == 64 and plan.padded_min_keys == 1024
    assert not plan.narrow.ws and plan.narrow.cfg.block_h == 16 and plan.narrow.cfg.heads_as_n
    for span in (1, 300, 4096, 32 * 1024, 33 * 1024 - 1, 33 * 1024, 65536, 200000):
        splits = plan.num_splits(span)
        launch = plan.launches(span)[0]
        if span >= 1024 * splits:
            assert plan.for_span(span) is plan and launch.kernel is mla_launch.mla_gluon_ws_kernel, span
            assert launch.constexprs["BLOCK_H"] == 64
        else:
            assert plan.for_span(span) is plan.narrow and launch.kernel is mla_launch.mla_split_kernel, span
            assert launch.constexprs["BLOCK_H"] == 16 and launch.constexprs["HEADS_AS_N"]
    assert plan.launches(65536)[0].kernel is mla_launch.mla_gluon_ws_kernel  # (33 splits of 1986 keys)
    assert plan.launches(4096)[0].kernel is mla_launch.mla_split_kernel  # (32 splits of 128 keys)
    for kw in (dict(gluon_ws=False), dict(lse_stride=16), dict(q_dtype=torch.bfloat16)):
        other = _plan(monkeypatch, hq=16, page=page, dtype=FP8_DTYPE, **kw)
        assert other.narrow is None and not other.ws and other.launches(65536)[0].kernel is mla_launch.mla_split_kernel
    assert _plan(monkeypatch, hq=16, page=page).narrow is None  # bf16: padded at every span
    # batch-invariant mode: one kernel whatever the span (a request's result may not depend on the
    # batch's longest request): the heads-in-N one
    invariant = _plan(monkeypatch, hq=16, page=page, dtype=FP8_DTYPE, batch_invariant=True)
    assert plan.narrow is not None and invariant.narrow is None and invariant.cfg.heads_as_n
    for span in (300, 4096, 65536, 200000):
        assert invariant.launches(span)[0].kernel is mla_launch.mla_split_kernel, span
    # an H100 (3.35 TB/s over 132 SMs): the heads-in-N kernel it was measured on, at every span
    h100 = _plan(monkeypatch, hq=16, page=page, dtype=FP8_DTYPE, bandwidth=3.35e12)
    assert h100.narrow is None and not h100.ws and h100.launches(65536)[0].kernel is mla_launch.mla_split_kernel


def test_ws_fp8_fits_only_byte_rows_tma_can_address():
    """The e4m3 form's launch rule: fp8 query and cache, the fp8-score entry at 64 heads in M with
    64-key tiles and 8 warps (overrides of those keep the Triton kernel), pages of a multiple of 64
    tokens or of 16 or 32, a 16-byte aligned base and row stride, pages back to back, rows below 2^31."""
    def fits(hq=128, page=64, q_dtype=FP8_DTYPE, kv_dtype=FP8_DTYPE, *, pages=100, row_stride=576, aligned16=True,
             **fields):
        with mla_configs.override(**fields):
            cfg = mla_configs.config("sm90", "fp8", hq, q_dtype == FP8_DTYPE)
        return mla_launch._ws_fp8_fits(cfg, q_dtype, kv_dtype, (pages, page, 576), (page * row_stride, row_stride, 1),
                                       aligned16)

    assert fits() and fits(hq=64) and fits(hq=20) and fits(page=128) and fits(page=256) and fits(row_stride=592)
    assert not fits(hq=16)  # heads in N
    assert not fits(q_dtype=torch.bfloat16)  # a 16-bit query: no fp8 scores
    assert fits(page=16) and fits(page=32) and fits(hq=20, page=16)  # a 64-key tile over 4 / 2 pages
    assert not fits(page=8) and not fits(page=48) and not fits(page=1)  # 8 boxes a tile / a tile across pages
    assert not fits(aligned16=False) and not fits(row_stride=584)  # TMA: 16-byte base and row stride
    assert not fits(block_n=32) and not fits(num_warps=4) and not fits(heads_as_n=True)
    assert not fits(pages=2**25)  # rows past 2^31: int32 TMA coordinates


class _Stop(Exception):
    pass


@pytest.mark.parametrize("raw,want", [(None, True), ("1", True), ("0", False)], ids=["unset", "on", "off"])
def test_ws_switch_reaches_the_plan_facts(raw, want, monkeypatch):
    """``KVATTN_GLUON_WS`` is read on every call into the plan's ``gluon_ws_on`` fact (plans are
    cached under their facts, so switching it picks another plan)."""
    if raw is None:
        monkeypatch.delenv("KVATTN_GLUON_WS", raising=False)
    else:
        monkeypatch.setenv("KVATTN_GLUON_WS", raw)
    seen = []

    def record(facts):
        seen.append(facts)
        raise _Stop

    monkeypatch.setattr(mla_launch, "_plan", record)
    q = torch.zeros(2, 64, 576, dtype=torch.float16)
    kv = torch.zeros(4, 64, 576, dtype=torch.float16)
    with pytest.raises(_Stop):
        mla_launch.launch_mla(q, kv, torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                              torch.empty(2, 64, 512, dtype=torch.float16), max_seq_len=128)
    assert seen[0].gluon_ws_on is want


def test_tune_mla_variants_reach_the_ws_launch(monkeypatch):
    """``benchmarks/tune_mla.py``'s ``ws_*`` variants launch a timing floor (a patched copy of the
    kernel's source, ``benchmarks/mla_ws_floors.py``) in place of the library's kernel, only
    inside the variant, with the same options; ``gluon`` switches the kernel off."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    from benchmarks import mla_ws_floors, tune_mla, tuning

    contexts = {}

    def collect(grid, args, context_for, *, workspace_mib):
        shape = next(iter(grid))
        contexts.update((name, context_for(shape, name)) for name in tune_mla.VARIANTS)

    monkeypatch.setattr(tuning, "time_variants", collect)
    assert tune_mla.main([]) == 0
    base = dict(num_warps=4, maxnreg=168)
    library = mla_launch.mla_gluon_ws_kernel
    for name, floor in (("default", None), ("ws_nocopies", "nocopies"), ("ws_nopv", "nopv"),
                        ("ws_noscores", "noscores"), ("ws_noconvert", "noconvert")):
        with contexts[name]():
            split = _plan(monkeypatch).launches(4096)[0]
            want = library if floor is None else mla_ws_floors.floor_kernel(floor)
            assert split.kernel is want and split.options == base, name
            assert floor is None or want is not library
    assert mla_launch.mla_gluon_ws_kernel is library
    with contexts["gluon"]():
        from kvattn.runtime import env as _env
        assert not _env.gluon_ws()


def test_tune_mla_fp8_variants_put_the_e4m3_form_at_16_heads(monkeypatch):
    """``fp8ws`` runs the warp-specialised kernel's e4m3 form at every span of 16 fp8 heads (the
    table: only where its programs are long, the heads-in-N Triton kernel for short ones), and
    ``fp8ws_noconvert`` that form's no-conversion floor."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    from benchmarks import mla_ws_floors, tune_mla, tuning

    contexts = {}

    def collect(grid, args, context_for, *, workspace_mib):
        shape = next(iter(grid))
        contexts.update((name, context_for(shape, name)) for name in ("default", "fp8ws", "fp8ws_noconvert"))

    monkeypatch.setattr(tuning, "time_variants", collect)
    assert tune_mla.main([]) == 0
    fp8 = dict(hq=16, dtype=FP8_DTYPE)
    with contexts["default"]():
        assert _plan(monkeypatch, **fp8).launches(300)[0].kernel is not mla_launch.mla_gluon_ws_kernel
        assert _plan(monkeypatch, **fp8).launches(8192)[0].kernel is mla_launch.mla_gluon_ws_kernel
    with contexts["fp8ws"]():
        assert _plan(monkeypatch, **fp8).launches(300)[0].kernel is mla_launch.mla_gluon_ws_kernel
        assert _plan(monkeypatch, **fp8).launches(8192)[0].kernel is mla_launch.mla_gluon_ws_kernel
    with contexts["fp8ws_noconvert"]():
        assert _plan(monkeypatch, **fp8).launches(8192)[0].kernel is mla_ws_floors.floor_kernel("noconvert")


def test_tune_mla_times_the_sweeps_small_page_rows(monkeypatch):
    """``tune_mla.py --sweep`` takes the sweep's MLA rows (the registry's have pages of 64 only), so
    a floor is timed over pages of 16: sw77 (128 heads, bf16, pages of 16) reaches the variants,
    and ``ws_nocopies`` puts the floor in the warp-specialised kernel's place at pages of 16."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[3]))
    from benchmarks import mla_ws_floors, tune_mla, tuning

    seen = []

    def collect(grid, args, context_for, *, workspace_mib):
        seen.extend(s for s in grid if any(f in s.id for f in args.filter))
        with context_for(seen[0], "ws_nocopies")():
            seen.append(_plan(monkeypatch, page=16).launches(4096)[0])

    monkeypatch.setattr(tuning, "time_variants", collect)
    assert tune_mla.main(["--sweep", "--filter", "sw77", "--variants", "default,ws_nocopies"]) == 0
    shape, launch = seen
    assert shape.id.startswith("sw77 mla bf16 Hq128") and shape.page_size == 16 and shape.num_qo_heads == 128
    assert launch.kernel is mla_ws_floors.floor_kernel("nocopies")

@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_DTYPE], ids=["bf16", "fp8"])
@pytest.mark.parametrize("q_len,hq", [(4, 16), (2, 16), (2, 64)], ids=["Q4-Hq16", "Q2-Hq16", "Q2-Hq64"])
def test_mtp_rows_fill_the_ws_kernels_tile(q_len, hq, dtype, monkeypatch):
    """Multi-token prediction folds (token, head) into the rows: 16 heads x 4 tokens take the
    warp-specialised kernel's 64-row programs as 64 heads do (x 2 tokens: 32 rows, padded), with
    the token count as its ``Q_LEN``; one token of 16 heads takes them too over a 16-bit cache (padded
    heads), and over an fp8 one where the programs hold 1024 keys or more (2 splits of 2048 keys on
    the faked 8 SMs; the Triton kernel's fp8 scores, heads in N, for 150-key ones)."""
    plan = _plan(monkeypatch, hq=q_len * hq, q_len=q_len, dtype=dtype)
    launch = plan.launches(4096)[0]
    assert launch.kernel is mla_launch.mla_gluon_ws_kernel and plan.cfg.block_h == 64
    assert launch.constexprs["Q_LEN"] == q_len and launch.fixed["num_heads"] == q_len * hq
    one_token = _plan(monkeypatch, hq=16, dtype=dtype)
    assert one_token.launches(4096)[0].kernel is mla_launch.mla_gluon_ws_kernel
    assert (one_token.launches(300)[0].kernel is mla_launch.mla_gluon_ws_kernel) is (dtype == torch.bfloat16)
    # A call asking for the LSE: mla/gluon.py's kernel (16-bit, 64 rows and more) or the Triton kernel.
    lse = _plan(monkeypatch, hq=q_len * hq, q_len=q_len, lse_stride=q_len * hq, dtype=dtype).launches(4096)[0]
    gluon = dtype == torch.bfloat16 and q_len * hq >= 64
    assert (lse.kernel is mla_launch.mla_gluon_kernel) is gluon
    assert lse.constexprs["Q_LEN"] == q_len
