"""Ragged speculative decode (``q_cu_seq_lens``, FlashInfer 0.7.2.post1) against the oracles.

Each case draws a random cache (NaN in unused slots, permuted pages), packs each request's own
number of draft rows (0 allowed), poisons the output, runs the public function on the Triton
backend and on the reference, and compares both with the float64 dense formulation run request by
request with that request's draft count (:func:`kvattn.dense.batch_decode`), the mask rows cut to
the request's own drafts.
"""

from __future__ import annotations

import math

import pytest
import torch

import kvattn
from kvattn.testing import make_paged_kv, poison_

from ..oracle import GPU_ONLY, ON_GPU, assert_matches, cpu, dense, run_both


def cum(values):
    out = [0]
    for v in values:
        out.append(out[-1] + int(v))
    return torch.tensor(out, dtype=torch.int32)


def random_mask(rows: int, q_max: int, gen, see_first: bool = True) -> torch.Tensor:
    """uint16 ``[rows, 2 * ceil(q_max / 32)]`` of random bits (with ``see_first`` each row sees
    draft 0 at least)."""
    words = 2 * ((q_max + 31) // 32)
    bits = torch.randint(0, 2, (rows, words * 16), generator=gen, dtype=torch.int32)
    if see_first:
        bits[:, 0] = 1
    value = (bits.view(rows, words, 16) << torch.arange(16, dtype=torch.int32)).sum(-1)
    return torch.where(value >= 32768, value - 65536, value).to(torch.int16).view(torch.uint16)


def dense_ragged(q, case, drafts, cu, mask, q_max, **kw):
    """float64 ``[total_q, Hq, D]`` (and the LSE) by the float64 formulation's own ragged form
    (each request alone, its drafts as its query length, its mask rows read since ``Q > 1``)."""
    return dense.batch_decode(q, case.kv_cache, case.block_tables, case.seq_lens, q_len_per_req=q_max, mask=mask,
                              q_cu_seq_lens=cu, return_lse=True, **kw)


def ragged_case(device, monkeypatch, *, lens, drafts, q_max=None, hkv=2, group=4, d=64, page=16, layout="NHD",
                fmt=None, dtype=torch.float16, masked=False, window=-1, sinks=False, seed=0, lse=True,
                see_first=True):
    q_max = q_max or max(max(drafts), 1)
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=dtype, kv_format=fmt,
                         layout=layout, device=device, seed=seed)
    g = torch.Generator().manual_seed(300 + seed)
    hq = hkv * group
    total = sum(drafts)
    q = torch.randn(total, hq, d, generator=g).to(dtype).to(device)
    cu = cum(drafts).to(device)
    mask = random_mask(total, q_max, g, see_first).to(device) if masked else None
    sinks_t = (torch.randn(hq, generator=g) * 2).to(device) if sinks else None
    k_scale = 0.7 if fmt in ("fp8", "nvfp4") else 1.0
    kw = dict(bmm1_scale=1.3 / math.sqrt(d) * k_scale, bmm2_scale=1.2, window_left=window, sinks=sinks_t,
              kv_layout=layout, kv_cache_sf=case.kv_cache_sf)

    def call():
        ws = torch.zeros(1 << 22, dtype=torch.uint8, device=device)
        out = poison_(torch.empty(total, hq, d, dtype=dtype, device=device))
        lse_t = poison_(torch.empty(total, hq, dtype=torch.float32, device=device)) if lse else None
        got = kvattn.decode.xqa_batch_decode_with_kv_cache(
            q, case.kv_cache, ws, case.block_tables, case.seq_lens, max(lens), out=out, q_len_per_req=q_max,
            mask=mask, q_cu_seq_lens=cu, return_lse=lse, lse=lse_t, **kw)
        if lse:
            assert got[0] is out and got[1] is lse_t
            return out, lse_t
        assert got is out
        return out, None

    (out, out_lse), (ref, ref_lse) = run_both(call, monkeypatch)
    exact, exact_lse = dense_ragged(q, case, drafts, cu, mask, q_max, **kw)
    if total:
        assert_matches(out, ref, exact)
        if lse:
            finite = torch.isfinite(exact_lse)
            assert torch.equal(torch.isfinite(cpu(out_lse)), finite)
            assert torch.allclose(cpu(out_lse)[finite], exact_lse[finite].float(), atol=2e-3, rtol=1e-3)
            assert torch.allclose(cpu(ref_lse)[finite], exact_lse[finite].float(), atol=2e-3, rtol=1e-3)
    return out


def param(id, interp=False, **kw):
    return pytest.param(kw, id=id, marks=() if interp else GPU_ONLY)


CASES = [
    # drafts 0 .. Q (a request without drafts, one with the maximum, one with its length equal to its
    # drafts, an empty request with none)
    param("fp16-NHD-p16-D64-Q4-causal", True, lens=[37, 5, 4, 0, 20], drafts=[3, 0, 4, 0, 1]),
    param("fp16-HND-p16-D64-Q4-mask", True, lens=[37, 5, 4, 20], drafts=[3, 0, 4, 2], layout="HND", masked=True),
    param("fp16-mask-window3-sinks-G1", True, lens=[40, 18], drafts=[5, 2], masked=True, window=3, sinks=True,
          group=1),
    param("fp16-causal-window2-ragged", True, lens=[40, 18, 3], drafts=[4, 1, 3], window=2),
    param("fp16-q_max-above-every-draft", True, lens=[30, 9], drafts=[2, 1], q_max=6, masked=True),
    param("fp16-no-rows", True, lens=[30, 9], drafts=[0, 0], q_max=3),
    # one-row requests in a call of Q > 1 read their mask bit 0 like any draft row (a fuzz find: the
    # float64 side had taken them as one-token decode, which reads no mask); a request of length 1
    # whose row hides its own key sees nothing
    # 96 heads of D 64: the pack and unpack programs' head blocks of 64, the second one partial
    param("fp16-Hq96-two-head-blocks", True, lens=[20, 7], drafts=[2, 3], hkv=12, group=8, masked=True, seed=6),
    param("fp16-one-row-requests-read-their-mask", True, lens=[5, 1, 9, 2], drafts=[1, 1, 2, 1], masked=True,
          see_first=False, seed=5),
    # --- GPU grid -------------------------------------------------------------------------------
    *[param(f"bf16-{layout}-p{page}-D{d}-G{g}-Q{q}-{'mask' if m else 'causal'}", lens=[1, 300, 0, 777, 64, 9],
            drafts=[1, q, 0, q - 1, 0, 2], layout=layout, page=page, d=d, group=g, hkv=max(1, 8 // g),
            dtype=torch.bfloat16, masked=m, seed=d + g + q)
      for layout in ("NHD", "HND") for page in (16, 64) for d in (64, 128, 256) for g in (1, 8)
      for q in (4, 7) for m in (False, True) if not (layout == "HND" and g == 1 and q == 4)],
    *[param(f"bf16-Q{q}-mask-words{2 * ((q + 31) // 32)}", lens=[400, 90, 1000], drafts=[q, q // 2, 1], d=128,
            dtype=torch.bfloat16, masked=True, seed=q) for q in (16, 32, 33, 64)],
    *[param(f"{fmt}-kv-ragged-mask", lens=[300, 17, 1000], drafts=[4, 0, 3], fmt=fmt, d=128, page=64,
            dtype=torch.bfloat16, masked=True, sinks=True) for fmt in ("fp8", "nvfp4")],
    param("bf16-window100-ragged", lens=[300, 17, 1000], drafts=[4, 2, 3], window=100, d=128,
          dtype=torch.bfloat16, masked=True),
    param("bf16-no-lse-G16", lens=[500, 60], drafts=[6, 3], group=16, hkv=2, d=128, dtype=torch.bfloat16,
          lse=False),
]


@pytest.mark.parametrize("kw", CASES)
def test_ragged_drafts_match_oracles(kw, kernel_device, triton_backend, monkeypatch):
    ragged_case(kernel_device, monkeypatch, **kw)


def test_ragged_equals_padded_when_every_request_brings_the_maximum(kernel_device, triton_backend, monkeypatch):
    """With q_b = Q for every request the packed rows are the padded ones: same result as the
    call without q_cu_seq_lens, bit for bit (same kernel, same rows)."""
    case = make_paged_kv([40, 23], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16,
                         device=kernel_device, seed=4)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(6, 4, 64, generator=g).to(torch.float16).to(kernel_device)
    mask = random_mask(6, 3, g).to(kernel_device)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=kernel_device)
    call = lambda **kw: kvattn.decode.xqa_batch_decode_with_kv_cache(  # noqa: E731
        q, case.kv_cache, ws, case.block_tables, case.seq_lens, 40, bmm1_scale=0.125, q_len_per_req=3, **kw)
    padded = call(mask=mask.view(2, 3, -1))
    ragged = call(mask=mask, q_cu_seq_lens=torch.tensor([0, 3, 6], dtype=torch.int32, device=kernel_device))
    assert torch.equal(padded, ragged)


def test_ragged_rows_positioned_at_the_end(reference_backend):
    """The release's causal rule: a request's row r of q_b sits at L - q_b + r. Request 0 has 2 of
    Q = 4 drafts: its first row must equal a padded call's third row (position L - 2), not its first."""
    case = make_paged_kv([30], num_kv_heads=1, head_dim=64, page_size=16, dtype=torch.float16, seed=6)
    g = torch.Generator().manual_seed(6)
    q4 = torch.randn(4, 2, 64, generator=g).to(torch.float16)
    ws = torch.zeros(1 << 20, dtype=torch.uint8)
    padded = kvattn.decode.xqa_batch_decode_with_kv_cache(q4, case.kv_cache, ws, case.block_tables, case.seq_lens, 30,
                                                          bmm1_scale=0.125, q_len_per_req=4)
    ragged = kvattn.decode.xqa_batch_decode_with_kv_cache(
        q4[2:].contiguous(), case.kv_cache, ws, case.block_tables, case.seq_lens, 30, bmm1_scale=0.125,
        q_len_per_req=4, q_cu_seq_lens=torch.tensor([0, 2], dtype=torch.int32))
    assert torch.equal(ragged, padded[2:])


def test_ragged_arguments_are_checked():
    case = make_paged_kv([30, 9], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16)
    q = torch.randn(5, 8, 64, dtype=torch.float16)
    ws = torch.zeros(1 << 20, dtype=torch.uint8)
    call = lambda **kw: kvattn.decode.xqa_batch_decode_with_kv_cache(  # noqa: E731
        q, case.kv_cache, ws, case.block_tables, case.seq_lens, 30, q_len_per_req=4, **kw)
    with pytest.raises(TypeError, match="^q_cu_seq_lens:.*int32"):
        call(q_cu_seq_lens=torch.tensor([0, 3, 5], dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^q_cu_seq_lens: expected shape \[3\]"):
        call(q_cu_seq_lens=torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^mask: expected shape \[5, 2\]"):
        call(q_cu_seq_lens=torch.tensor([0, 3, 5], dtype=torch.int32), mask=torch.zeros(2, 4, 2, dtype=torch.uint16))
    with pytest.raises(ValueError, match=r"^out: expected shape \[5, 8, 64\]"):
        call(q_cu_seq_lens=torch.tensor([0, 3, 5], dtype=torch.int32), out=torch.empty(8, 8, 64, dtype=torch.float16))


@pytest.mark.parametrize("cu,match", [
    ([1, 3, 5], "^q_cu_seq_lens: expected a first entry of 0"),
    ([0, 4, 3], "^q_cu_seq_lens: expected non-decreasing"),
    ([0, 3, 4], "^q_cu_seq_lens: expected a last entry of 5"),
    ([0, 0, 5], "^q_cu_seq_lens: request 1 has 5 query rows, more than q_len_per_req=4"),
], ids=["first-not-0", "decreasing", "last-not-total", "run-past-q_len"])
def test_ragged_offsets_checked_in_debug_mode(cu, match, monkeypatch):
    monkeypatch.setenv("KVATTN_DEBUG", "1")
    case = make_paged_kv([30, 9], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16)
    q = torch.randn(5, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match=match):
        kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, torch.zeros(1 << 20, dtype=torch.uint8),
                                                     case.block_tables, case.seq_lens, 30, q_len_per_req=4,
                                                     q_cu_seq_lens=torch.tensor(cu, dtype=torch.int32))


def test_ragged_length_shorter_than_drafts_checked_in_debug_mode(monkeypatch):
    monkeypatch.setenv("KVATTN_DEBUG", "1")
    case = make_paged_kv([30, 2], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16)
    q = torch.randn(5, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="^seq_lens: request 1 has length 2, fewer than its 3 query rows"):
        kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, torch.zeros(1 << 20, dtype=torch.uint8),
                                                     case.block_tables, case.seq_lens, 30, q_len_per_req=4,
                                                     q_cu_seq_lens=torch.tensor([0, 2, 5], dtype=torch.int32))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_ragged_drafts_replay_in_a_cuda_graph(triton_backend):
    """Captured once, replayed with new offsets written in place: the result follows them."""
    dev = torch.device("cuda")
    case = make_paged_kv([300, 90], num_kv_heads=2, head_dim=128, page_size=16, dtype=torch.bfloat16, device=dev)
    q = torch.randn(6, 8, 128, dtype=torch.bfloat16, device=dev)
    ws = torch.zeros(1 << 24, dtype=torch.uint8, device=dev)
    out = torch.empty_like(q)
    cu = torch.tensor([0, 4, 6], dtype=torch.int32, device=dev)
    call = lambda: kvattn.decode.xqa_batch_decode_with_kv_cache(  # noqa: E731
        q, case.kv_cache, ws, case.block_tables, case.seq_lens, 300, bmm1_scale=0.1, out=out, q_len_per_req=4,
        q_cu_seq_lens=cu)
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    cu.copy_(torch.tensor([0, 2, 6], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    want = out.clone()
    out.zero_()
    call()
    assert torch.equal(want, out)


def test_torch_compile_traces_ragged_drafts(kernel_device, triton_backend):
    """The ragged path (device-side index maps, the padded operator, the gather back) traces whole."""
    from ..compiled import assert_close_to_eager, compile_backend, eager_and_compiled

    case = make_paged_kv([40, 23, 9], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16,
                         device=kernel_device, seed=8)
    g = torch.Generator().manual_seed(8)
    q = torch.randn(6, 8, 64, generator=g).to(torch.float16).to(kernel_device)
    mask = random_mask(6, 4, g).to(kernel_device)
    cu = torch.tensor([0, 3, 3, 6], dtype=torch.int32, device=kernel_device)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=kernel_device)

    def step(q, kv, tables, lens, cu, mask):
        return kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 40, bmm1_scale=0.125,
                                                            q_len_per_req=4, mask=mask, q_cu_seq_lens=cu)

    eager, got = eager_and_compiled(step, (q, case.kv_cache, case.block_tables, case.seq_lens, cu, mask),
                                    compile_backend(ON_GPU))
    assert_close_to_eager(got, eager)


@pytest.mark.parametrize("masked,window", [(True, -1), (False, 2), (True, 1)], ids=["mask", "causal-window2",
                                                                                   "mask-window1"])
def test_pack_kernel_matches_the_torch_mapping(masked, window, kernel_device, triton_backend):
    """The kernels' packing (ragged_pack_kernel) and the elementwise torch mapping that
    kvattn.distributed uses give the same padded query rows and mask words."""
    from kvattn.ops.decode import ragged

    g = torch.Generator().manual_seed(12)
    drafts, q_max = [3, 0, 5, 1], 5
    total, batch = sum(drafts), len(drafts)
    q = torch.randn(total, 2, 64, generator=g).to(torch.float16).to(kernel_device)
    cu = cum(drafts).to(kernel_device)
    mask = random_mask(total, q_max, g).to(kernel_device) if masked else None
    q_pad = poison_(torch.empty(batch * q_max, 2, 64, dtype=torch.float16, device=kernel_device))
    mask_pad = torch.empty(batch, q_max, 2, dtype=torch.uint16, device=kernel_device)
    ragged.pack(q, cu, mask, q_pad, mask_pad, q_max, window)
    src, _ = ragged.row_maps(cu, batch, q_max, total)
    want_mask = ragged.padded_mask(mask, cu, src, batch, q_max, window)
    shift = torch.tensor([q_max - n for n in drafts]).repeat_interleave(q_max)
    held = (torch.arange(batch * q_max) % q_max >= shift).to(kernel_device)  # slots holding a packed row
    assert torch.equal(q_pad[held], q.index_select(0, src)[held])
    assert (q_pad[~held] == 0).all()
    got_bits, want_bits = mask_pad.view(torch.int16).view(-1, 2), want_mask.view(torch.int16).view(-1, 2)
    assert torch.equal(got_bits[held], want_bits[held])
