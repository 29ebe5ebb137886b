"""MLA decode with several query tokens a request (multi-token prediction, ``Q`` 1-4).

Token ``r`` of a request of length ``L`` sits at position ``L - Q + r`` and sees keys ``0 .. L - Q
+ r`` (docs/semantics.md, MLA). The oracle is :func:`kvattn.dense.mla` (float64) run once per
token with the lengths that token sees, an independent formulation of the rule. Every kernel folds
(token, head) into its M rows, so the cases cross head blocks (Q x Hq above 64), put a request of
exactly Q keys (and one shorter, under the documented rule) among long ones and end requests
inside tiles, where the per-row limit applies.

The interpreter tier calls the ops entry on float16 tensors (the interpreter has no bfloat16
arithmetic; the kernel is dtype-generic), the GPU tier the public function on the whole grid.
"""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn import reference
from kvattn._inputs import PagedKV, Scale
from kvattn.formats import FP8_DTYPE
from kvattn.ops.mla import configs as mla_configs
from kvattn.ops.mla import op as mla_op
from kvattn.testing import poison_, relative_error

from ..oracle import ON_GPU, assert_matches, cpu, dense, run_both
from .test_mla import BMM1, DIM, V_DIM, make_cache

GPU = pytest.mark.skipif(not ON_GPU, reason="GPU grid; the interpreter tier runs the ops-entry cases")


def exact_mtp(q, cache, tables, seq_lens, bmm1, bmm2):
    """float64 ``(o [B, Q, Hq, 512], lse [B, Q, Hq])``: token ``r`` as a one-token decode over the
    first ``L - Q + r + 1`` keys (none when that is not positive: zero, LSE -inf)."""
    q, cache, tables, lens = cpu(q), cpu(cache), cpu(tables), cpu(seq_lens).to(torch.int64)
    batch, q_len, heads, _ = q.shape
    o = torch.zeros(batch, q_len, heads, V_DIM, dtype=torch.float64)
    lse = torch.full((batch, q_len, heads), float("-inf"), dtype=torch.float64)
    for r in range(q_len):
        seen = (lens - (q_len - 1 - r)).clamp(min=0)
        if int(seen.max()) == 0:
            continue
        o_r, lse_r = dense.mla(q[:, r : r + 1], cache, tables, seen.to(torch.int32), bmm1_scale=cpu(bmm1),
                               bmm2_scale=cpu(bmm2), return_lse=True)
        empty = seen == 0
        o[:, r] = torch.where(empty[:, None, None], 0.0, o_r)
        lse[:, r] = torch.where(empty[:, None], float("-inf"), lse_r)
    return o, lse


def check_lse(lse, exact_lse):
    lse, exact_lse = lse.cpu().double(), exact_lse.double()
    inf = torch.isinf(exact_lse)
    assert not torch.isnan(lse).any() and torch.equal(torch.isinf(lse), inf)
    assert (lse[~inf] - exact_lse[~inf]).abs().max() <= 2e-2 if (~inf).any() else True


# ---------------------------------------------------------------------------------------------
# both tiers: the ops entry on float16
# ---------------------------------------------------------------------------------------------
def ops_mtp_case(device, *, lens, q_len, hq, page, ws_bytes=1 << 20, seed=0):
    cache, tables, seq_lens = make_cache(lens, page=page, kv_format="float16", device=device, seed=seed)
    g = torch.Generator().manual_seed(300 + seed)
    q4 = torch.randn(len(lens), q_len, hq, DIM, generator=g).to(device=device, dtype=torch.float16)
    q = q4.reshape(len(lens), q_len * hq, DIM)
    pages = cache.unsqueeze(2)
    kv = PagedKV(pages, pages, tables, tables, DIM, V_DIM)
    scale_q, scale_o = Scale(BMM1), Scale(0.9)
    out = poison_(torch.empty(len(lens), q_len * hq, V_DIM, dtype=torch.float16, device=device))
    lse = torch.full((len(lens), q_len * hq), float("nan"), device=device)
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)
    mla_op.mla_decode(q, kv, seq_lens, out=out, workspace=ws, max_seq_len=max(max(lens), 1), logit_scale=scale_q,
                      out_scale=scale_o, lse=lse, q_len=q_len)
    ref_out = torch.empty_like(out)
    reference.mla_decode(q, kv, seq_lens, ref_out, logit_scale=scale_q, out_scale=scale_o, q_len=q_len)
    exact, exact_lse = exact_mtp(q4, cache, tables, seq_lens, BMM1, 0.9)
    assert_matches(out, ref_out, exact.reshape(len(lens), q_len * hq, V_DIM))
    check_lse(lse, exact_lse.reshape(len(lens), q_len * hq))


OPS_CASES = [
    # Q x Hq = 16 rows: one head block; lengths Q, Q - 1 (a row at a negative position), 0, several tiles
    pytest.param(dict(lens=[2, 1, 0, 37], q_len=2, hq=8, page=16), id="Q2-Hq8-p16"),
    # 3 x 8 = 24 rows: two head blocks of 16 (tokens split across blocks), a tile ending mid-request
    pytest.param(dict(lens=[3, 21], q_len=3, hq=8, page=16, seed=1), id="Q3-Hq8-two-row-blocks"),
    # 4 tokens, several splits: the last split alone holds the drafts
    pytest.param(dict(lens=[4, 70], q_len=4, hq=4, page=32, seed=2), id="Q4-Hq4-p32"),
]


@pytest.mark.parametrize("kw", OPS_CASES)
def test_mla_mtp_ops_entry_float16(kw, kernel_device):
    ops_mtp_case(kernel_device, **kw)


def test_mla_mtp_split_kv(kernel_device):
    """Splits of 16 keys: a split may end inside the drafts' last keys (per-row limits past its end)."""
    with mla_configs.override(min_chunk=16, waves=64, **({"block_n": 16} if not ON_GPU else {})):
        ops_mtp_case(kernel_device, lens=[50, 3, 33], q_len=3, hq=4, page=16, seed=3)


@pytest.mark.parametrize("q_len", [2, 4], ids=lambda q: f"Q{q}")
def test_mla_mtp_heads_as_n(q_len, kernel_device):
    """Keys in M, rows in N (the fp8-score path at few rows): the per-row limit along the columns."""
    # (64-key tiles, 2 stages on a GPU: the float16 operands' tiles at 3 stages, the fp8-score
    # entry's depth, need 236 KB of shared memory, over a Hopper's 227)
    with mla_configs.override(block_h=16, heads_as_n=True, **({"block_n": 16} if not ON_GPU else
                                                               {"block_n": 64, "num_stages": 2, "num_warps": 8})):
        ops_mtp_case(kernel_device, lens=[q_len, 40, 0], q_len=q_len, hq=16 // q_len, page=16, seed=4)


# ---------------------------------------------------------------------------------------------
# GPU: the public function
# ---------------------------------------------------------------------------------------------
def mtp_case(device, monkeypatch, *, lens, q_len, hq, page=64, kv_format="bfloat16", return_lse=False,
             gluon=True, ws_bytes=64 << 20, seed=0):
    if not gluon:
        monkeypatch.setenv("KVATTN_GLUON", "0")
    cache, tables, seq_lens = make_cache(lens, page=page, kv_format=kv_format, device=device, seed=seed)
    dtype = {"bfloat16": torch.bfloat16, "fp8": FP8_DTYPE}[kv_format]
    g = torch.Generator().manual_seed(500 + seed)
    q = torch.randn(len(lens), q_len, hq, DIM, generator=g).to(device=device, dtype=dtype)
    bmm1, bmm2 = (BMM1 * 0.7, 1.3) if kv_format == "fp8" else (BMM1, 0.9)
    shape = (len(lens), q_len, hq) if q_len > 1 else (len(lens), hq)

    def call():
        out = poison_(torch.empty(*shape, V_DIM, dtype=torch.bfloat16, device=device))
        lse = torch.full(shape, float("nan"), device=device) if return_lse else None
        ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)
        got = kvattn.mla.xqa_batch_decode_with_kv_cache_mla(
            q, cache, ws, 128, V_DIM, 64, tables, seq_lens, max(max(lens), 1), out=out, bmm1_scale=bmm1,
            bmm2_scale=bmm2, return_lse=return_lse, lse=lse)
        return torch.cat([out.float().flatten(), lse.flatten()]) if return_lse else got

    both, ref_both = run_both(call, monkeypatch)
    exact, exact_lse = exact_mtp(q, cache, tables, seq_lens, bmm1, bmm2)
    n = exact.numel()
    out = (both[:n] if return_lse else both).reshape(exact.shape).to(torch.bfloat16)
    ref_out = (ref_both[:n] if return_lse else ref_both).reshape(exact.shape).to(torch.bfloat16)
    assert_matches(out, ref_out, exact)
    if return_lse:
        check_lse(both[n:].reshape(exact_lse.shape), exact_lse)
    for b, length in enumerate(lens):  # rows at negative positions: zero
        hidden = max(q_len - length, 0)
        assert (out[b, :hidden].float() == 0).all()


def gpu_lens(q_len):
    # a request exactly Q long among long ones, one shorter than Q (rows at negative positions),
    # an empty one, lengths ending inside tiles and pages, several splits
    return [q_len, 1500, max(q_len - 1, 0), 37, 0, 4099, 2048 + q_len]


# (Pages of 16 and 32 take the Gluon kernels as pages of 64 do, a tile over 4 / 2 pages.)
GRID = [pytest.param(dict(q_len=q, hq=h, kv_format=f, page=p), id=f"{f}-Q{q}-Hq{h}-p{p}")
        for f in ("bfloat16", "fp8") for q in (1, 2, 3, 4) for h in (16, 32, 64, 128) for p in (16, 64)]
GRID += [pytest.param(dict(q_len=q, hq=h, kv_format=f, page=32), id=f"{f}-Q{q}-Hq{h}-p32")
         for f in ("bfloat16", "fp8") for q in (2, 4) for h in (16, 128)]


@GPU
@pytest.mark.parametrize("kw", GRID)
def test_mla_mtp_grid(kw, kernel_device, triton_backend, monkeypatch):
    mtp_case(kernel_device, monkeypatch, lens=gpu_lens(kw["q_len"]), seed=kw["q_len"] * 7 + kw["hq"], **kw)


@GPU
@pytest.mark.parametrize("kw", [
    *[pytest.param(dict(q_len=q, hq=h, kv_format=f), id=f"{f}-Q{q}-Hq{h}")
      for f in ("bfloat16", "fp8") for q in (2, 4) for h in (16, 128)],
    # the LSE over pages of 16 / 32: mla/kernels_gluon.py's kernel (64+ rows of a 16-bit cache)
    *[pytest.param(dict(q_len=q, hq=h, page=p), id=f"bfloat16-Q{q}-Hq{h}-p{p}")
      for q, h, p in ((2, 128, 16), (4, 16, 16), (2, 32, 32), (3, 128, 32))]])
def test_mla_mtp_return_lse(kw, kernel_device, triton_backend, monkeypatch):
    mtp_case(kernel_device, monkeypatch, lens=gpu_lens(kw["q_len"]), return_lse=True, seed=kw["hq"], **kw)


@GPU
@pytest.mark.parametrize("q_len", [2, 4], ids=lambda q: f"Q{q}")
@pytest.mark.parametrize("hq", [16, 128], ids=lambda h: f"Hq{h}")
def test_mla_mtp_triton_kernel_and_many_splits(q_len, hq, kernel_device, triton_backend, monkeypatch):
    """The Triton kernel on launches the Gluon kernels take (KVATTN_GLUON=0), then short splits."""
    mtp_case(kernel_device, monkeypatch, lens=gpu_lens(q_len), q_len=q_len, hq=hq, gluon=False, seed=hq)
    monkeypatch.delenv("KVATTN_GLUON")
    with mla_configs.override(min_chunk=32, waves=16):
        mtp_case(kernel_device, monkeypatch, lens=gpu_lens(q_len), q_len=q_len, hq=hq, seed=hq + 1)


@GPU
@pytest.mark.parametrize("kv_format", ["bfloat16", "fp8"])
@pytest.mark.parametrize("q_len,hq", [(2, 16), (4, 16), (3, 128)], ids=["Q2-Hq16", "Q4-Hq16", "Q3-Hq128"])
def test_mla_mtp_cuda_graph_replay_follows_new_lengths(q_len, hq, kv_format, triton_backend):
    """One capture, replayed with new lengths (one exactly Q, one shorter), tables, query and scale."""
    device = torch.device("cuda")
    page, width, pool = 64, 100, 300
    dtype = {"bfloat16": torch.bfloat16, "fp8": FP8_DTYPE}[kv_format]

    def case(lens, seed):
        used = sum((n + page - 1) // page for n in lens)
        return make_cache(lens, page=page, kv_format=kv_format, device=device, seed=seed, pages_per_seq=width,
                          extra_pages=pool - used)

    cache, tables, seq_lens = case([700, 40, 2500, 0], seed=1)
    q = torch.randn(4, q_len, hq, DIM, device=device).to(dtype)
    out = torch.empty(4, q_len, hq, V_DIM, device=device, dtype=torch.bfloat16)
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device=device)
    scale = torch.tensor([BMM1], device=device)

    def call():
        kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, V_DIM, 64, tables, seq_lens, width * page,
                                                      out=out, bmm1_scale=scale, bmm2_scale=1.1)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for seed, lens, factor in [(2, [q_len, 6000, 0, q_len - 1], 0.5), (3, [1200, 33, q_len, 5000], 1.5)]:
        new_cache, new_tables, new_lens = case(lens, seed=seed)
        cache.copy_(new_cache)
        tables.copy_(new_tables)
        seq_lens.copy_(new_lens)
        q.copy_(torch.randn(q.shape, device=device).to(dtype))
        scale.fill_(BMM1 * factor)
        poison_(out)
        graph.replay()
        torch.cuda.synchronize()
        exact, _ = exact_mtp(q, cache, tables, seq_lens, BMM1 * factor, 1.1)
        assert relative_error(out.cpu(), exact) <= 1e-2
