"""Triton MLA decode (``xqa_batch_decode_with_kv_cache_mla``) against the oracles.

Every case draws a fresh latent cache ``[P, page, 576]`` (permuted pages, NaN in every slot no
request uses, wild page ids past each request's last page), poisons the output, runs the Triton
path and the reference backend and compares both with the float64 dense formulation; the
tolerance is scaled to the reference's own error (``test_decode.assert_matches``).

The public function takes bfloat16 / fp8 only, and Triton's interpreter has no bfloat16
arithmetic: on a CPU machine the ``interp`` cases call the ops entry (``kvattn.ops.mla.op``) with
float16 tensors on small shapes (the kernel is dtype-generic); a GPU runs the public function on
the whole grid.
"""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn import reference
from kvattn._inputs import MIN_WORKSPACE_BYTES, PagedKV, Scale
from kvattn.formats import FP8_DTYPE
from kvattn.ops.mla import configs as mla_configs
from kvattn.ops.mla import op as mla_op
from kvattn.runtime.workspace import COUNTER_BYTES
from kvattn.testing import make_paged_kv, poison_, relative_error

from ..compiled import assert_close_to_eager, compile_backend, eager_and_compiled
from ..oracle import GPU_ONLY, ON_GPU, assert_matches, cpu, dense, run_both

DIM, V_DIM = 576, 512
BMM1 = 1.5 / 192**0.5


def make_cache(lens, *, page, kv_format, device, seed, pages_per_seq=None, extra_pages=1):
    """``(cache [P, page, 576], tables, seq_lens)``: make_paged_kv's one-plane, one-head cache."""
    case = make_paged_kv(lens, num_kv_heads=1, head_dim=DIM, page_size=page, kv_format=kv_format, form="shared",
                         device=device, seed=seed, pages_per_seq=pages_per_seq, extra_pages=extra_pages)
    return case.kv_cache[:, 0, :, 0], case.block_tables, case.seq_lens  # [P, 1, page, 1, 576] -> [P, page, 576]


def scales(device, tensor_scales, kv_format):
    bmm1, bmm2 = (BMM1 * 0.7, 1.3) if kv_format == "fp8" else (BMM1, 0.9)
    if tensor_scales:
        bmm1, bmm2 = (torch.tensor([x], dtype=torch.float32, device=device) for x in (bmm1, bmm2))
    return bmm1, bmm2


def exact_mla(q, cache, tables, seq_lens, bmm1, bmm2):
    if int(seq_lens.max()) == 0:  # (the dense oracle needs a key somewhere)
        return torch.zeros(q.shape[0], q.shape[2], V_DIM, dtype=torch.float64)
    return dense.mla(cpu(q), cpu(cache), cpu(tables), cpu(seq_lens), bmm1_scale=cpu(bmm1), bmm2_scale=cpu(bmm2))


def check_empty_rows(out, lens):
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b].float() == 0).all(), f"empty request {b}: rows not zero"


# ---------------------------------------------------------------------------------------------
# GPU: the public function
# ---------------------------------------------------------------------------------------------
def mla_case(device, monkeypatch, *, lens, hq=16, page=64, kv_format="bfloat16", q_format=None,
             tensor_scales=False, four_d=False, ws_bytes=64 << 20, max_seq_len=None, give_out=True, gluon=True,
             seed=0, q_cols=DIM, q_col0=0):
    if not gluon:
        monkeypatch.setenv("KVATTN_GLUON", "0")
    cache, tables, seq_lens = make_cache(lens, page=page, kv_format=kv_format, device=device, seed=seed)
    q_dtype = {"bfloat16": torch.bfloat16, "fp8": FP8_DTYPE}[q_format or kv_format]
    g = torch.Generator().manual_seed(100 + seed)
    # q_cols / q_col0: the query as columns [q_col0, q_col0 + DIM) of wider rows (odd strides, an
    # offset base: what the Gluon kernels' staging cannot take, see plan.gluon_aligned)
    q = torch.randn(len(lens), 1, hq, q_cols, generator=g).to(device=device, dtype=q_dtype)[..., q_col0:q_col0 + DIM]
    bmm1, bmm2 = scales(device, tensor_scales, kv_format)
    kv_cache = cache.unsqueeze(1) if four_d else cache
    capacity = tables.shape[1] * page
    max_len = max(max(lens), 1) if max_seq_len is None else (capacity if max_seq_len == "capacity" else max_seq_len)

    def call():
        out = poison_(torch.empty(len(lens), hq, V_DIM, dtype=torch.bfloat16, device=device)) if give_out else None
        ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)
        got = kvattn.mla.xqa_batch_decode_with_kv_cache_mla(
            q, kv_cache, ws, 128, V_DIM, 64, tables, seq_lens, max_len, out=out, bmm1_scale=bmm1, bmm2_scale=bmm2)
        assert out is None or got is out
        assert got.shape == (len(lens), hq, V_DIM) and got.dtype == torch.bfloat16
        return got

    out, ref_out = run_both(call, monkeypatch)
    assert_matches(out, ref_out, exact_mla(q[:, 0].unsqueeze(1), cache, tables, seq_lens, bmm1, bmm2))
    check_empty_rows(out, lens)
    return out


def param(id, **kw):
    return pytest.param(kw, id=id, marks=GPU_ONLY)


GPU_LENS = [1, 37, 0, 300, 1029, 2048]  # one key, not a page/tile multiple, empty, several tiles
GPU_CASES = [
    *[param(f"{fmt}-Hq{hq}-p{page}", lens=GPU_LENS, hq=hq, page=page, kv_format=fmt, seed=hq + page)
      for fmt in ("bfloat16", "fp8") for hq in (8, 16, 20, 32, 64, 128) for page in (16, 32, 64)],
    *[param(f"{fmt}-Hq{hq}-tensor-scales", lens=GPU_LENS, hq=hq, kv_format=fmt, tensor_scales=True, seed=hq)
      for fmt in ("bfloat16", "fp8") for hq in (16, 128)],
    param("bf16-q-fp8-cache", lens=GPU_LENS, hq=16, kv_format="fp8", q_format="bfloat16"),
    # float16 operands at BLOCK_H 32 (an fp8 query with an fp8 cache takes fp8 scores at BLOCK_H 64)
    param("bf16-q-fp8-cache-Hq128", lens=GPU_LENS, hq=128, kv_format="fp8", q_format="bfloat16", seed=11),
    param("fp8-q-bf16-cache", lens=GPU_LENS, hq=64, kv_format="bfloat16", q_format="fp8"),
    param("bf16-4d-cache-out-allocated", lens=GPU_LENS, hq=128, four_d=True, give_out=False),
    param("bf16-Hq128-long-split", lens=[16384, 5, 9000], hq=128, seed=5),
    param("bf16-Hq16-long-split-B1", lens=[30000], hq=16, seed=6),
    param("fp8-Hq128-ragged", lens=[1, 5000, 17, 12000, 0, 333], hq=128, kv_format="fp8", seed=7),
    param("bf16-Hq16-tiny-workspace-no-split", lens=[20000, 3], hq=16, ws_bytes=MIN_WORKSPACE_BYTES),
    param("bf16-Hq128-workspace-two-splits", lens=[8000, 700], hq=128,
          ws_bytes=COUNTER_BYTES + 2 * 2 * 128 * 513 * 4 + 64),
    param("bf16-max_seq_len-capacity", lens=[100, 30, 0], hq=32, max_seq_len="capacity"),
    param("bf16-all-empty", lens=[0, 0, 0], hq=16, max_seq_len="capacity"),
    param("bf16-page128", lens=[1, 129, 1000], hq=16, page=128),
    # a query view the Gluon kernels' cp.async staging cannot take: odd row strides, an offset base
    *[param(f"{fmt}-Hq{hq}-query-{name}", lens=GPU_LENS, hq=hq, kv_format=fmt, q_cols=cols, q_col0=col0, seed=hq + 2)
      for fmt in ("bfloat16", "fp8") for hq in (16, 128)
      for name, cols, col0 in (("odd-strides", DIM + 1, 0), ("offset-base", DIM + 16, 1))],
    # 16-bit caches on Hopper take the warp-specialised Gluon kernel (Hq < 64 in padded 64-head
    # programs) on pages of 64+ tokens (tiles at offsets 0 / 64 / ... of a page) and, in the grid
    # above, of 16 and 32 (a tile over 4 / 2 pages); test_gluon_ws.py has its own grid (with a spy
    # on the kernel), and the other Gluon kernel under KVATTN_GLUON_WS=0; the Triton kernel for the
    # same launches:
    *[param(f"bf16-Hq128-p{page}", lens=GPU_LENS, hq=128, page=page, seed=page) for page in (128, 256)],
    param("bf16-Hq96-padded-heads", lens=GPU_LENS, hq=96, seed=96),
    *[param(f"bf16-Hq{hq}-triton-kernel", lens=GPU_LENS, hq=hq, gluon=False, seed=hq + 1) for hq in (64, 128)],
    # fp8 scores on pages of 128 / 256 tokens and padded heads (the warp-specialised kernel's e4m3
    # form on Hopper; test_gluon_ws.py has its own grid), and the Triton kernel's fp8 scores for the
    # same launches (KVATTN_GLUON=0; KVATTN_GLUON_WS=0 too):
    *[param(f"fp8-Hq128-p{page}", lens=GPU_LENS, hq=128, page=page, kv_format="fp8", seed=page + 1) for page in (128, 256)],
    param("fp8-Hq96-padded-heads", lens=GPU_LENS, hq=96, kv_format="fp8", seed=97),
    *[param(f"fp8-Hq{hq}-triton-kernel", lens=GPU_LENS, hq=hq, kv_format="fp8", gluon=False, seed=hq + 3)
      for hq in (64, 128)],
    param("fp8-Hq128-long-split-triton-kernel", lens=[16384, 5, 9000], hq=128, kv_format="fp8", gluon=False, seed=8),
    param("bf16-Hq128-long-split-triton-kernel", lens=[16384, 5, 9000], hq=128, gluon=False, seed=5),
]


@pytest.mark.parametrize("kw", GPU_CASES)
def test_mla_matches_oracles(kw, kernel_device, triton_backend, monkeypatch):
    mla_case(kernel_device, monkeypatch, **kw)


@pytest.mark.skipif(not ON_GPU, reason="GPU grid")
@pytest.mark.parametrize("hq", [16, 128], ids=["Hq16", "Hq128"])
def test_mla_many_splits_combine_exactly(hq, kernel_device, triton_backend, monkeypatch):
    """Short splits force many partials per request (ragged: some requests need one)."""
    with mla_configs.override(min_chunk=32, waves=16):
        mla_case(kernel_device, monkeypatch, lens=[1500, 3, 0, 970, 64, 2049], hq=hq, seed=hq)


# ---------------------------------------------------------------------------------------------
# both tiers: the ops entry on float16 (the interpreter's 16-bit type) or the GPU
# ---------------------------------------------------------------------------------------------
def ops_case(device, *, lens, hq, page, tensor_scales=False, ws_bytes=1 << 20, max_seq_len=None, seed=0,
             uint32=False):
    """Run ``kvattn.ops.mla.op.mla_decode`` on float16 tensors; compare with the reference and dense."""
    cache, tables, seq_lens = make_cache(lens, page=page, kv_format="float16", device=device, seed=seed)
    g = torch.Generator().manual_seed(100 + seed)
    q = torch.randn(len(lens), hq, DIM, generator=g).to(device=device, dtype=torch.float16)
    bmm1, bmm2 = scales(device, tensor_scales, "float16")
    pages = cache.unsqueeze(2)  # [P, page, 1, 576], as the public function builds it
    kv = PagedKV(pages, pages, tables, tables, DIM, V_DIM)
    lens_arg = seq_lens.to(torch.uint32) if uint32 else seq_lens
    to_scale = (lambda x: Scale(1.0, x)) if tensor_scales else (lambda x: Scale(float(x)))
    max_len = max(max(lens), 1) if max_seq_len is None else max_seq_len
    out = poison_(torch.empty(len(lens), hq, V_DIM, dtype=torch.float16, device=device))
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)
    mla_op.mla_decode(q, kv, lens_arg, out=out, workspace=ws, max_seq_len=max_len, logit_scale=to_scale(bmm1),
                              out_scale=to_scale(bmm2))
    ref_out = torch.empty_like(out)
    reference.mla_decode(q, kv, seq_lens, ref_out, logit_scale=to_scale(bmm1), out_scale=to_scale(bmm2))
    assert_matches(out, ref_out, exact_mla(q.unsqueeze(1), cache, tables, seq_lens, bmm1, bmm2))
    check_empty_rows(out, lens)
    return out


SMALL = [1, 37, 0, 70]  # one key, not a page multiple, an empty slot, several pages and tiles
OPS_CASES = [
    pytest.param(dict(lens=SMALL, hq=16, page=16), id="Hq16-p16"),
    pytest.param(dict(lens=SMALL, hq=8, page=32, tensor_scales=True, uint32=True), id="Hq8-p32-tensor-scales-uint32"),
    pytest.param(dict(lens=[5, 50], hq=20, page=64), id="Hq20-p64-two-head-blocks"),
    pytest.param(dict(lens=[33, 0], hq=64, page=16, max_seq_len=48), id="Hq64-p16"),
]


@pytest.mark.parametrize("kw", OPS_CASES)
def test_mla_ops_entry_float16(kw, kernel_device):
    ops_case(kernel_device, **kw)


# BLOCK_H 64 over few heads (rows past Hq padded and masked), as fp8 scores take it at any Hq:
# small tiles so the loop runs many tiles, a length that ends inside a tile, one key, an empty request.
@pytest.mark.parametrize("fields", [
    pytest.param(dict(block_h=64, split_scores=False), id="BLOCK_H64-Hq16-chained"),
    pytest.param(dict(block_h=64, split_scores=True), id="BLOCK_H64-Hq16-split-scores"),
    pytest.param(dict(block_h=64, split_scores=True, min_chunk=16, waves=64), id="BLOCK_H64-Hq16-split-scores-splits"),
])
def test_mla_padded_head_block(fields, kernel_device):
    lens = [1, 37, 0, 70] if not ON_GPU else [1, 37, 0, 70, 1029, 2048]
    with mla_configs.override(**({"block_n": 16} if not ON_GPU else {}), **fields):
        ops_case(kernel_device, lens=lens, hq=16, page=16, seed=21)


# Heads in the N dim (S^T = K Q^T, O^T = V^T P^T): the transposed softmax bookkeeping, padded
# heads (Hq 8 / 20), a split launch, many tiles (small tiles on the CPU).
@pytest.mark.parametrize("fields", [
    pytest.param(dict(heads_as_n=True), id="heads-as-N"),
    pytest.param(dict(heads_as_n=True, min_chunk=16, waves=64), id="heads-as-N-splits"),
    pytest.param(dict(heads_as_n=True, split_scores=True), id="heads-as-N-split-scores"),
])
@pytest.mark.parametrize("hq", [8, 16, 20], ids=lambda h: f"Hq{h}")
def test_mla_heads_as_n(fields, hq, kernel_device):
    lens = [1, 37, 0, 70] if not ON_GPU else [1, 37, 0, 70, 1029, 2048]
    tiles = {"block_n": 16} if not ON_GPU else {"block_n": 64, "num_warps": 4, "num_stages": 2}
    with mla_configs.override(**tiles, **fields):
        ops_case(kernel_device, lens=lens, hq=hq, page=16, seed=40 + hq)


@pytest.mark.skipif(not ON_GPU, reason="GPU grid")
@pytest.mark.parametrize("fields", [
    pytest.param(dict(heads_as_n=True, block_n=64, num_warps=4, num_stages=2), id="hn-bf16-64w4s2"),
    pytest.param(dict(heads_as_n=True, block_n=64, num_warps=8, num_stages=2), id="hn-bf16-64w8s2"),
    pytest.param(dict(heads_as_n=True, split_scores=True, block_n=64, num_warps=8, num_stages=2),
                 id="hn-bf16-64w8s2-split-scores"),
])
@pytest.mark.parametrize("hq", [8, 16, 32], ids=lambda h: f"Hq{h}")
def test_mla_heads_as_n_bf16(fields, hq, kernel_device, triton_backend, monkeypatch):
    with mla_configs.override(**fields):
        mla_case(kernel_device, monkeypatch, lens=GPU_LENS, hq=hq, seed=50 + hq)


@pytest.mark.skipif(not ON_GPU, reason="fp8 tensor cores")
@pytest.mark.parametrize("fields", [
    pytest.param(dict(qk_fp8=True, heads_as_n=True, block_h=16, block_n=64, num_warps=8, num_stages=3),
                 id="fp8hn16"),
    pytest.param(dict(qk_fp8=True, heads_as_n=True, block_h=16, block_n=64, num_warps=8, num_stages=3,
                      split_scores=False), id="fp8hn16-chained"),
    pytest.param(dict(qk_fp8=True, heads_as_n=True, block_h=32, block_n=64, num_warps=8, num_stages=2),
                 id="fp8hn32"),
])
@pytest.mark.parametrize("hq", [8, 16, 20, 32], ids=lambda h: f"Hq{h}")
def test_mla_fp8_scores_heads_as_n(fields, hq, kernel_device, triton_backend, monkeypatch):
    """fp8 query + fp8 cache, fp8 scores with the keys in M (the table's tiles at BLOCK_H 16, and
    BLOCK_H 32); Hq 20 / 32 run two head blocks at BLOCK_H 16, Hq 8 / 20 pad their last block."""
    with mla_configs.override(**fields):
        mla_case(kernel_device, monkeypatch, lens=GPU_LENS, hq=hq, kv_format="fp8", seed=60 + hq)


@pytest.mark.skipif(not ON_GPU, reason="fp8 tensor cores")
@pytest.mark.parametrize("fields,gluon", [
    pytest.param(dict(qk_fp8=True, block_h=64, block_n=64, num_stages=3), False, id="fp8qk64-triton"),
    pytest.param(dict(qk_fp8=True, block_h=64, block_n=64, num_stages=3), True, id="fp8qk64-ws"),
    pytest.param(dict(qk_fp8=True, block_h=64, block_n=32, num_stages=3, split_scores=False), True,
                 id="fp8qk64n32-chained"),
])
@pytest.mark.parametrize("hq", [8, 16, 20, 128], ids=lambda h: f"Hq{h}")
def test_mla_fp8_scores_at_any_head_count(fields, gluon, hq, kernel_device, triton_backend, monkeypatch):
    """fp8 query + fp8 cache on fp8 scores at BLOCK_H 64 whatever Hq (the table's tiles and the
    other tune variant), on the Triton kernel and (Hopper, 64-key tiles) the warp-specialised
    kernel's e4m3 form; Hq 128 runs two head blocks."""
    with mla_configs.override(**fields):
        mla_case(kernel_device, monkeypatch, lens=GPU_LENS, hq=hq, kv_format="fp8", gluon=gluon, seed=30 + hq)


def test_mla_fp8_score_block_h_rule():
    """sm90 takes fp8 scores at any Hq: BLOCK_H 16 with heads in N up to 16 heads, BLOCK_H 64 (heads
    in M, rows past Hq padded) above; the float16-operand fp8 path and 16-bit caches keep the head
    count rounded up in [16, cap]."""
    for hq in (1, 8, 16, 20, 64, 128):
        cfg = mla_configs.config("sm90", "fp8", hq, True)
        assert cfg.qk_fp8 and (cfg.block_h, cfg.heads_as_n) == ((16, True) if hq <= 16 else (64, False))
        assert mla_configs.config("sm90", "fp8", hq, False).block_h == min(max(16, 1 << (hq - 1).bit_length()), 32)
        assert not mla_configs.config("sm90", "bfloat16", hq, True).qk_fp8
        assert not mla_configs.config("sm90", "bfloat16", hq).heads_as_n
        # the split score products where the products run on wgmma: BLOCK_H 64, and fp8 scores
        assert cfg.split_scores
        assert mla_configs.config("sm90", "bfloat16", hq).split_scores is (hq > 32)
        assert not mla_configs.config("sm90", "fp8", hq, False).split_scores


def _fits(hq=128, page=64, kv_dtype=torch.bfloat16, q_dtype=None, *, pages=100, row_stride=576, aligned16=True,
          **fields):
    from kvattn.ops.mla import plan as mla_launch
    kv_format = {torch.bfloat16: "bfloat16", torch.float16: "float16", FP8_DTYPE: "fp8"}[kv_dtype]
    q_dtype = q_dtype or kv_dtype
    with mla_configs.override(**fields):
        cfg = mla_configs.config("sm90", kv_format, hq, q_dtype == FP8_DTYPE)
    return mla_launch._gluon_fits(cfg, kv_format, q_dtype, kv_dtype, (pages, page, 576),
                                  (page * row_stride, row_stride, 1), aligned16)


def test_mla_gluon_kernel_takes_only_the_launches_it_serves():
    """The Gluon kernels (sm90) run 16-bit caches with a query of the same dtype, 64 heads a
    program, 64-key tiles inside pages of a multiple of 64 tokens or over whole pages of 16 or 32
    (one TMA box a page), rows TMA can address; every other launch keeps the Triton kernel (which
    the GPU cases then run too)."""
    assert _fits() and _fits(hq=64) and _fits(hq=96) and _fits(page=128) and _fits(page=256)
    assert _fits(kv_dtype=torch.float16) and _fits(row_stride=640)
    assert not _fits(hq=32) and not _fits(hq=16)  # BLOCK_H 32 / 16: mma.sync tables
    assert _fits(page=16) and _fits(page=32) and _fits(hq=64, page=16, row_stride=640)  # a tile over 4 / 2 pages
    for page in (1, 8, 48, 96):  # more boxes a tile than the copies afford, or a tile across a page's end
        assert not _fits(page=page), page
    assert not _fits(page=16, pages=2**27)  # rows past 2^31 at any page size
    assert not _fits(kv_dtype=FP8_DTYPE) and not _fits(kv_dtype=FP8_DTYPE, q_dtype=torch.bfloat16)
    assert not _fits(q_dtype=FP8_DTYPE)  # fp8 query over a 16-bit cache: the operand types differ
    assert not _fits(aligned16=False) and not _fits(row_stride=580)  # TMA: 16-byte base and row stride
    assert not _fits(block_n=32) and not _fits(num_warps=4)  # overrides (tuning, tests) keep Triton
    assert not _fits(pages=2**25)  # rows past 2^31: int32 TMA coordinates


def test_mla_gluon_kernels_need_a_query_triton_proves_aligned():
    """The Gluon kernels stage the query by 16-byte ``cp.async`` copies, whose width Triton takes
    from the arguments' specialisation: a base and every stride it cannot prove 16-byte aligned
    (a multiple of 16 elements) would not compile, so such a query takes the Triton kernel."""
    from kvattn.ops.mla.plan import gluon_aligned
    kv = torch.empty(4, 64, 576, dtype=torch.bfloat16)
    wide = torch.empty(3, 16, 608, dtype=torch.bfloat16)
    assert gluon_aligned(torch.empty(3, 16, 576, dtype=torch.bfloat16), kv)
    assert gluon_aligned(wide[..., :576], kv) and gluon_aligned(torch.empty(3, 16, 576, dtype=FP8_DTYPE), kv)
    assert not gluon_aligned(torch.empty(3, 16, 577, dtype=torch.bfloat16)[..., :576], kv)  # odd strides
    assert not gluon_aligned(torch.empty(3, 16, 584, dtype=torch.bfloat16)[..., :576], kv)  # 16 B, not 16 elements
    assert not gluon_aligned(wide[..., 1:577], kv)  # an offset base
    assert not gluon_aligned(torch.empty(3, 16, 576, dtype=torch.bfloat16), kv.view(-1)[1:])  # the cache's base


def test_mla_split_partials_combine_exactly(kernel_device):
    """Several splits a request (the combine merges their LSEs), and a workspace too small for
    them (one split, nothing allocated beyond it)."""
    lens = [150, 3, 0, 97] if not ON_GPU else [1500, 3, 0, 970, 2049]
    with mla_configs.override(min_chunk=16, waves=64):
        ops_case(kernel_device, lens=lens, hq=16, page=16, seed=3)
        ops_case(kernel_device, lens=lens, hq=16, page=16, seed=4, ws_bytes=16)


def test_mla_launch_sizes_come_from_host_bounds():
    """Split counts: whole waves, capped by the keys (min_chunk), the workspace and max_splits."""
    cfg = mla_configs.MLAConfig(64, 32, 8, 2, 1)
    assert mla_configs.num_splits(cfg, items=2 * 64, span=4096, sm_count=132, fit=64) == 1
    assert mla_configs.num_splits(cfg, items=2 * 32, span=16384, sm_count=132, fit=64) == 2
    assert mla_configs.num_splits(cfg, items=1, span=16384, sm_count=132, fit=64) == 64
    assert mla_configs.num_splits(cfg, items=1, span=16384, sm_count=132, fit=5) == 5
    assert mla_configs.num_splits(cfg, items=1, span=300, sm_count=132, fit=64) == 2
    assert mla_configs.num_splits(cfg, items=1, span=16384, sm_count=132, fit=0) == 1
    for hq, bh in ((8, 16), (16, 16), (20, 32), (64, 64), (128, 64)):
        assert mla_configs.config("sm90", "bfloat16", hq).block_h == bh
    assert mla_configs.config("sm90", "fp8", 128).block_h == 32
    # fp8 scores: an fp8 query with an fp8 cache, on sm90's BLOCK_H 64 (wgmma) only
    qk = mla_configs.config("sm90", "fp8", 128, True)
    assert qk.qk_fp8 and qk.block_h == 64
    assert mla_configs.config("sm90", "fp8", 64, True).qk_fp8
    assert mla_configs.config("sm90", "fp8", 16, True).qk_fp8  # BLOCK_H 16, heads in N
    assert not mla_configs.config("sm90", "bfloat16", 128, True).qk_fp8
    assert not mla_configs.config("default", "fp8", 128, True).qk_fp8
    assert not mla_configs.config("interpreter", "fp8", 128, True).qk_fp8
    for arch, table in mla_configs.TABLES.items():
        for fmt in ("bfloat16", "fp8"):
            for q_fp8 in (False, True):
                for hq in (1, 8, 16, 20, 32, 64, 128, 1000):
                    cfg = mla_configs.config(arch, fmt, hq, q_fp8)
                    assert ("fp8qk" if cfg.qk_fp8 else mla_configs._fmt(fmt), cfg.block_h) in table


# ---------------------------------------------------------------------------------------------
# CUDA graphs and torch.compile
# ---------------------------------------------------------------------------------------------
POOL_PAGES = 300


def graph_replay_case(hq, first_lens, replays, *, pool=POOL_PAGES, kv_format="bfloat16", page=64):
    """Capture one call (``page``-token pages, 6400 tokens of table a request, a logit scale
    tensor; a bf16 query and cache, or with ``kv_format="fp8"`` an e4m3 query and cache) on
    ``first_lens`` in a CUDA graph, then for each ``(seed, lens, factor)`` of ``replays``: new cache
    rows, tables and lengths (as many requests), a fresh query, the scale times ``factor``, a
    poisoned output; replay and compare with the exact result (empty requests: zero rows).
    ``pool`` counts pages of 64 tokens (pages of 16 or 32: as many tokens)."""
    device = torch.device("cuda")
    width = 6400 // page
    pool = pool * 64 // page
    q_dtype = {"bfloat16": torch.bfloat16, "fp8": FP8_DTYPE}[kv_format]

    def case(lens, seed):
        used = sum((n + page - 1) // page for n in lens)
        return make_cache(lens, page=page, kv_format=kv_format, device=device, seed=seed, pages_per_seq=width,
                          extra_pages=pool - used)

    cache, tables, seq_lens = case(first_lens, seed=1)
    q = torch.randn(len(first_lens), 1, hq, DIM, device=device).to(q_dtype)
    out = torch.empty(len(first_lens), hq, V_DIM, device=device, dtype=torch.bfloat16)
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device=device)
    scale = torch.tensor([BMM1], device=device)

    def call():
        kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, V_DIM, 64, tables, seq_lens,
                                                      width * page, out=out, bmm1_scale=scale, bmm2_scale=1.1)

    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for seed, lens, factor in replays:
        new_cache, new_tables, new_lens = case(lens, seed=seed)
        cache.copy_(new_cache)
        tables.copy_(new_tables)
        seq_lens.copy_(new_lens)
        q.copy_(torch.randn(q.shape, device=device).to(q_dtype))
        scale.fill_(BMM1 * factor)
        poison_(out)
        graph.replay()
        torch.cuda.synchronize()
        exact = exact_mla(q, cache, tables, seq_lens, BMM1 * factor, 1.1)
        assert relative_error(out.cpu(), exact) <= 1e-2
        check_empty_rows(out, lens)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("hq", [16, 128], ids=["Hq16", "Hq128"])
def test_mla_cuda_graph_replay_follows_new_lengths_and_tables(hq, triton_backend):
    graph_replay_case(hq, [700, 40, 2500, 0], [(2, [1200, 0, 6000, 33], 0.5)])


def test_mla_torch_compile_traces_the_public_function(kernel_device, triton_backend):
    """The op's fake implementation lets torch.compile(fullgraph=True) trace the public function
    (GPU only: its dtype is bfloat16; the CPU tier traces the op in the float16 test below)."""
    if not ON_GPU:
        pytest.skip("the public function's Triton path needs bfloat16 arithmetic (GPU)")
    cache, tables, seq_lens = make_cache([50, 3], page=16, kv_format="bfloat16", device=kernel_device, seed=3)
    q = torch.randn(2, 1, 16, DIM, device=kernel_device, dtype=torch.bfloat16)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=kernel_device)

    def step(q, cache, tables, lens):
        o = kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, V_DIM, 64, tables, lens, 64,
                                                          bmm1_scale=BMM1)
        return o * 2

    eager, got = eager_and_compiled(step, (q, cache, tables, seq_lens), compile_backend(ON_GPU))
    assert_close_to_eager(got, eager)


def test_mla_op_traces_under_compile_with_float16(kernel_device):
    """torch.compile(fullgraph=True) through the ops entry and its torch op (both tiers)."""
    cache, tables, seq_lens = make_cache([20, 3], page=16, kv_format="float16", device=kernel_device, seed=9)
    pages = cache.unsqueeze(2)
    q = torch.randn(2, 16, DIM, device=kernel_device, dtype=torch.float16)
    ws = torch.zeros(1 << 16, dtype=torch.uint8, device=kernel_device)

    def step(q, pages, tables, lens):
        out = torch.empty(2, 16, V_DIM, dtype=torch.float16, device=q.device)
        mla_op.mla_decode(q, PagedKV(pages, pages, tables, tables, DIM, V_DIM), lens, out=out, workspace=ws,
                                  max_seq_len=32, logit_scale=Scale(BMM1), out_scale=Scale(1.0))
        return out * 2

    eager, got = eager_and_compiled(step, (q, pages, tables, seq_lens), compile_backend(ON_GPU))
    assert_close_to_eager(got, eager)
