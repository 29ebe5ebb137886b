"""Device values that must not push a kernel outside its tensors (``KVATTN_DEBUG`` off).

The kernels clamp what they read from the device (lab/notes/robustness.md "Device-side clamps"):

* a KV length is clamped into ``[0, capacity]`` (capacity: the page table's width x page size), so
  a length past the table never reads the table past the request's row, and a negative one (a
  uint32 length >= 2^31 reads as one) is an empty request (rows of zeros);
* prefill keeps the rows it writes inside ``[0, rows)`` whatever ``cum_seq_lens_q`` holds.

How the tests see an escape: the page table is a view of the first ``W`` columns of a wider
tensor whose further columns point at an unused page full of NaN (a read past the row's end gives
NaN, where the clamped kernel gives the output of the clamped length, bit for bit), and outputs
are views into larger buffers whose margins are poisoned and must stay so. Both tiers: the
interpreter (float16) on the CPU, compiled on a GPU, where ``benchmarks/sanitize.sh`` also runs
the extreme values (2^31 - 1, -2^31) under compute-sanitizer.
"""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn import _inputs
from kvattn.ops.mla import op as mla_op
from kvattn.testing import make_paged_kv, poison_

from .oracle import ON_GPU

WS = 1 << 22


@pytest.fixture(autouse=True)
def _device_checks_off(monkeypatch):
    """The values here are the ones the device-value checks reject (on by default for CPU
    tensors): what is tested is the kernels' own clamping, with the checks off."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")


def _sync():
    if ON_GPU:
        torch.cuda.synchronize()


def _nan_page(case_tables: torch.Tensor, lens, page: int, num_pages: int) -> int:
    """A page no request uses (all NaN in make_paged_kv's cache)."""
    used = {int(case_tables[b, i]) for b, n in enumerate(lens) for i in range(-(-n // page))}
    free = sorted(set(range(num_pages)) - used)
    assert free, "the case needs an unused page"
    return free[0]


def _narrow_table(tables: torch.Tensor, fill: int) -> torch.Tensor:
    """``tables`` as the first columns of a twice as wide tensor whose other columns hold ``fill``."""
    b, w = tables.shape
    wide = torch.full((b, 2 * w), fill, dtype=tables.dtype, device=tables.device)
    wide[:, :w] = tables
    return wide[:, :w]


def _in_margins(n_rows: int, shape_tail: tuple, dtype, device, margin: int = 3):
    """``(buffer, view)``: a NaN-poisoned buffer and its rows ``[margin, margin + n_rows)``."""
    buf = poison_(torch.empty(n_rows + 2 * margin, *shape_tail, dtype=dtype, device=device))
    return buf, buf[margin:margin + n_rows]


def _margins_untouched(buf: torch.Tensor, margin: int = 3) -> bool:
    return bool(torch.isnan(buf[:margin].float()).all() and torch.isnan(buf[-margin:].float()).all())


# ---------------------------------------------------------------------------------------------
# decode (batch decode and xqa share the kernel)
# ---------------------------------------------------------------------------------------------
def _decode(q, kv_cache, tables, seq_lens, max_len, out=None):
    ws = torch.zeros(WS, dtype=torch.uint8, device=q.device)
    return kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv_cache, ws, tables, seq_lens, max_len,
                                                        bmm1_scale=0.125, out=out)


def _decode_case(device, lens=(40, 9, 21), page=16, width=3, seed=3):
    hkv, group, d = 2, 2, 64
    case = make_paged_kv(list(lens), num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.float16,
                         device=device, seed=seed, pages_per_seq=width, extra_pages=2)
    q = torch.randn(len(lens), hkv * group, d, generator=torch.Generator().manual_seed(seed)).to(device, torch.float16)
    num_pages = case.kv_cache.shape[0]
    nan_page = _nan_page(case.block_tables.cpu(), lens, page, num_pages)
    return case, q, _narrow_table(case.block_tables, nan_page)


@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-kv"])
def test_decode_lengths_past_the_table_are_clamped(split, kernel_device, triton_backend, monkeypatch):
    """seq_lens past ``width * page`` read no table entry past the row: the output is the one of
    the capacity, bit for bit, with NaN behind the row's end."""
    from kvattn.ops.decode import configs as decode_configs
    page, width = 16, 3
    capacity = width * page
    case, q, tables = _decode_case(kernel_device, lens=(capacity, 9, capacity), page=page, width=width)
    over = torch.tensor([capacity + 37, 9, capacity + 1], dtype=torch.int32, device=kernel_device)
    clamped = torch.clamp(over, max=capacity)
    fields = dict(min_chunk=16, waves=64, block_n=16) if split else {}
    with decode_configs.override(**fields):
        want = _decode(q, case.kv_cache, tables, clamped, capacity)
        buf, view = _in_margins(q.shape[0], q.shape[1:], q.dtype, kernel_device)
        got = _decode(q, case.kv_cache, tables, over, capacity, out=view)
    _sync()
    assert torch.isfinite(got.float()).all()
    assert torch.equal(got, want)
    assert _margins_untouched(buf)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint32], ids=["int32-negative", "uint32-2^31"])
def test_decode_negative_and_huge_unsigned_lengths_are_empty(dtype, kernel_device, triton_backend, monkeypatch):
    """A length that reads as negative in int32 (-5, or a uint32 of 2^31 and more) is an empty
    request: zeros, and the other requests are untouched. (The kernels' key ranges already came
    out empty for these before the clamp into [0, capacity]; pinned here as part of the rule.)"""
    page, width = 16, 3
    case, q, tables = _decode_case(kernel_device, page=page, width=width)
    good = _decode(q, case.kv_cache, tables, case.seq_lens, width * page)
    if dtype is torch.int32:
        bad = torch.tensor([-5, 9, -(2**31)], dtype=torch.int32, device=kernel_device)
    else:
        bad = torch.tensor([2**31 + 3, 9, 2**32 - 1], dtype=torch.int64).to(torch.uint32).to(kernel_device)
    got = _decode(q, case.kv_cache, tables, bad, width * page)
    _sync()
    assert torch.equal(got[1], good[1])
    assert (got[0] == 0).all() and (got[2] == 0).all()


def test_decode_extreme_lengths_stay_inside_the_table(kernel_device, triton_backend, monkeypatch):
    """2^31 - 1 (int32) keys asked of a 3-page table: the clamp bounds the work to the table, so
    this finishes at once (and, on a GPU, reads nothing outside: see benchmarks/sanitize.sh)."""
    page, width = 16, 3
    capacity = width * page
    case, q, tables = _decode_case(kernel_device, lens=(capacity, capacity, capacity), page=page, width=width)
    want = _decode(q, case.kv_cache, tables, torch.full_like(case.seq_lens, capacity), capacity)
    got = _decode(q, case.kv_cache, tables, torch.full_like(case.seq_lens, 2**31 - 1), capacity)
    _sync()
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------
# MLA (the Triton kernel on both tiers; the Gluon kernels on a Hopper GPU with bfloat16)
# ---------------------------------------------------------------------------------------------
MLA_DIM, MLA_V = 576, 512


def _mla_case(device, lens, page, width, seed=5, dtype=torch.float16):
    case = make_paged_kv(list(lens), num_kv_heads=1, head_dim=MLA_DIM, page_size=page, dtype=dtype,
                         form="shared", device=device, seed=seed, pages_per_seq=width, extra_pages=2)
    cache = case.kv_cache[:, 0, :, 0]  # [P, page, 576]
    nan_page = _nan_page(case.block_tables.cpu(), lens, page, cache.shape[0])
    return cache, _narrow_table(case.block_tables, nan_page), case.seq_lens


def _mla_ops(q, cache, tables, seq_lens, max_len):
    """The ops entry on float16 (the public function's output is bfloat16, which the interpreter
    cannot compute)."""
    pages = cache.unsqueeze(2)
    kv = _inputs.PagedKV(pages, pages, tables, tables, MLA_DIM, MLA_V)
    out = poison_(torch.empty(q.shape[0], q.shape[1], MLA_V, dtype=q.dtype, device=q.device))
    ws = torch.zeros(WS, dtype=torch.uint8, device=q.device)
    mla_op.mla_decode(q, kv, seq_lens, out=out, workspace=ws, max_seq_len=max_len, logit_scale=_inputs.Scale(0.07),
                      out_scale=_inputs.Scale(1.0))
    return out


def test_mla_lengths_are_clamped_into_the_table(kernel_device, triton_backend, monkeypatch):
    page, width, hq = 16, 2, 16
    lens = [32, 7, 32]
    cache, tables, seq_lens = _mla_case(kernel_device, lens, page, width)
    capacity = width * page
    q = torch.randn(len(lens), hq, MLA_DIM, generator=torch.Generator().manual_seed(1)).to(kernel_device,
                                                                                            torch.float16)
    want = _mla_ops(q, cache, tables, torch.tensor([capacity, 7, 0], dtype=torch.int32, device=kernel_device),
                    capacity)
    over = torch.tensor([capacity + 50, 7, -3], dtype=torch.int32, device=kernel_device)
    got = _mla_ops(q, cache, tables, over, capacity)
    huge = torch.tensor([2**31 - 1, 7, 2**31], dtype=torch.int64).to(torch.uint32).to(kernel_device)
    got_huge = _mla_ops(q, cache, tables, huge, capacity)
    _sync()
    assert torch.isfinite(got.float()).all()
    assert torch.equal(got, want)
    assert torch.equal(got_huge[:2], want[:2]) and (got_huge[2] == 0).all()


@pytest.mark.skipif(not ON_GPU, reason="Gluon MLA kernels: Hopper GPU, bfloat16")
@pytest.mark.parametrize("ws", ["1", "0"], ids=["gluon-ws", "gluon"])
def test_mla_gluon_lengths_are_clamped_into_the_table(ws, kernel_device, triton_backend, monkeypatch):
    monkeypatch.setenv("KVATTN_GLUON_WS", ws)
    page, width, hq = 64, 2, 64
    lens = [128, 7, 128]
    cache, tables, seq_lens = _mla_case(kernel_device, lens, page, width, dtype=torch.bfloat16)
    capacity = width * page
    q = torch.randn(len(lens), 1, hq, MLA_DIM, generator=torch.Generator().manual_seed(2)).to(
        kernel_device, torch.bfloat16)

    def call(lengths):
        ws_buf = torch.zeros(WS, dtype=torch.uint8, device=kernel_device)
        return kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws_buf, 128, MLA_V, 64, tables, lengths,
                                                             capacity, bmm1_scale=0.07)

    want = call(torch.tensor([capacity, 7, 0], dtype=torch.int32, device=kernel_device))
    got = call(torch.tensor([2**31 - 1, 7, -(2**31)], dtype=torch.int32, device=kernel_device))
    _sync()
    assert torch.isfinite(got.float()).all()
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------
# prefill
# ---------------------------------------------------------------------------------------------
def _prefill(q, kv_cache, tables, seq_lens, cum_q, max_q, max_kv, out=None, gluon=False):
    ws = torch.zeros(WS, dtype=torch.uint8, device=q.device)
    batch = seq_lens.shape[0]
    cum_kv = torch.zeros(batch + 1, dtype=torch.int32, device=q.device)
    return kvattn.prefill.trtllm_batch_context_with_kv_cache(
        q, kv_cache, ws, tables, seq_lens, max_q, max_kv, 0.125, 1.0, batch, cum_q, cum_kv, out=out,
        kv_layout="NHD")


# The Triton kernel (both tiers), and on a Hopper GPU the warp-specialised Gluon kernel (pages of
# 64 tokens TMA can address, head_dim 128).
PREFILL_KINDS = [
    pytest.param(dict(page=16, d=64), id="triton"),
    pytest.param(dict(page=64, d=128), id="gluon-ws", marks=pytest.mark.skipif(not ON_GPU, reason="GPU kernel")),
]


def _prefill_case(device, lens=(30, 12), page=16, width=2, seed=7, dtype=torch.float16, hkv=2, group=2, d=64):
    case = make_paged_kv(list(lens), num_kv_heads=hkv, head_dim=d, page_size=page, dtype=dtype, device=device,
                         seed=seed, pages_per_seq=width, extra_pages=2)
    nan_page = _nan_page(case.block_tables.cpu(), lens, page, case.kv_cache.shape[0])
    return case, _narrow_table(case.block_tables, nan_page), hkv * group, d


@pytest.mark.parametrize("kind", PREFILL_KINDS)
def test_prefill_rows_stay_inside_out_whatever_cum_seq_lens_q_holds(kind, kernel_device, triton_backend, monkeypatch):
    """Negative, decreasing and too large row offsets write nothing before or past ``out``."""
    case, tables, hq, d = _prefill_case(kernel_device, **kind)
    rows = 10
    q = torch.randn(rows, hq, d, generator=torch.Generator().manual_seed(3)).to(kernel_device, torch.float16)
    for cum in ([-6, 4, 10], [0, 7, 3], [-(2**31), 5, 2**31 - 1], [3, 10, 40]):
        cum_q = torch.tensor(cum, dtype=torch.int32 if max(map(abs, cum)) < 2**31 else torch.int64,
                             device=kernel_device)
        buf, view = _in_margins(rows, (hq, d), torch.float16, kernel_device)
        _prefill(q, case.kv_cache, tables, case.seq_lens, cum_q, rows, 2 * kind["page"], out=view)
        _sync()
        assert _margins_untouched(buf), f"cum_seq_lens_q={cum}: rows written outside out"


@pytest.mark.parametrize("kind", PREFILL_KINDS)
def test_prefill_negative_first_offset_keeps_the_rows_inside(kind, kernel_device, triton_backend, monkeypatch):
    """cum_seq_lens_q[0] < 0: the request's rows at or past 0 are written as those of its
    positions (the rows before 0 are dropped), so they equal the same rows of a call whose offsets
    start at 0 with the dropped rows in front."""
    case, tables, hq, d = _prefill_case(kernel_device, lens=(30,), **kind)
    seq_lens = case.seq_lens
    g = torch.Generator().manual_seed(4)
    q = torch.randn(8, hq, d, generator=g).to(kernel_device, torch.float16)
    full = _prefill(q, case.kv_cache, tables, seq_lens, torch.tensor([0, 8], dtype=torch.int32,
                                                                     device=kernel_device), 8, 2 * kind["page"])
    buf, view = _in_margins(5, (hq, d), torch.float16, kernel_device)
    _prefill(q[3:], case.kv_cache, tables, seq_lens, torch.tensor([-3, 5], dtype=torch.int32, device=kernel_device),
             8, 2 * kind["page"], out=view)
    _sync()
    assert _margins_untouched(buf)
    assert torch.equal(view, full[3:])


@pytest.mark.parametrize("kind", PREFILL_KINDS)
def test_prefill_lengths_are_clamped_into_the_table(kind, kernel_device, triton_backend, monkeypatch):
    case, tables, hq, d = _prefill_case(kernel_device, lens=(2 * kind["page"], 12), **kind)
    capacity = 2 * kind["page"]
    rows = 9
    q = torch.randn(rows, hq, d, generator=torch.Generator().manual_seed(5)).to(kernel_device, torch.float16)
    cum_q = torch.tensor([0, 4, 9], dtype=torch.int32, device=kernel_device)
    want = _prefill(q, case.kv_cache, tables, torch.tensor([capacity, 0], dtype=torch.int32, device=kernel_device),
                    cum_q, 5, capacity)
    got = _prefill(q, case.kv_cache, tables, torch.tensor([2**31 - 1, -7], dtype=torch.int32, device=kernel_device),
                   cum_q, 5, capacity)
    _sync()
    assert torch.isfinite(got.float()).all()
    assert torch.equal(got, want)
