"""Triton paged causal prefill (``trtllm_batch_context_with_kv_cache``) against the oracles.

Every case draws fresh random inputs (NaN in every cache slot no request uses, permuted pages,
wild page ids past each request's last page), poisons the output, runs the public function on the
Triton backend and on the reference backend, and compares both with the float64 dense formulation
(:func:`kvattn.dense.context`); the tolerance is scaled to the reference's own rounding error (see
``test_decode.assert_matches``). NVFP4 outputs are compared after dequantisation, and the kernel's
quantiser is checked bit for bit against ``formats.quantize_nvfp4_output`` on the same float32 values.

On a CPU machine the kernels run in Triton's interpreter: only the cases marked ``interp`` run
there (float16, small shapes, 16 x 16 tiles); a GPU runs the whole grid with its real tiles.
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

import kvattn
from kvattn._formats_table import BY_NAME
from kvattn._inputs import MIN_WORKSPACE_BYTES
from kvattn.formats import FP8_DTYPE, FP8_MAX, FP4Tensor, dequantize_nvfp4_output, quantize_nvfp4_output
from kvattn.ops.prefill import configs as prefill_configs
from kvattn.ops.prefill import plan as prefill_launch
from kvattn.ops.common import quantize_nvfp4_rows
from kvattn.testing import make_paged_kv, poison_, relative_error

from ..compiled import assert_close_to_eager, compile_backend, eager_and_compiled
from ..oracle import GPU_ONLY, ON_GPU, assert_matches, cpu, dense, off_by_one, run_both



def cum(values, dtype=torch.int32):
    out = [0]
    for v in values:
        out.append(out[-1] + int(v))
    return torch.tensor(out, dtype=dtype)


def cpu_fp4(t: FP4Tensor) -> FP4Tensor:
    """A CPU copy of an NVFP4 output (``cpu`` moves plain tensors only), to compare with the oracle."""
    return FP4Tensor(t.data.cpu(), t.scale.cpu(), t.scale_start_index, t.original_shape)


def random_query(rows, hq, d, dtype, gen, scale=1.0, shared=0.0):
    """``shared > 0``: every row is one random vector per head (times ``shared``) plus small noise,
    so the rows of a query tile agree on which key tiles matter (skip-softmax cases)."""
    x = torch.randn(rows, hq, d, generator=gen) * scale
    if shared:
        x = x * 0.1 + torch.randn(1, hq, d, generator=gen) * shared
    if dtype == FP8_DTYPE:
        return x.clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return x.to(dtype)


def prefill_case(
    device, monkeypatch, *, lens, lq, hkv=2, group=4, d=64, page=16, layout="HND", form="stacked", fmt=None,
    qdt=torch.float16, window=-1, sinks=False, tensor_scales=False, out_kind=None, o_sf_scale=None, split=False,
    skip=None, seed=0, max_q_len=None, cum_dtype=torch.int32, uint32=False, q_scale=1.0, q_shared=0.0, bmm1=None,
    bmm2=None, tiles=None, misalign=None, ws_bytes=1 << 16, causal=True, q_pad=0,
):
    """Build one random case, run both backends and the dense oracle, and compare.

    ``out_kind``: None (the query's dtype, or bf16 for an fp8 query), a torch dtype, or ``"nvfp4"``.
    ``tiles``: ``(BLOCK_M, BLOCK_N)`` of the interpreter's table for this case (CPU only: tiles
    holding several pages, or parts of one, with the small pages the interpreter can afford).
    ``misalign``: ``"kv"`` / ``"sf"`` copies the cache / the NVFP4 block scales to one byte past a
    4-byte boundary, so a GPU reads them byte by byte instead of as words.
    ``ws_bytes``: the workspace's size (a quantised cache's pages are staged in it where they fit,
    ``ops.prefill.staging``; the default 64 KB fits none of the GPU cases).
    ``q_pad``: the query as a view of rows ``q_pad`` elements longer (its token and head strides
    grow, its last dim stays contiguous).
    ``causal=False``: bidirectional (FlashInfer 0.7.2.post1), against the dense oracle's own
    ``causal=False`` (checked against one-row requests in ``tests/test_dense.py``).
    """
    if tiles is not None and not ON_GPU:
        from kvattn.ops.prefill import configs as prefill_configs

        table = {key: prefill_configs.PrefillConfig(*tiles, 4, 1) for key in prefill_configs.TABLES["interpreter"]}
        monkeypatch.setitem(prefill_configs.TABLES, "interpreter", table)
    half = qdt if qdt != FP8_DTYPE else torch.bfloat16
    fmt = fmt or {torch.float16: "float16", torch.bfloat16: "bfloat16", FP8_DTYPE: "fp8"}[qdt]
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=half, kv_format=fmt,
                         layout=layout, form=form, device=device, seed=seed, split_tables=split)
    if misalign is not None:
        name = {"kv": "kv_cache", "sf": "kv_cache_sf"}[misalign]
        t = getattr(case, name)
        setattr(case, name, tuple(off_by_one(x) for x in t) if isinstance(t, tuple) else off_by_one(t))
    g = torch.Generator().manual_seed(200 + seed)
    hq = hkv * group
    q = random_query(sum(lq), hq, d, qdt, g, q_scale, q_shared).to(device)
    if q_pad:
        rows = torch.empty(*q.shape[:2], d + q_pad, dtype=q.dtype, device=device)
        rows[..., :d] = q
        q = rows[..., :d]
    sinks_t = (torch.randn(hq, generator=g) * 2).to(device) if sinks else None
    k_scale, v_scale = (0.7, 1.3) if fmt in ("fp8", "nvfp4") else (1.0, 1.0)
    bmm1 = bmm1 if bmm1 is not None else 1.5 / math.sqrt(d) * k_scale
    bmm2 = bmm2 if bmm2 is not None else v_scale
    scales = (bmm1, bmm2)
    if tensor_scales:
        scales = tuple(torch.tensor([x], dtype=torch.float32, device=device) for x in scales)
    cq = cum(lq, cum_dtype).to(device)
    ckv = cum(lens).to(device)
    seq_lens = case.seq_lens.to(torch.uint32) if uint32 else case.seq_lens
    mq = max(lq) if max_q_len is None else max_q_len
    mkv = max(lens + [mq])
    kind = out_kind or (torch.bfloat16 if qdt == FP8_DTYPE else qdt)
    kw = dict(window_left=window, sinks=sinks_t, kv_layout=layout, kv_block_scales=case.kv_cache_sf,
              uses_shared_paged_kv_idx=not split, skip_softmax_threshold_scale_factor=skip)

    def call():
        ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)
        if kind == "nvfp4":
            out = FP4Tensor.empty(q.shape[0], hq, d, device, scale_start_index=3)
            poison_(out.data)
        else:
            out = poison_(torch.empty(q.shape, dtype=kind, device=device))
        extra = {} if causal else dict(causal=False)
        got = kvattn.prefill.trtllm_batch_context_with_kv_cache(
            q, case.kv_cache, ws, case.block_tables, seq_lens, mq, mkv, scales[0], scales[1], len(lens), cq, ckv,
            out=out, o_sf_scale=o_sf_scale, **kw, **extra)
        assert got is out
        return out

    out, ref_out = run_both(call, monkeypatch)
    exact = dense.context(cpu(q), cpu(case.kv_cache), cpu(case.block_tables), cpu(case.seq_lens), cpu(cq),
                          bmm1, bmm2, causal=causal, **{k: cpu(v) for k, v in kw.items()})
    if skip:  # not vacuous: some tiles are skipped (the float64 oracle's result moves at all)
        kw_exact = {k: cpu(v) for k, v in kw.items() if k != "skip_softmax_threshold_scale_factor"}
        full = dense.context(cpu(q), cpu(case.kv_cache), cpu(case.block_tables), cpu(case.seq_lens), cpu(cq), bmm1,
                             bmm2, **kw_exact)
        assert relative_error(exact, full) > 1e-9, "no tile skipped: the case tests nothing"
    if kind == "nvfp4":
        s = 1.0 if o_sf_scale is None else o_sf_scale
        got, ref = dequantize_nvfp4_output(cpu_fp4(out), s), dequantize_nvfp4_output(cpu_fp4(ref_out), s)
        assert torch.isfinite(got).all()
        err, ref_err = relative_error(got, exact), relative_error(ref, exact)
        # Both carry e2m1's rounding (~5 % of a value); the kernel's float32 values differ from the
        # reference's by its 16-bit P operand, which moves a few codes across a rounding boundary.
        assert err <= 1.1 * ref_err + 4e-3, f"relative error {err:.3g} (reference {ref_err:.3g})"
        same = (cpu(out.data) == cpu(ref_out.data)).double().mean().item()
        assert same >= 0.9, f"only {same:.3f} of the packed bytes equal the reference's"
        for b, n in enumerate(lens):
            if n == 0 and lq[b]:
                rows = slice(int(cq[b]), int(cq[b + 1]))
                assert (got[rows] == 0).all(), f"empty request {b}: rows not zero"
        return out
    if out.numel():
        assert_matches(out, ref_out, exact)
    for b, n in enumerate(lens):
        if n == 0:
            rows = slice(int(cq[b]), int(cq[b + 1]))
            assert (out[rows].float() == 0).all(), f"empty request {b}: rows not zero"
    return out


def param(id, interp=False, **kw):
    return pytest.param(kw, id=id, marks=() if interp else GPU_ONLY)


# Lq = 1, Lq < L (L not a multiple of the page or the tile), an empty request, Lq = L, no queries.
SMALL_LENS, SMALL_LQ = [1, 37, 0, 40, 20], [1, 10, 0, 40, 0]
# (the dense oracle pads to [B, Hq, max Lq, max L] float64 on the CPU: keep that product small)
GPU_LENS, GPU_LQ = [1, 300, 0, 777, 1029, 64], [1, 300, 0, 129, 700, 0]

CASES = [
    # --- the interpreter subset -------------------------------------------------------------
    param("fp16-HND-stacked-p16-D64-G4", True, lens=SMALL_LENS, lq=SMALL_LQ),
    param("fp16-NHD-tuple-p32-G2-split-tables", True, lens=SMALL_LENS, lq=SMALL_LQ, layout="NHD", form="tuple",
          page=32, group=2, split=True),
    param("fp16-window5-sinks-tensor-scales", True, lens=SMALL_LENS, lq=SMALL_LQ, window=5, sinks=True,
          tensor_scales=True, uint32=True),
    param("fp8kv-fp8-out", True, lens=SMALL_LENS, lq=SMALL_LQ, fmt="fp8", out_kind=FP8_DTYPE, bmm2=2.0),
    param("nvfp4kv-NHD-shared-nvfp4-out", True, lens=SMALL_LENS, lq=SMALL_LQ, fmt="nvfp4", layout="NHD",
          form="shared", out_kind="nvfp4", o_sf_scale=0.5),
    # tiles of 2 / 4 whole pages (one table entry a page), of 8 pages (per-token ids), of part of a page
    param("fp16-HND-p16-tile32-2-pages", True, lens=SMALL_LENS, lq=SMALL_LQ, tiles=(16, 32)),
    param("fp16-NHD-p8-tile32-4-pages-split-tables", True, lens=SMALL_LENS, lq=SMALL_LQ, layout="NHD", page=8,
          tiles=(16, 32), split=True, window=9),
    param("fp16-HND-p4-tile32-8-pages", True, lens=SMALL_LENS, lq=SMALL_LQ, page=4, tiles=(32, 32)),
    param("fp16-HND-p64-tile32", True, lens=[70, 100], lq=[70, 33], page=64, tiles=(16, 32)),
    param("fp16-negative-bmm1", True, lens=SMALL_LENS, lq=SMALL_LQ, bmm1=-0.2, sinks=True),
    param("fp16-negative-tensor-bmm1", True, lens=SMALL_LENS, lq=SMALL_LQ, bmm1=-0.2, tensor_scales=True),
    param("fp8q-fp8kv-D128-G8-int64-cum", True, lens=[33, 18], lq=[17, 18], d=128, hkv=1, group=8, qdt=FP8_DTYPE,
          fmt="fp8", cum_dtype=torch.int64, max_q_len=24),
    # --- GPU grid -------------------------------------------------------------------------------
    *[param(f"bf16-{layout}-{form}-p{page}", lens=GPU_LENS, lq=GPU_LQ, layout=layout, form=form, page=page,
            qdt=torch.bfloat16, seed=page)
      for layout in ("NHD", "HND") for form in ("stacked", "shared", "tuple") for page in (16, 32, 64, 128)],
    *[param(f"fp16-HND-p{page}", lens=GPU_LENS, lq=GPU_LQ, page=page, seed=page) for page in (16, 64)],
    *[param(f"bf16-D{d}-G{g}", lens=[1, 77, 513, 700], lq=[1, 77, 300, 700], d=d, group=g, hkv=max(1, 8 // g),
            qdt=torch.bfloat16, seed=d + g)
      for d in (64, 128, 256) for g in (1, 2, 4, 8, 16, 32)],
    *[param(f"bf16-window{w}-p{page}", lens=[1, 16, 17, 64, 65, 200, 1100], lq=[1, 16, 10, 64, 1, 200, 900],
            window=w, page=page, qdt=torch.bfloat16, sinks=w % 2 == 1, seed=w)
      for w in (0, 1, 15, 16, 63, 64, 127, 128, 199, 1000, 5000) for page in (16, 64)],
    *[param(f"{fmt}-kv-{dt}-q-{layout}-p{page}-D{d}", lens=GPU_LENS, lq=GPU_LQ, fmt=fmt, layout=layout, page=page,
            d=d, qdt=getattr(torch, dt), seed=page + d)
      for fmt in ("fp8", "nvfp4") for dt in ("bfloat16", "float16") for layout in ("NHD", "HND")
      for page in (16, 64) for d in ((64, 128, 256) if dt == "bfloat16" else (128,))],
    *[param(f"fp8q-{fmt}-kv-{layout}-p{page}-D{d}-out-{out}", lens=GPU_LENS, lq=GPU_LQ, fmt=fmt, layout=layout,
            page=page, d=d, qdt=FP8_DTYPE, out_kind=getattr(torch, out) if out != "fp8" else FP8_DTYPE, seed=d)
      for fmt in ("fp8", "nvfp4") for layout in ("NHD", "HND") for page in (16, 64) for d in (64, 128, 256)
      for out in (("bfloat16", "fp8") if d == 128 else ("bfloat16",))],
    *[param(f"{dt}-out-fp8-{'tensor' if ts else 'float'}-scales", lens=GPU_LENS, lq=GPU_LQ, qdt=getattr(torch, dt),
            out_kind=FP8_DTYPE, tensor_scales=ts, bmm2=b2)
      for dt in ("bfloat16", "float16") for ts in (False, True) for b2 in (0.25, 4.0)],
    *[param(f"nvfp4-out-{kv}-sf{s}-D{d}", lens=GPU_LENS, lq=GPU_LQ, fmt=kv, qdt=torch.bfloat16, out_kind="nvfp4",
            o_sf_scale=s, d=d, seed=d)
      for kv in ("bfloat16", "fp8", "nvfp4") for s in (None, 0.05, 20.0) for d in (64, 128, 256)],
    *[param(f"bf16-split-tables-{form}-{layout}-p{page}", lens=GPU_LENS, lq=GPU_LQ, split=True, form=form,
            layout=layout, page=page, qdt=torch.bfloat16, window=500, sinks=True)
      for form in ("stacked", "tuple") for layout in ("NHD", "HND") for page in (16, 64)],
    # 16-bit pages of 64 / 128 tokens: K/V tiles by TMA (any head dim and group, both layouts)
    *[param(f"bf16-tma-{layout}-{form}-p{page}-D{d}-G{g}", lens=[1, 77, 513, 700, 64], lq=[1, 77, 300, 700, 0], d=d,
            group=g, hkv=max(1, 8 // g), layout=layout, form=form, page=page, qdt=torch.bfloat16, seed=d + g + page)
      for layout in ("NHD", "HND") for form, page in (("stacked", 64), ("tuple", 128))
      for d in (64, 128, 256) for g in (1, 4, 8)],
    param("fp16-tma-window-sinks-split-tables-fp8-out", lens=GPU_LENS, lq=GPU_LQ, page=64, layout="NHD", form="tuple",
          split=True, window=100, sinks=True, out_kind=FP8_DTYPE, tensor_scales=True),
    # fp8 / NVFP4 caches off a 4-byte boundary: the byte paths (aligned caches read words on a GPU)
    *[param(f"{fmt}-kv-bf16-q-{form}-misaligned-{what}", lens=GPU_LENS, lq=GPU_LQ, fmt=fmt, form=form, d=128,
            qdt=torch.bfloat16, misalign=what, seed=5)
      for fmt, what in (("fp8", "kv"), ("nvfp4", "kv"), ("nvfp4", "sf")) for form in ("stacked", "tuple")],
    param("bf16-Hq32-Hkv8-D128-p64-HND", lens=[2000, 300], lq=[700, 1], hkv=8, d=128, page=64, qdt=torch.bfloat16),
    param("fp8q-fp8kv-Hq32-Hkv8-D128-p64-HND", lens=[2000, 300], lq=[700, 1], hkv=8, d=128, page=64, qdt=FP8_DTYPE),
    param("bf16-G32-Hkv1-D128", lens=[1200, 100], lq=[1200, 5], hkv=1, group=32, d=128, qdt=torch.bfloat16),
    param("bf16-negative-bmm1-p64", lens=GPU_LENS, lq=GPU_LQ, page=64, qdt=torch.bfloat16, bmm1=-0.15),
    param("fp8q-fp8kv-negative-bmm1-D128", lens=GPU_LENS, lq=GPU_LQ, d=128, fmt="fp8", qdt=FP8_DTYPE, bmm1=-0.1),
    param("bf16-max_q_len-above-lengths", lens=[100, 30], lq=[50, 30], max_q_len=100, qdt=torch.bfloat16),
    param("bf16-tensor-scales-uint32-int64-cum", lens=GPU_LENS, lq=GPU_LQ, tensor_scales=True, uint32=True,
          cum_dtype=torch.int64, qdt=torch.bfloat16),
]


# causal=False (FlashInfer 0.7.2.post1): each row sees all its request's keys, on both kernels (the
# Gluon one on Hopper for 16-bit and fp8 pages of 64 tokens, the Triton one elsewhere).
CAUSAL_FALSE_CASES = [
    param("noncausal-fp16-HND-p16-D64", True, lens=SMALL_LENS, lq=SMALL_LQ, causal=False),
    param("noncausal-fp16-NHD-tuple-sinks-tile32", True, lens=SMALL_LENS, lq=SMALL_LQ, layout="NHD", form="tuple",
          sinks=True, tiles=(16, 32), causal=False),
    param("noncausal-nvfp4kv-tensor-scales", True, lens=[19, 33], lq=[3, 33], fmt="nvfp4", tensor_scales=True,
          causal=False),
    *[param(f"noncausal-bf16-{layout}-p{page}-D{d}", lens=GPU_LENS, lq=GPU_LQ, layout=layout, page=page, d=d,
            qdt=torch.bfloat16, causal=False, seed=d + page)
      for layout in ("NHD", "HND") for page in (16, 64) for d in (64, 128, 256)],
    *[param(f"noncausal-{fmt}-kv-{dt}-q-p64", lens=GPU_LENS, lq=GPU_LQ, fmt=fmt, page=64, d=128,
            qdt=FP8_DTYPE if dt == "fp8" else torch.bfloat16, causal=False, ws_bytes=64 << 20)
      for fmt in ("fp8", "nvfp4") for dt in ("bf16", "fp8") if not (fmt == "nvfp4" and dt == "fp8")],
    param("noncausal-bf16-split-tables-sinks-lse-G8", lens=GPU_LENS, lq=GPU_LQ, split=True, sinks=True, group=8,
          hkv=1, d=128, page=64, qdt=torch.bfloat16, causal=False),
]


@pytest.mark.parametrize("kw", CAUSAL_FALSE_CASES)
def test_causal_false_matches_oracles(kw, kernel_device, triton_backend, monkeypatch):
    prefill_case(kernel_device, monkeypatch, **kw)


@pytest.mark.parametrize("kw", CASES)
def test_context_matches_oracles(kw, kernel_device, triton_backend, monkeypatch):
    prefill_case(kernel_device, monkeypatch, **kw)


# Skip-softmax: the rows of a tile share most of their query (q_shared), so they agree on which key
# tiles fall under f / L; the dense oracle re-derives which tiles are kept from SPEC, and each case
# checks that some are skipped.
SKIP_CASES = [
    param("skip-fp16-D64", True, lens=[300, 140, 0], lq=[300, 20, 0], hkv=1, group=2, skip=4.0, q_shared=8.0),
    *[param(f"skip-bf16-D{d}-f{f}-{layout}-p{page}", lens=[1, 700, 129, 1300, 256], lq=[1, 700, 1, 1000, 200],
            d=d, skip=f, layout=layout, page=page, qdt=torch.bfloat16, q_shared=8.0, seed=d)
      for d in (64, 128, 256) for f in (0.5, 8.0) for layout in ("HND", "NHD") for page in (16, 64)],
    param("skip-window-sinks", lens=[700, 1300], lq=[700, 1000], window=300, sinks=True, skip=4.0,
          qdt=torch.bfloat16, q_shared=8.0),
    param("skip-fp8kv-nvfp4-out", lens=[700, 1300], lq=[700, 1000], fmt="fp8", skip=4.0, qdt=torch.bfloat16,
          q_shared=8.0, out_kind="nvfp4"),
    param("skip-fp8q-fp8kv", lens=[700, 1300], lq=[700, 1000], d=128, fmt="fp8", skip=4.0, qdt=FP8_DTYPE,
          q_shared=8.0),
]


@pytest.mark.parametrize("kw", SKIP_CASES)
def test_skip_softmax_matches_oracles(kw, kernel_device, triton_backend, monkeypatch):
    prefill_case(kernel_device, monkeypatch, **kw)


def test_empty_batch_and_empty_requests(kernel_device, triton_backend, monkeypatch):
    prefill_case(kernel_device, monkeypatch, lens=[0, 0, 5], lq=[0, 0, 0], sinks=True)
    prefill_case(kernel_device, monkeypatch, lens=[0, 7], lq=[0, 7], sinks=True)


# ---------------------------------------------------------------------------------------------
# the NVFP4 output quantiser, bit for bit
# ---------------------------------------------------------------------------------------------
@triton.jit
def _quantize_rows_kernel(y_ptr, data_ptr, sf_ptr, sf_div, M: tl.constexpr, D: tl.constexpr):
    offs_m = tl.arange(0, M)
    y = tl.load(y_ptr + offs_m[:, None] * D + tl.arange(0, D)[None, :])
    packed, sf = quantize_nvfp4_rows(y, sf_div, D // 16)
    tl.store(data_ptr + offs_m[:, None] * (D // 2) + tl.arange(0, D // 2)[None, :], packed)
    tl.store(sf_ptr + offs_m[:, None] * (D // 16) + tl.arange(0, D // 16)[None, :], sf)


@pytest.mark.parametrize("o_sf_scale", [1.0, 0.05, 20.0, 3.0], ids=lambda s: f"o_sf_scale{s}")
def test_nvfp4_quantiser_is_bit_exact(o_sf_scale, kernel_device):
    """``quantize_nvfp4_rows`` = ``formats.quantize_nvfp4_output`` on the same float32 values: random
    values, exact e2m1 midpoints (ties), zero and tiny blocks, blocks past the e4m3 range."""
    m, d = 32, 64
    g = torch.Generator().manual_seed(5)
    y = torch.randn(m, d, generator=g) * torch.exp(torch.randn(m, 1, generator=g) * 3)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0,
                         -6.0])
    y[0, :16] = mids / o_sf_scale  # block amax 6: sf = 1 exactly, every element on a tie
    y[1, :16] = mids / o_sf_scale * 2.0**-6
    y[2, :16] = 0.0
    y[3, :16] = 1e-9
    y[4, :16] = 1e5 / o_sf_scale  # sf saturates at 448
    y[5] = y[5] * 1e-3
    out = FP4Tensor.empty(m, 1, d, "cpu")
    quantize_nvfp4_output(y.view(m, 1, d), o_sf_scale, out)
    want_sf = dequant_scales(out, m, d)
    data = torch.empty(m, d // 2, dtype=torch.uint8, device=kernel_device)
    sf = torch.empty(m, d // 16, dtype=torch.float32, device=kernel_device)
    _quantize_rows_kernel[(1,)](y.to(kernel_device), data, sf, 1.0 / o_sf_scale, M=m, D=d)
    assert torch.equal(data.cpu(), out.data.view(m, d // 2))
    assert torch.equal(sf.cpu(), want_sf)


def dequant_scales(t: FP4Tensor, rows: int, d: int) -> torch.Tensor:
    from kvattn.formats import swizzled_scale_offset

    mm = torch.arange(rows).unsqueeze(1) + t.scale_start_index
    kk = torch.arange(d // 16).unsqueeze(0)
    off = swizzled_scale_offset(mm, kk, t.scale.shape[1])
    return t.scale.view(torch.uint8).reshape(-1)[off.reshape(-1)].view(FP8_DTYPE).float().view(rows, d // 16)


# ---------------------------------------------------------------------------------------------
# which path a quantised cache takes, and its table entry
# ---------------------------------------------------------------------------------------------
def returns_of(monkeypatch, module, name: str) -> list:
    """What ``module.name`` returns from now on (the launcher's choices, as they are made)."""
    returned, real = [], getattr(module, name)

    def spy(*args, **kwargs):
        returned.append(real(*args, **kwargs))
        return returned[-1]

    monkeypatch.setattr(module, name, spy)
    return returned


def kernel_launches(monkeypatch, module, name: str) -> list:
    """The launches of the kernel ``module.name`` from now on (one entry a launch: its
    ``fast_launch.Launch``; calls replayed from their metadata launch without one)."""
    from kvattn.runtime import fast_launch

    launched, real = [], fast_launch.Launch.__call__

    def spy(self, call):
        if self.kernel is getattr(module, name):
            launched.append(self)
        return real(self, call)

    monkeypatch.setattr(fast_launch.Launch, "__call__", spy)
    return launched


@pytest.mark.parametrize("qdt,fmt,off_by_one,expected", [
    (torch.bfloat16, "fp8", None, BY_NAME["fp8"].words_code),
    (torch.bfloat16, "fp8", "kv", 1),
    (torch.bfloat16, "nvfp4", None, BY_NAME["nvfp4"].words_code),
    (torch.bfloat16, "nvfp4", "sf", 2),
    (FP8_DTYPE, "fp8", None, 1),  # fp8 scores take the copied bytes
], ids=["fp8-aligned-words", "fp8-misaligned-bytes", "nvfp4-aligned-words", "nvfp4-scales-misaligned-bytes",
        "fp8q-fp8kv-bytes"])
@pytest.mark.skipif(not ON_GPU, reason="words formats run on compiled kernels only")
def test_quantised_caches_read_as_words_where_aligned(qdt, fmt, off_by_one, expected, triton_backend, monkeypatch):
    """The aligned GPU cases of the grid above run the words path, the misaligned ones the byte
    path: the launcher's choice, seen as it is made (and the output still checked). The Triton
    kernel's choice: the Gluon kernel, which takes fp8 caches on Hopper (test_gluon_ws), is
    switched off."""
    monkeypatch.setenv("KVATTN_GLUON", "0")
    chosen = returns_of(monkeypatch, prefill_launch, "kv_format_code")
    prefill_case(torch.device("cuda"), monkeypatch, lens=[1, 300, 77], lq=[1, 200, 77], fmt=fmt, d=128, qdt=qdt,
                 misalign=off_by_one, seed=3)
    assert chosen and set(chosen) == {expected}


@pytest.mark.parametrize("layout,form,page,tma", [
    ("HND", "stacked", 64, True), ("NHD", "tuple", 128, True), ("NHD", "shared", 64, True), ("HND", "tuple", 16, False),
], ids=["HND-stacked-p64", "NHD-tuple-p128", "NHD-shared-p64", "HND-p16-gathers"])
@pytest.mark.skipif(not ON_GPU, reason="TMA on compiled kernels only")
def test_16_bit_pages_read_by_tma_where_tiles_fit(layout, form, page, tma, triton_backend, monkeypatch):
    """Pages holding whole 64-token tiles are read by TMA, smaller ones gathered: the launcher's
    choice, seen as it is made (the output still checked). The Triton kernel's choice: the Gluon
    kernel (test_gluon_ws) is switched off."""
    monkeypatch.setenv("KVATTN_GLUON", "0")
    chosen = returns_of(monkeypatch, prefill_launch, "tma_views")
    prefill_case(torch.device("cuda"), monkeypatch, lens=[1, 300, 77], lq=[1, 200, 77], d=128, qdt=torch.bfloat16,
                 layout=layout, form=form, page=page, seed=4)
    assert len(chosen) == 1 and (chosen[0] is not None) == tma


@pytest.mark.parametrize("qdt,fmt,page,tma", [
    (FP8_DTYPE, "fp8", 64, True), (FP8_DTYPE, "fp8", 16, False), (torch.bfloat16, "fp8", 64, False),
    (torch.bfloat16, "nvfp4", 64, False),
], ids=["fp8q-p64-tma", "fp8q-p16-gathers", "bf16q-p64-gathers", "nvfp4-p64-gathers"])
@pytest.mark.skipif(not ON_GPU, reason="TMA on compiled kernels only")
def test_fp8_pages_read_by_tma_with_fp8_scores(qdt, fmt, page, tma, triton_backend, monkeypatch):
    """fp8 pages holding whole tiles are read by TMA when the scores are fp8 (an fp8 query: the
    tile feeds the fp8 product as it lands); a 16-bit query's tiles and NVFP4 pages gather. The
    Triton kernel's choice: the Gluon kernel is switched off (it would take the fp8 launches)."""
    monkeypatch.setenv("KVATTN_GLUON", "0")
    chosen = returns_of(monkeypatch, prefill_launch, "tma_views")
    prefill_case(torch.device("cuda"), monkeypatch, lens=[1, 300, 77], lq=[1, 200, 77], d=128, qdt=qdt, fmt=fmt,
                 layout="HND", page=page, seed=6)
    assert (len(chosen) == 1 and chosen[0] is not None) == tma


@pytest.mark.parametrize("capability,expected", [((9, 0), True), ((10, 0), True), ((8, 9), False), ((8, 0), False)],
                         ids=["H100", "sm100", "sm89", "A100"])
def test_tma_needs_sm90(capability, expected, monkeypatch):
    """The launcher reads pages by TMA on sm_90 and later only (older GPUs gather)."""
    monkeypatch.setattr(kvattn.runtime.device, "capability", lambda device: capability)
    assert kvattn.runtime.device.has_tma(torch.device("cuda", 0)) == expected


def test_tma_views_of_each_page_form():
    """Host side of the TMA path: which caches TMA reads, and the [pages, rows, cols] view and box
    each gets (HND: a head's slots are rows; NHD: heads side by side in a row)."""
    P, S, H, D = 6, 64, 2, 128
    hnd = torch.zeros(P, 2, H, S, D, dtype=torch.bfloat16)  # stacked HND; the launcher's NHD views:
    k, v = hnd[:, 0].transpose(1, 2), hnd[:, 1].transpose(1, 2)
    kd, vd, rows, cols = prefill_launch.tma_views(k, v, 64)  # (descriptors each launch builds on K, V)
    assert (rows, cols) == (S, 0) and list(kd.shape) == [P, H * S, D] and list(kd.block_shape) == [1, 64, D]
    assert list(kd.strides) == [2 * H * S * D, D, 1] and (kd.tensor, vd.tensor) == ("k", "v")
    assert list(vd.strides) == [2 * H * S * D, D, 1]
    assert vd.make(v).base.data_ptr() == v.data_ptr() and list(vd.make(v).shape) == [P, H * S, D]
    nhd = torch.zeros(P, S, H, D, dtype=torch.float16)
    kd, _, rows, cols = prefill_launch.tma_views(nhd, nhd, 64)
    assert (rows, cols) == (0, D) and list(kd.shape) == [P, S, H * D] and list(kd.strides) == [S * H * D, H * D, 1]
    assert prefill_launch.tma_views(k, v, 128) is None  # a tile would span pages
    assert prefill_launch.tma_views(k, nhd.to(torch.bfloat16), 64) is None  # K and V in different forms
    flat = torch.zeros(P * S * H * D + 8, dtype=torch.bfloat16)
    odd = flat[1:1 + P * S * H * D].view(P, S, H, D)  # 2 bytes off a 16-byte boundary
    assert prefill_launch.tma_views(odd, odd, 64) is None


@pytest.mark.parametrize("kv_dtype,qdt,kind", [
    (torch.bfloat16, torch.bfloat16, "half"), (torch.float16, torch.float16, "half"),
    (FP8_DTYPE, torch.bfloat16, "fp8"), (torch.uint8, torch.bfloat16, "nvfp4"),
    (torch.uint8, FP8_DTYPE, "nvfp4"),
])
def test_table_entry_per_cache_format(kv_dtype, qdt, kind, monkeypatch):
    """fp8 and NVFP4 caches have their own entries (their best tiles differ at D 64), present for
    every head dim in every table."""
    for arch, table in prefill_configs.TABLES.items():
        assert {k for k, _ in table} == {"half", "fp8", "nvfp4", "fp8qk"}, arch
        assert all((k, d) in table for k in ("half", "fp8", "nvfp4", "fp8qk") for d in (64, 128, 256)), arch
    cfgs = returns_of(monkeypatch, prefill_configs, "config")
    cfg, qk_fp8, got_kind = prefill_launch.config_of(qdt, kv_dtype, 128, False, torch.device("cpu"), False)
    # (the entry itself: entries of different kinds may hold equal values)
    assert len(cfgs) == 1 and cfg is cfgs[0] is prefill_configs.TABLES["default"][(kind, 128)] and not qk_fp8
    assert got_kind == kind


def test_tma_table_kinds():
    """TMA tiles exist for 16-bit caches and for fp8 scores at every head dim; none for a 16-bit
    query over fp8 or NVFP4 pages (their gathered words were as fast) or with skip-softmax."""
    for kind in ("half", "fp8qk"):
        for d in (64, 128, 256):
            assert prefill_configs.config("sm90", kind, d, tma=True) is not None, (kind, d)
            assert prefill_configs.config("sm90", kind, d, skip=True, tma=True) is None
    assert prefill_configs.config("sm90", "nvfp4", 128, tma=True) is None
    assert prefill_configs.config("sm90", "fp8", 128, tma=True) is None
    assert prefill_configs.config("default", "half", 128, tma=True) is None


# ---------------------------------------------------------------------------------------------
# corrupt tables, CUDA graphs, torch.compile
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", [16, 64], ids=["gather-p16", "tma-p64"])
def test_page_ids_outside_the_cache_are_never_read(page, kernel_device, triton_backend, monkeypatch):
    """A corrupt used table entry (huge or negative) neither faults nor leaks NaN; the other
    request is unaffected (gathered tiles, and on a GPU TMA tiles). The device-value checks (on by
    default for CPU tensors) would report the entry: they are off here."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    case = make_paged_kv([40, 50], num_kv_heads=2, head_dim=64, page_size=page, dtype=torch.float16,
                         layout="HND", device=kernel_device, seed=9)
    q = torch.randn(20, 8, 64).to(kernel_device, torch.float16)
    cq, ckv = cum([10, 10]).to(kernel_device), cum([40, 50]).to(kernel_device)
    ws = torch.zeros(MIN_WORKSPACE_BYTES, dtype=torch.uint8, device=kernel_device)  # too small to stage

    def call(tables):
        return kvattn.prefill.trtllm_batch_context_with_kv_cache(
            q, case.kv_cache, ws, tables, case.seq_lens, 10, 50, 0.125, 1.0, 2, cq, ckv)

    good = call(case.block_tables)
    tables = case.block_tables.clone()
    tables[0, 0], tables[0, 1] = 2**31 - 1, -(2**31)
    out = call(tables)
    if ON_GPU:
        torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    assert torch.equal(out[10:], good[10:])
    assert not torch.equal(out[:10], good[:10])


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("out_kind,page,tensor_scale,fmt", [
    ("bf16", 16, True, None), ("nvfp4", 16, True, None), ("bf16", 64, True, None), ("bf16", 64, False, None),
    ("bf16", 64, True, "fp8"), ("bf16", 16, False, "nvfp4"),
], ids=["bf16-p16", "nvfp4-p16", "bf16-p64-tma-device-scale", "bf16-p64-tma-float-scale",
        "bf16q-fp8kv-p64-staged", "bf16q-nvfp4kv-p16-staged"])
def test_cuda_graph_replay_follows_new_lengths_and_tables(out_kind, page, tensor_scale, fmt, triton_backend,
                                                          monkeypatch):
    """Capture one call; write new lengths, query offsets, tables and cache in place; replay (pages
    of 64: TMA tiles, whose descriptors the graph holds; on Hopper the warp-specialised Gluon
    kernel's; a quantised cache's pages staged in the workspace first, by a launch the graph
    holds too); rows no request owns stay as they were."""
    from kvattn.runtime import device as _device, versions as _versions
    from kvattn.ops.prefill import plan_gluon_ws as prefill_ws
    from kvattn.ops.prefill import staging

    ws_launches = kernel_launches(monkeypatch, prefill_ws, "prefill_ws_kernel")
    stagings = kernel_launches(monkeypatch, staging, "stage_pages_kernel")
    for kind in prefill_configs.STAGE_MIN_ROWS:  # (staged whatever the rows)
        monkeypatch.setitem(prefill_configs.STAGE_MIN_ROWS, kind, 0)
    device = torch.device("cuda")
    hkv, group, d, width, pool = 2, 4, 128, 200, 600
    lens, lq = [700, 40, 2500, 0], [700, 1, 300, 0]

    def make(lens, seed):
        used = sum((n + page - 1) // page for n in lens)
        return make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.bfloat16,
                             kv_format=fmt, layout="HND", device=device, seed=seed, pages_per_seq=width,
                             extra_pages=pool - used)

    case = make(lens, 1)
    rows = 1200  # room for both steps' rows
    q = torch.randn(rows, hkv * group, d, device=device, dtype=torch.bfloat16)
    seq_lens, tables = case.seq_lens.clone(), case.block_tables.clone()
    cq = torch.zeros(5, dtype=torch.int32, device=device)
    cq.copy_(cum(lq))
    ckv = cum(lens).to(device)
    # (room for the staged pages of a quantised cache: 4 x 200 pages of 2 heads, K and V, 16-bit)
    ws = torch.zeros((1 << 20) + 4 * width * page * hkv * d * 4 if fmt else 1 << 20, dtype=torch.uint8, device=device)
    sinks = torch.randn(hkv * group, device=device)
    out = FP4Tensor.empty(rows, hkv * group, d, device) if out_kind == "nvfp4" else torch.empty_like(q)
    bmm1 = torch.tensor([0.1], device=device) if tensor_scale else 0.09

    def call():
        kvattn.prefill.trtllm_batch_context_with_kv_cache(
            q, case.kv_cache, ws, tables, seq_lens, 1000, width * page, bmm1, 1.0, 4, cq, ckv, out=out,
            sinks=sinks, kv_block_scales=case.kv_cache_sf)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    new_lens, new_lq = [1200, 0, 2400, 33], [1000, 0, 100, 33]
    new = make(new_lens, 2)
    case.kv_cache.copy_(new.kv_cache)
    if fmt == "nvfp4":
        case.kv_cache_sf.copy_(new.kv_cache_sf)
    seq_lens.copy_(new.seq_lens)
    tables.copy_(new.block_tables)
    cq.copy_(cum(new_lq))
    if tensor_scale:
        bmm1.fill_(0.09)
    if out_kind == "nvfp4":
        poison_(out.data)
    else:
        poison_(out)
    graph.replay()
    torch.cuda.synchronize()
    n = sum(new_lq)
    exact = dense.context(q[:n].cpu(), case.kv_cache.cpu(), tables.cpu(), seq_lens.cpu(), cq.cpu(), 0.09, 1.0,
                          sinks=sinks.cpu(), kv_block_scales=cpu(case.kv_cache_sf))
    if out_kind == "nvfp4":  # within e2m1's own rounding of the exact values
        got = dequantize_nvfp4_output(out)[:n].cpu()
        ideal = FP4Tensor.empty(n, hkv * group, d, "cpu")
        ideal = dequantize_nvfp4_output(quantize_nvfp4_output(exact.float(), 1.0, ideal))
        assert relative_error(got, exact) <= 1.1 * relative_error(ideal, exact) + 4e-3
    else:
        assert relative_error(out[:n].cpu(), exact) <= 1e-2
        assert torch.isnan(out[n:].float()).all()  # rows past the batch: untouched
    hopper = _device.is_hopper(device) and _versions.gluon_on()
    if out_kind == "bf16" and (page == 64 or fmt) and hopper:
        assert len(ws_launches) >= 2  # the warm-up call and the captured one
    if fmt and hopper:
        assert len(stagings) >= 2


def test_torch_compile_traces_the_public_function(kernel_device, triton_backend):
    lens, lq = [50, 3], [20, 3]
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16,
                         layout="HND", device=kernel_device, seed=3)
    q = torch.randn(23, 8, 64, device=kernel_device, dtype=torch.float16)
    cq, ckv = cum(lq).to(kernel_device), cum(lens).to(kernel_device)
    ws = torch.zeros(MIN_WORKSPACE_BYTES, dtype=torch.uint8, device=kernel_device)  # too small to stage

    def step(q, kv, tables, lens_t, cq):
        o = kvattn.prefill.trtllm_batch_context_with_kv_cache(q, kv, ws, tables, lens_t, 20, 50, 0.125, 1.0, 2,
                                                              cq, ckv, window_left=30)
        f = kvattn.prefill.trtllm_batch_context_with_kv_cache(q, kv, ws, tables, lens_t, 20, 50, 0.125, 1.0, 2,
                                                              cq, ckv, out_dtype="nvfp4")
        return o * 2, f.data, f.scale

    args = (q, case.kv_cache, case.block_tables, case.seq_lens, cq)
    eager, got = eager_and_compiled(step, args, compile_backend(ON_GPU))
    assert_close_to_eager(got[0], eager[0])
    assert torch.equal(got[1], eager[1]) and torch.equal(got[2].view(torch.uint8), eager[2].view(torch.uint8))


def test_torch_compile_traces_causal_false(kernel_device, triton_backend):
    """causal=False (FlashInfer 0.7.2.post1) goes through the traced operator (its schema carries
    the flag): the compiled call equals the eager one, and differs from the causal call."""
    lens, lq = [50, 3], [20, 3]
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16,
                         layout="HND", device=kernel_device, seed=5)
    q = torch.randn(23, 8, 64, device=kernel_device, dtype=torch.float16)
    cq, ckv = cum(lq).to(kernel_device), cum(lens).to(kernel_device)
    ws = torch.zeros(1 << 16, dtype=torch.uint8, device=kernel_device)

    def step(q, kv, tables, lens_t, cq):
        bidir = kvattn.prefill.trtllm_batch_context_with_kv_cache(q, kv, ws, tables, lens_t, 20, 50, 0.125, 1.0, 2,
                                                                  cq, ckv, causal=False)
        causal = kvattn.prefill.trtllm_batch_context_with_kv_cache(q, kv, ws, tables, lens_t, 20, 50, 0.125, 1.0, 2,
                                                                   cq, ckv)
        return bidir, causal

    args = (q, case.kv_cache, case.block_tables, case.seq_lens, cq)
    eager, got = eager_and_compiled(step, args, compile_backend(ON_GPU))
    assert_close_to_eager(got[0], eager[0])
    assert_close_to_eager(got[1], eager[1])
    assert not torch.allclose(got[0].float(), got[1].float(), atol=1e-2)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("page", [16, 64], ids=["p16-triton", "p64-tma-or-gluon"])
def test_cuda_graph_replay_causal_false(page, triton_backend):
    """causal=False captured once and replayed with new lengths, offsets and tables written in place."""
    device = torch.device("cuda")
    hkv, group, d, cap = 2, 4, 128, 2048  # cap: the tokens a table row holds
    lens, lq = [700, 40, 1500], [700, 1, 300]

    def make(lens, seed):
        used = sum((n + page - 1) // page for n in lens)
        return make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.bfloat16,
                             layout="HND", device=device, seed=seed, pages_per_seq=cap // page,
                             extra_pages=3 * cap // page - used)

    case = make(lens, 1)
    q = torch.randn(1100, hkv * group, d, device=device, dtype=torch.bfloat16)
    seq_lens, tables = case.seq_lens.clone(), case.block_tables.clone()
    cq = cum(lq).to(device)
    ckv = cum(lens).to(device)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    out = torch.empty_like(q)

    def call():
        kvattn.prefill.trtllm_batch_context_with_kv_cache(
            q, case.kv_cache, ws, tables, seq_lens, 1000, cap, 0.09, 1.0, 3, cq, ckv, out=out, causal=False)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    new_lens, new_lq = [1000, 33, 900], [1000, 33, 2]
    new = make(new_lens, 2)
    case.kv_cache.copy_(new.kv_cache)
    seq_lens.copy_(new.seq_lens)
    tables.copy_(new.block_tables)
    cq.copy_(cum(new_lq))
    poison_(out)
    graph.replay()
    torch.cuda.synchronize()
    n = sum(new_lq)
    exact = dense.context(q[:n].cpu(), case.kv_cache.cpu(), tables.cpu(), seq_lens.cpu(), cum(new_lq), 0.09, 1.0,
                          causal=False)
    assert relative_error(out[:n].cpu(), exact) <= 1e-2
    assert torch.isnan(out[n:].float()).all()  # rows past the batch: untouched
