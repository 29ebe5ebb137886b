"""``return_lse`` on every function, both backends, against the float64 dense oracle's LSE.

The LSE is base 2, over each row's visible keys, sinks excluded, ``-inf`` for a row that sees no
key. The Triton kernels run compiled on a GPU and in Triton's interpreter on a CPU machine
(float16, small shapes); every path that writes a final LSE is taken: one split, several splits
merged in the split kernel and by the combine launch (decode and MLA), the prefill kernel. The
outputs returned with the LSE are the outputs of the same call without it, and a float32 ``out``
holds the unrounded result.
"""

from __future__ import annotations


import pytest
import torch

import kvattn
from kvattn import dense
from kvattn._inputs import PagedKV, Scale
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.ops.mla import configs as mla_configs
from kvattn.ops.mla import op as mla_op
from kvattn.testing import make_paged_kv, poison_

ON_GPU = torch.cuda.is_available()
BACKENDS = ["reference", "triton"]
SPLITS = ["one", "in-kernel", "combine"]


def _device(backend):
    return torch.device("cuda") if backend == "triton" and ON_GPU else torch.device("cpu")


def assert_lse(got: torch.Tensor, exact: torch.Tensor, tol: float = 2e-4):
    got, exact = got.double().cpu(), exact.double().cpu()
    assert got.shape == exact.shape, (tuple(got.shape), tuple(exact.shape))
    assert torch.equal(torch.isneginf(got), torch.isneginf(exact)), "-inf rows differ"
    fin = torch.isfinite(exact)
    assert torch.isfinite(got[fin]).all()
    err = (got[fin] - exact[fin]).abs()
    assert (err <= tol * (1 + exact[fin].abs())).all(), f"LSE error {float(err.max()):.3g}"


def _split_mode(split, monkeypatch):
    """A context where the decode / MLA launches split ``split``-wise."""
    if split == "one":
        return decode_configs.override(min_chunk=1 << 20)
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1" if split == "in-kernel" else "0")
    monkeypatch.setattr(decode_launch, "MAX_MERGE_ROUNDS", 1 << 30)
    return decode_configs.override(min_chunk=32, waves=64)


# ---------------------------------------------------------------------------------------------
# batch decode, xqa
# ---------------------------------------------------------------------------------------------
DECODE_CASES = [
    pytest.param(dict(), id="plain"),
    pytest.param(dict(sinks=True, window=40), id="sinks-window"),
    pytest.param(dict(q_len=2, mask=True, sinks=True), id="spec-mask"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("kw", DECODE_CASES)
def test_batch_decode_lse(backend, split, kw, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    q_len = kw.get("q_len", 1)
    # (a request holds at least its q_len drafts, or is empty: the device-value checks, on for CPU
    # tensors, refuse shorter ones)
    lens = [0, q_len, 37, 100] if not ON_GPU else [0, q_len, 37, 1500, 4099]
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16, device=device,
                         seed=len(kw))
    g = torch.Generator().manual_seed(7)
    rows = len(lens) * q_len
    q = torch.randn(rows, 8, 64, generator=g).to(device=device, dtype=torch.float16)
    sinks = torch.randn(8, generator=g).to(device) * 2 if kw.get("sinks") else None
    mask = None
    if kw.get("mask"):
        mask = torch.randint(0, 1 << 16, (len(lens), q_len, 2), generator=g, dtype=torch.int32).to(torch.uint16)
        mask = mask.to(device)
    args = dict(bmm1_scale=0.2, bmm2_scale=0.8, window_left=kw.get("window", -1), sinks=sinks, q_len_per_req=q_len,
                mask=mask)
    ws = torch.zeros(4 << 20, dtype=torch.uint8, device=device)
    with _split_mode(split, monkeypatch):
        plain = kvattn.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, case.block_tables, case.seq_lens, max(lens),
                                                      **args)
        lse_buf = poison_(torch.empty(rows, 8, device=device))
        out32 = poison_(torch.empty(rows, 8, 64, device=device))
        o, lse = kvattn.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, case.block_tables, case.seq_lens,
                                                       max(lens), out=out32, return_lse=True, lse=lse_buf, **args)
    assert o is out32 and lse is lse_buf
    exact_o, exact_lse = dense.batch_decode(q.cpu(), case.kv_cache.cpu(), case.block_tables.cpu(), case.seq_lens.cpu(),
                                            return_lse=True, **{k: v.cpu() if torch.is_tensor(v) else v
                                                                for k, v in args.items()})
    assert_lse(lse, exact_lse)
    # the float32 output rounds to the 16-bit one of the call without an LSE (one rounding, the same)
    assert torch.equal(o.half(), plain), "return_lse / a float32 out changed the output"
    torch.testing.assert_close(o.cpu().double(), exact_o, rtol=2e-3, atol=2e-3)  # float32: the P.V operand rounding
    assert (o.cpu().double() - exact_o).abs().max() <= (plain.cpu().double() - exact_o).abs().max() + 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_decode_kv_start_drops_each_requests_first_keys(backend, monkeypatch):
    """The private per-request first key (context-parallel windows): the same as attending over the
    request's keys from ``kv_start[b]`` on (a window in the dense oracle's terms: ``L - 1 - start``)."""
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    lens = [0, 9, 37, 150]
    starts = [0, 9, 5, 100]  # nothing left / part of a page / across pages
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16, device=device, seed=4)
    q = torch.randn(4, 8, 64).to(device=device, dtype=torch.float16)
    ws = torch.zeros(4 << 20, dtype=torch.uint8, device=device)
    kv_start = torch.tensor(starts, dtype=torch.int32, device=device)
    with _split_mode("in-kernel", monkeypatch):
        o, lse = kvattn.decode._batch_decode(q, case.kv_cache, ws, case.block_tables, case.seq_lens, 150,
                                             bmm1_scale=0.2, out=torch.empty(4, 8, 64, device=device),
                                             return_lse=True, kv_start=kv_start)
    for b, (n, s) in enumerate(zip(lens, starts)):
        if n == 0 or s >= n:
            assert torch.isneginf(lse[b].cpu()).all() and (o[b] == 0).all()
            continue
        want_o, want_lse = dense.batch_decode(q[b : b + 1].cpu(), case.kv_cache.cpu(), case.block_tables[b : b + 1].cpu(),
                                              case.seq_lens[b : b + 1].cpu(), bmm1_scale=0.2, window_left=n - 1 - s,
                                              return_lse=True)
        assert_lse(lse[b : b + 1], want_lse)
        torch.testing.assert_close(o[b : b + 1].cpu().double(), want_o, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_xqa_lse(backend, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    hkv, group, page, d = 2, 4, 16, 64
    lens = [0, 20, 57]
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.float16, device=device,
                         form="tuple", seed=2)
    k_pool, v_pool = (t.reshape(-1, d) for t in case.kv_cache)
    q = torch.randn(3, 1, hkv * group, d).to(device=device, dtype=torch.float16)
    sinks = torch.randn(hkv, group).to(device)
    out = torch.empty_like(q)
    lens_t = case.seq_lens.view(3, 1)
    args = (q, k_pool, v_pool, case.block_tables, lens_t, out, torch.zeros(1 << 20, dtype=torch.uint8, device=device),
            torch.zeros(8, dtype=torch.uint32, device=device), hkv, page)
    assert kvattn.xqa(*args, sinks=sinks, sliding_win_size=30) is None
    lse = kvattn.xqa(*args, sinks=sinks, sliding_win_size=30, return_lse=True)
    _, exact_lse = dense.xqa(q.cpu(), k_pool.cpu(), v_pool.cpu(), case.block_tables.cpu(), lens_t.cpu(), hkv, page,
                             sinks=sinks.cpu(), sliding_win_size=30, return_lse=True)
    assert lse.shape == (3, 1, hkv * group)
    assert_lse(lse, exact_lse)


# ---------------------------------------------------------------------------------------------
# MLA
# ---------------------------------------------------------------------------------------------
def _mla_inputs(device, lens, hq, seed, kv_format, page=16):
    case = make_paged_kv(lens, num_kv_heads=1, head_dim=576, page_size=page, kv_format=kv_format, form="shared",
                         device=device, seed=seed)
    cache = case.kv_cache[:, 0, :, 0]
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[kv_format]
    q = torch.randn(len(lens), 1, hq, 576, generator=torch.Generator().manual_seed(seed)).to(device=device,
                                                                                             dtype=dtype)
    return cache, case.block_tables, case.seq_lens, q


def test_mla_lse_reference():
    cache, tables, lens, q = _mla_inputs("cpu", [0, 1, 70, 33], 16, 1, "bfloat16")
    ws = torch.zeros(1 << 20, dtype=torch.uint8)
    plain = kvattn.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, tables, lens, 70, bmm1_scale=0.07)
    o, lse = kvattn.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, tables, lens, 70, bmm1_scale=0.07,
                                                       return_lse=True, out=torch.empty(4, 16, 512))
    exact_o, exact_lse = dense.mla(q, cache, tables, lens, bmm1_scale=0.07, return_lse=True)
    assert_lse(lse, exact_lse)
    assert o.dtype == torch.float32 and torch.equal(o.bfloat16(), plain)


@pytest.mark.parametrize("split", ["one", "splits"])
@pytest.mark.parametrize("hq,page", [(16, 16), pytest.param(64, 64, marks=pytest.mark.skipif(
    not ON_GPU, reason="Hopper's Gluon kernel (Hq 64, 64-token pages)"))], ids=["triton-kernel", "gluon-kernel"])
def test_mla_lse_kernel(split, hq, page):
    """The MLA kernels' LSE, one split (the split kernel stores it) and several (the combine launch
    does); float16 through the ops entry on the CPU tier, the public function on a GPU (Hq 64 with
    64-token pages: the Gluon kernel on Hopper)."""
    device = torch.device("cuda" if ON_GPU else "cpu")
    fmt = "bfloat16" if ON_GPU else "float16"
    lens = [0, 1, 70, 33] if not ON_GPU else [0, 1, 700, 3300]
    cache, tables, seq_lens, q = _mla_inputs(device, lens, hq, 5, fmt, page)
    fields = dict(min_chunk=1 << 20) if split == "one" else dict(min_chunk=16, waves=64)
    if not ON_GPU:
        fields["block_n"] = 16
    lse = poison_(torch.empty(len(lens), hq, device=device))
    with mla_configs.override(**fields):
        if ON_GPU:
            kvattn.xqa_batch_decode_with_kv_cache_mla(q, cache, torch.zeros(1 << 22, dtype=torch.uint8, device=device),
                                                      128, 512, 64, tables, seq_lens, max(lens), bmm1_scale=0.07,
                                                      return_lse=True, lse=lse)
        else:
            pages = cache.unsqueeze(2)
            kv = PagedKV(pages, pages, tables, tables, 576, 512)
            out = torch.empty(len(lens), hq, 512, dtype=torch.float16)
            mla_op.mla_decode(q[:, 0], kv, seq_lens, out=out, workspace=torch.zeros(1 << 22, dtype=torch.uint8),
                                      max_seq_len=max(lens), logit_scale=Scale(0.07), out_scale=Scale(1.0), lse=lse)
    _, exact_lse = dense.mla(q.cpu(), cache.cpu(), tables.cpu(), seq_lens.cpu(), bmm1_scale=0.07, return_lse=True)
    assert_lse(lse, exact_lse)


# ---------------------------------------------------------------------------------------------
# single decode
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw", [dict(), dict(window_left=50, pos_encoding_mode="ALIBI")], ids=["plain", "alibi-window"])
def test_single_decode_out_and_lse_buffers(backend, kw, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    q, k, v = (torch.randn(*s).to(device=device, dtype=torch.float16) for s in ((8, 64), (130, 2, 64), (130, 2, 64)))
    out, lse = poison_(torch.empty(8, 64, device=device)), poison_(torch.empty(8, device=device))
    got_o, got_lse = kvattn.single_decode_with_kv_cache(q, k, v, return_lse=True, out=out, lse=lse, **kw)
    assert got_o is out and got_lse is lse
    o16, lse16 = kvattn.single_decode_with_kv_cache(q, k, v, return_lse=True, **kw)
    exact_o, exact_lse = dense.single_decode(q.cpu(), k.cpu(), v.cpu(), **kw)
    assert_lse(lse, exact_lse)
    assert torch.equal(lse16, lse)
    torch.testing.assert_close(out.cpu().double(), exact_o, rtol=2e-3, atol=2e-3)
    assert torch.equal(out.half(), o16) or (out.half().float() - o16.float()).abs().max() <= 2**-10


# ---------------------------------------------------------------------------------------------
# prefill
# ---------------------------------------------------------------------------------------------
WS_SHAPE = dict(page=64, d=128, dtype=torch.bfloat16)  # Hopper's warp-specialised Gluon prefill takes these


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kw", [dict(), dict(sinks=True, window_left=9),
                                dict(skip_softmax_threshold_scale_factor=50.0),
                                pytest.param(dict(shape=WS_SHAPE), marks=pytest.mark.skipif(
                                    not ON_GPU, reason="the Gluon prefill's launches (GPU)"))],
                         ids=["plain", "sinks-window", "skip", "gluon-ws-shape"])
def test_context_lse(backend, kw, monkeypatch):
    """(On Hopper, a launch the warp-specialised Gluon kernel would take keeps the Triton kernel
    when an LSE is asked for: that kernel stores none.)"""
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    kw = dict(kw)
    ws_shape = "shape" in kw
    shape = kw.pop("shape", dict(page=16, d=64, dtype=torch.float16))
    lens = [40, 0, 70] if not ON_GPU else [40, 0, 64, 1500]
    q_lens = [5, 0, 20] if not ON_GPU else [5, 0, 64, 300]
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=shape["d"], page_size=shape["page"], dtype=shape["dtype"],
                         layout="HND", device=device, seed=8)
    cum_q = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=device)
    cum_kv = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), 8, shape["d"]).to(device=device, dtype=shape["dtype"])
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(8).to(device)
    args = (q, case.kv_cache, torch.zeros(1 << 20, dtype=torch.uint8, device=device), case.block_tables,
            case.seq_lens, max(q_lens), max(lens), 0.15, 1.0, len(lens), cum_q, cum_kv)
    plain = kvattn.trtllm_batch_context_with_kv_cache(*args, kv_layout="HND", **kw)
    o, lse = kvattn.trtllm_batch_context_with_kv_cache(*args, kv_layout="HND", return_lse=True,
                                                       lse=poison_(torch.empty(sum(q_lens), 8, device=device)), **kw)
    if ws_shape:  # another kernel than the call without an LSE: the same values up to rounding
        torch.testing.assert_close(o.float(), plain.float(), rtol=2e-2, atol=2e-2)
    else:
        assert torch.equal(o, plain)
    _, exact_lse = dense.context(q.cpu(), case.kv_cache.cpu(), case.block_tables.cpu(), case.seq_lens.cpu(),
                                 cum_q.cpu(), bmm1_scale=0.15, return_lse=True,
                                 **{k: v.cpu() if torch.is_tensor(v) else v for k, v in kw.items()})
    assert_lse(lse, exact_lse)


# ---------------------------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------------------------
def test_lse_arguments_are_checked():
    case = make_paged_kv([5, 9], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.bfloat16)
    q = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    ws = torch.zeros(1 << 20, dtype=torch.uint8)
    call = lambda **kw: kvattn.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, case.block_tables,  # noqa: E731
                                                               case.seq_lens, 9, **kw)
    with pytest.raises(ValueError, match="^lse: given without return_lse"):
        call(lse=torch.empty(2, 8))
    with pytest.raises(TypeError, match="^return_lse:"):
        call(return_lse=1)
    with pytest.raises(ValueError, match="^lse:"):
        call(return_lse=True, lse=torch.empty(2, 4))
    with pytest.raises(TypeError, match="^lse:"):
        call(return_lse=True, lse=torch.empty(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="^lse:"):
        call(return_lse=True, lse=torch.empty(8, 2).t())
    with pytest.raises(TypeError, match="^out:"):
        kvattn.single_decode_with_kv_cache(q[0], torch.randn(5, 2, 64, dtype=torch.bfloat16),
                                           torch.randn(5, 2, 64, dtype=torch.bfloat16), out=torch.empty(8, 64).half())
    with pytest.raises(ValueError, match="^lse:"):
        kvattn.single_decode_with_kv_cache(q[0], torch.randn(5, 2, 64, dtype=torch.bfloat16),
                                           torch.randn(5, 2, 64, dtype=torch.bfloat16), lse=torch.empty(8))
