"""``xqa`` with FlashInfer 0.7.2.post1's arguments against the oracles: speculative decoding
(``q_seq_len`` with a draft mask), ragged drafts (``q_cu_seq_lens``), NVFP4 pools
(``k_sf_cache`` / ``v_sf_cache``), fp8 outputs (``rcp_out_scale``), and the release's and the
seed's positional forms.

Each case draws a random cache (NaN in unused slots, permuted pages) seen as xqa's flat head
pools, poisons the output, runs both backends and compares them with the float64 dense batch
decode (:func:`kvattn.dense.batch_decode`), the scales translated: logits ``q_scale * kv_scale /
sqrt(D)``, output ``kv_scale`` (quantised caches), times ``rcp_out_scale`` for an fp8 output.
"""

from __future__ import annotations

import math

import pytest
import torch

import kvattn
from kvattn.formats import FP8_DTYPE
from kvattn.testing import make_paged_kv, poison_

from ..oracle import GPU_ONLY, ON_GPU, assert_matches, cpu, dense, run_both
from .test_ragged_drafts import cum, dense_ragged, random_mask


def pools(case, d: int):
    """xqa's flat pools ``[pages * page * Hkv, last]`` of a tuple NHD case (and of its block scales)."""
    k, v = case.kv_cache
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    sf = None
    if case.kv_cache_sf is not None:
        sf = tuple(flat(t).view(torch.uint8) for t in case.kv_cache_sf)  # (the release's uint8 scales)
    return flat(k), flat(v), sf


def xqa_case(device, monkeypatch, *, lens, q_len=1, drafts=None, hkv=2, group=4, d=64, page=16, fmt=None,
             dtype=torch.float16, masked=False, win=0, sinks=False, out_fp8=False, rcp=1.0, kv_scale=None,
             q_scale=1.1, seed=0):
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=dtype, kv_format=fmt,
                         form="tuple", device=device, seed=seed)
    k, v, sf = pools(case, d)
    g = torch.Generator().manual_seed(500 + seed)
    hq = hkv * group
    batch = len(lens)
    ragged = drafts is not None
    rows = sum(drafts) if ragged else batch * q_len
    if ragged:
        q = torch.randn(rows, hq, d, generator=g).to(dtype).to(device)
    elif q_len > 1:
        q = torch.randn(batch, 1, q_len, hq, d, generator=g).to(dtype).to(device)
    else:
        q = torch.randn(batch, 1, hq, d, generator=g).to(dtype).to(device)
    cu = cum(drafts).to(device) if ragged else None
    mask = None
    if masked:
        mask = random_mask(rows, q_len, g).to(device)
        if not ragged:
            mask = mask.view(batch, q_len, -1)
    sinks_t = (torch.randn(hkv, group, generator=g) * 2).to(device) if sinks else None
    seq_lens = case.seq_lens.to(torch.uint32).view(-1, 1)
    kv_scale_t = torch.tensor([kv_scale], device=device) if kv_scale is not None else None
    extra = dict(q_cu_seq_lens=cu)
    if sf is not None:
        extra.update(k_sf_cache=sf[0], v_sf_cache=sf[1])

    def call():
        out = poison_(torch.empty(q.shape, dtype=FP8_DTYPE if out_fp8 else dtype, device=device))
        ws = torch.zeros(1 << 22, dtype=torch.uint8, device=device)
        sem = torch.zeros(8, dtype=torch.uint32, device=device)
        # The release's positional form: ..., sliding_win_size, kv_layout, sm_count, enable_pdl,
        # rcp_out_scale, q_seq_len, mask
        got = kvattn.xqa.xqa(q, k, v, case.block_tables, seq_lens, out, ws, sem, hkv, page, sinks_t, q_scale,
                             kv_scale_t, win, "NHD", None, None, rcp, q_len, mask, **extra)
        assert got is None
        return out

    out, ref_out = run_both(call, monkeypatch)
    kvs = kv_scale if (kv_scale is not None and fmt in ("fp8", "nvfp4")) else 1.0
    kw = dict(bmm1_scale=q_scale * kvs / math.sqrt(d), bmm2_scale=kvs, window_left=win - 1 if win > 0 else -1,
              sinks=sinks_t.reshape(-1) if sinks else None, kv_layout="NHD", kv_cache_sf=case.kv_cache_sf)
    if ragged:
        exact, _ = dense_ragged(q, case, drafts, cu, mask, q_len, **kw)
    else:
        exact = dense.batch_decode(cpu(q).reshape(rows, hq, d), cpu(case.kv_cache), cpu(case.block_tables),
                                   cpu(case.seq_lens), q_len_per_req=q_len, mask=cpu(mask),
                                   **{a: cpu(b) for a, b in kw.items()})
    if rows:
        assert_matches(out.reshape(rows, hq, d), ref_out.reshape(rows, hq, d), exact,
                       stored_scale=1.0 / rcp if out_fp8 else 1.0)
    return out


def param(id, interp=False, **kw):
    return pytest.param(kw, id=id, marks=() if interp else GPU_ONLY)


CASES = [
    param("spec-Q3-mask-fp16", True, lens=[37, 5, 0, 20], q_len=3, masked=True),
    param("spec-Q4-causal-window9-sinks", True, lens=[37, 6, 20], q_len=4, win=9, sinks=True),
    param("ragged-Q4-mask-with-empty-drafts", True, lens=[37, 5, 4, 20], q_len=4, drafts=[3, 0, 4, 2], masked=True),
    param("nvfp4-pool-D64-kv-scale", True, lens=[33, 9], fmt="nvfp4", kv_scale=0.8),
    param("fp8-pool-fp8-out-rcp", True, lens=[33, 9], fmt="fp8", kv_scale=0.6, out_fp8=True, rcp=2.5),
    param("nvfp4-pool-spec-Q2-fp8-out", True, lens=[40, 17], fmt="nvfp4", q_len=2, masked=True, out_fp8=True,
          rcp=0.5),
    # --- GPU grid -------------------------------------------------------------------------------
    *[param(f"spec-bf16-D{d}-G{g}-Q{q}-p{page}-{'mask' if m else 'causal'}", lens=[1, 300, 0, 777, 64],
            q_len=q, masked=m, d=d, group=g, hkv=max(1, 8 // g), page=page, dtype=torch.bfloat16, seed=d + g + q)
      for d in (64, 128, 256) for g in (1, 8) for q in (2, 5, 33) for m in (False, True) for page in (16, 64)
      if not (d == 256 and q == 33)],
    *[param(f"ragged-bf16-D{d}-G{g}-Q{q}", lens=[1, 300, 0, 777, 64], q_len=q, drafts=[1, q, 0, q - 1, 0],
            masked=True, d=d, group=g, hkv=max(1, 8 // g), dtype=torch.bfloat16, seed=d + q)
      for d in (64, 128) for g in (1, 8) for q in (3, 7)],
    *[param(f"nvfp4-pool-bf16-D{d}-{kind}", lens=[300, 17, 1000], fmt="nvfp4", d=d, dtype=torch.bfloat16,
            kv_scale=0.7, **kw)
      for d in (64, 128, 256) for kind, kw in (("decode", {}), ("spec-Q4-mask", dict(q_len=4, masked=True)),
                                               ("ragged", dict(q_len=4, drafts=[4, 0, 2], masked=True)),
                                               ("fp8-out", dict(out_fp8=True, rcp=3.0)))],
    *[param(f"fp8-pool-bf16-D128-{kind}", lens=[300, 17, 1000], fmt="fp8", d=128, dtype=torch.bfloat16,
            kv_scale=0.5, **kw)
      for kind, kw in (("spec-Q4-sinks-window", dict(q_len=4, masked=True, sinks=True, win=100)),
                       ("fp8-out-rcp", dict(out_fp8=True, rcp=0.25)),
                       ("ragged-fp8-out", dict(q_len=3, drafts=[2, 3, 0], out_fp8=True, rcp=2.0)))],
]


@pytest.mark.parametrize("kw", CASES)
def test_xqa_release_arguments_match_oracles(kw, kernel_device, triton_backend, monkeypatch):
    xqa_case(kernel_device, monkeypatch, **kw)


def test_seed_positional_sm_count_at_position_14(reference_backend):
    """The seed's call (sm_count at position 14) and the release's (kv_layout there) give the same."""
    case = make_paged_kv([40, 9], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16, form="tuple")
    k, v, _ = pools(case, 64)
    q = torch.randn(2, 1, 8, 64, dtype=torch.float16)
    lens = case.seq_lens.view(-1, 1)
    ws, sem = torch.zeros(1 << 20, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint32)
    seed_out, release_out = torch.empty_like(q), torch.empty_like(q)
    kvattn.xqa.xqa(q, k, v, case.block_tables, lens, seed_out, ws, sem, 2, 16, None, 1.0, None, 0, 3)
    kvattn.xqa.xqa(q, k, v, case.block_tables, lens, release_out, ws, sem, 2, 16, None, 1.0, None, 0, "NHD", 3,
                   False, 1.0, 1, None)
    assert torch.equal(seed_out, release_out)
    with pytest.raises(TypeError, match="^kv_layout: an int here is the seed's sm_count"):
        kvattn.xqa.xqa(q, k, v, case.block_tables, lens, seed_out, ws, sem, 2, 16, None, 1.0, None, 0, 3, 4)


def test_release_arguments_are_checked():
    case = make_paged_kv([40, 9], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16, form="tuple")
    k, v, _ = pools(case, 64)
    nv = make_paged_kv([40, 9], num_kv_heads=2, head_dim=64, page_size=16, kv_format="nvfp4", form="tuple")
    nk, nvv, nsf = pools(nv, 64)
    lens = case.seq_lens.view(-1, 1)
    ws, sem = torch.zeros(1 << 20, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint32)
    q4, q5 = torch.randn(2, 1, 8, 64, dtype=torch.float16), torch.randn(2, 1, 3, 8, 64, dtype=torch.float16)

    def call(q, kk=k, vv=v, out=None, **kw):
        out = torch.empty_like(q) if out is None else out
        return kvattn.xqa.xqa(q, kk, vv, case.block_tables, lens, out, ws, sem, 2, 16, **kw)

    with pytest.raises(ValueError, match=r"^q: expected shape \[B, 1, q_seq_len, Hq, D\]"):
        call(q4, q_seq_len=3)
    with pytest.raises(ValueError, match="^q: expected q_seq_len=4 rows"):
        call(torch.randn(2, 1, 3, 8, 64, dtype=torch.float16), q_seq_len=4)
    with pytest.raises(ValueError, match=r"^mask: expected shape \[2, 3, 2\]"):
        call(q5, q_seq_len=3, mask=torch.zeros(2, 3, 4, dtype=torch.uint16))
    with pytest.raises(TypeError, match="^mask:"):
        call(q5, q_seq_len=3, mask=torch.zeros(2, 3, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^q: expected shape \[total_q, Hq, D\]"):
        call(q5, q_seq_len=3, q_cu_seq_lens=torch.tensor([0, 1, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^q_cu_seq_lens: expected shape \[3\]"):
        call(torch.randn(4, 8, 64, dtype=torch.float16), q_seq_len=3, q_cu_seq_lens=torch.tensor([0, 4],
                                                                                              dtype=torch.int32))
    with pytest.raises(TypeError, match="^rcp_out_scale:"):
        call(q4, rcp_out_scale="2")
    with pytest.raises(ValueError, match="^rcp_out_scale:"):
        call(q4, rcp_out_scale=float("inf"))
    with pytest.raises(TypeError, match="^enable_pdl:"):
        call(q4, enable_pdl=1)
    with pytest.raises(ValueError, match="^k_sf_cache: expected the block scales"):
        call(q4, kk=nk, vv=nvv)
    with pytest.raises(ValueError, match="^v_sf_cache: expected the block scales"):
        call(q4, kk=nk, vv=nvv, k_sf_cache=nsf[0])
    with pytest.raises(ValueError, match="^k_sf_cache: block scales are only for NVFP4"):
        call(q4, k_sf_cache=nsf[0], v_sf_cache=nsf[1])
    with pytest.raises(ValueError, match=r"^k_sf_cache: expected head_dim / 16 4 in the last dim"):
        call(q4, kk=nk, vv=nvv, k_sf_cache=nsf[0][:, :2], v_sf_cache=nsf[1])
    with pytest.raises(ValueError, match=r"^k_cache: expected head_dim / 2"):
        call(q4, kk=nk[:, :16], vv=nvv[:, :16], k_sf_cache=nsf[0], v_sf_cache=nsf[1])
    with pytest.raises(TypeError, match="^output: a float8_e4m3fn output needs a quantised"):
        call(q4, out=torch.empty(q4.shape, dtype=FP8_DTYPE))


def test_xqa_spec_decode_under_torch_compile(kernel_device, triton_backend):
    """q_seq_len > 1 traces whole (the rows view read from the strides, the batch decode's operator)."""
    from ..compiled import assert_close_to_eager, compile_backend, eager_and_compiled

    case = make_paged_kv([60, 19], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16, form="tuple",
                         device=kernel_device, seed=9)
    k, v, _ = pools(case, 64)
    q = torch.randn(2, 1, 4, 8, 64, dtype=torch.float16).to(kernel_device)
    lens = case.seq_lens.view(-1, 1)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=kernel_device)
    sem = torch.zeros(8, dtype=torch.uint32, device=kernel_device)

    def step(q, k, v, tables, lens):
        out = torch.empty_like(q)
        kvattn.xqa.xqa(q, k, v, tables, lens, out, ws, sem, 2, 16, q_seq_len=4)
        return out

    eager, got = eager_and_compiled(step, (q, k, v, case.block_tables, lens), compile_backend(ON_GPU))
    assert_close_to_eager(got, eager)


def test_rows_view_only_where_the_strides_allow():
    from kvattn.xqa import _rows_view

    t = torch.randn(3, 1, 4, 8, 64)
    assert _rows_view(t, (12, 8, 64)).data_ptr() == t.data_ptr()
    assert _rows_view(t.transpose(0, 2), (12, 8, 64)) is None
    assert _rows_view(torch.randn(4, 3, 8, 64)[:, :2], (8, 8, 64)) is None
    assert _rows_view(torch.randn(3, 1, 8, 64), (3, 8, 64)) is not None


def test_ragged_offsets_checked_in_debug_mode(monkeypatch):
    """xqa's q_cu_seq_lens under KVATTN_DEBUG=1: a run past q_seq_len is named against q_seq_len."""
    monkeypatch.setenv("KVATTN_DEBUG", "1")
    case = make_paged_kv([40, 9], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16, form="tuple")
    k, v, _ = pools(case, 64)
    q = torch.randn(5, 8, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="^q_cu_seq_lens: request 0 has 4 query rows, more than q_seq_len=3"):
        kvattn.xqa.xqa(q, k, v, case.block_tables, case.seq_lens.view(-1, 1), torch.empty_like(q),
                       torch.zeros(1 << 20, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint32), 2, 16,
                       q_seq_len=3, q_cu_seq_lens=torch.tensor([0, 4, 5], dtype=torch.int32))
