"""Triton single-request decode (``single_decode_with_kv_cache``) against the oracles.

Fresh random inputs per case; the output is compared with the float64 dense formulation within
twice the reference backend's own error plus the kernel's operand rounding, the LSE against a
float64 log-sum-exp. RoPE is also checked against an independent rotate-then-attend formulation
written here. Interpreter tier (CPU): the cases marked ``interp`` (float16, short sequences).
"""

from __future__ import annotations

import math

import pytest
import torch
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

import kvattn
from kvattn.runtime import device as _device
from kvattn.formats import FP8_DTYPE
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.testing import relative_error

from ..oracle import GPU_ONLY, ON_GPU, dense

EXTRA = {torch.float16: 5e-4, torch.bfloat16: 4e-3}


def make_inputs(device, *, length, hq, hkv, d, dtype, kv_fp8=False, layout="NHD", seed=0, kv_offset=0):
    """``kv_offset``: K and V start that many elements into a larger buffer (unaligned bases)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(hq, d, generator=g).to(device, dtype)
    shape = (length, hkv, d) if layout == "NHD" else (hkv, length, d)
    k, v = (torch.randn(*shape, generator=g) for _ in range(2))
    kv_dtype = FP8_DTYPE if kv_fp8 else dtype
    k, v = k.to(device, kv_dtype), v.to(device, kv_dtype)
    if kv_offset:
        k, v = (torch.empty(t.numel() + kv_offset, dtype=kv_dtype, device=device)[kv_offset:].view(shape).copy_(t)
                for t in (k, v))
    return q, k, v


def lse_tolerance(dtype, rounds_rotated: bool, logit_mag: float) -> float:
    """The tensor-core path rounds RoPE-rotated q and k to the input dtype before the product."""
    if rounds_rotated:
        return 4 * (2.0**-11 if dtype == torch.float16 else 2.0**-8) * logit_mag + 1e-4
    return 1e-4 * max(1.0, logit_mag)


def run_case(device, monkeypatch, *, length, hq=8, hkv=2, d=64, dtype=torch.float16, kv_fp8=False, layout="NHD",
             seed=0, kv_offset=0, **kw):
    q, k, v = make_inputs(device, length=length, hq=hq, hkv=hkv, d=d, dtype=dtype, kv_fp8=kv_fp8, layout=layout,
                          seed=seed, kv_offset=kv_offset)
    args = dict(kv_layout=layout, return_lse=True, **kw)
    results = []
    for backend in ("triton", "reference"):
        monkeypatch.setenv("KVATTN_BACKEND", backend)
        results.append(kvattn.decode.single_decode_with_kv_cache(q, k, v, **args))
    (out, lse), (ref_out, _) = results
    assert_matches_oracles(q, k, v, out, lse, ref_out, args)
    return out, lse


def assert_matches_oracles(q, k, v, out, lse, ref_out, args):
    """``out`` / ``lse`` of the Triton backend against the float64 dense formulation, within twice
    the reference backend's (``ref_out``) own error plus the kernel's operand rounding."""
    hq, d = q.shape
    hkv = k.shape[1] if args["kv_layout"] == "NHD" else k.shape[0]
    dtype = q.dtype
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (hq,) and lse.dtype == torch.float32
    exact, exact_lse = dense.single_decode(q.cpu(), k.cpu(), v.cpu(), **args)
    got, ref = out.cpu().double(), ref_out.cpu().double()
    assert torch.isfinite(got).all()
    err, ref_err = relative_error(got, exact), relative_error(ref, exact)
    assert err <= 2 * ref_err + EXTRA[dtype], f"relative error {err:.3g} (reference {ref_err:.3g})"
    rows = hq // hkv * 1
    rounds = args.get("pos_encoding_mode") == "ROPE_LLAMA" and (args.get("use_tensor_cores") or rows > 1)
    scale = args.get("sm_scale") or 1 / math.sqrt(d)
    logit_mag = float(scale * q.float().norm(dim=-1).max() * k.float().norm(dim=-1).max())
    if args.get("logits_soft_cap"):
        logit_mag = min(logit_mag, args["logits_soft_cap"])
    lse_err = float((lse.cpu().double() - exact_lse).abs().max())
    assert lse_err <= lse_tolerance(dtype, rounds, logit_mag), f"LSE error {lse_err:.3g}"


def param(id, interp=False, **kw):
    return pytest.param(kw, id=id, marks=() if interp else GPU_ONLY)


CASES = [
    *[param(f"fp16-{mode}-{layout}-{'tc' if tc else 'cuda'}-H{hq}x{hkv}", True, length=150, hq=hq, hkv=hkv,
            layout=layout, pos_encoding_mode=mode, use_tensor_cores=tc, seed=hq + tc)
      for mode in ("NONE", "ROPE_LLAMA", "ALIBI") for layout, tc, hq, hkv in
      (("NHD", False, 4, 4), ("HND", True, 8, 2))],
    param("fp16-softcap-alibi-window", True, length=90, pos_encoding_mode="ALIBI", logits_soft_cap=3.0,
          window_left=31),
    param("fp16-fp8kv-scales-rope", True, length=70, kv_fp8=True, q_scale=1.1, k_scale=0.8, v_scale=1.7,
          pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0, rope_theta=5e5, hq=4, hkv=4),
    param("fp16-length1", True, length=1, sm_scale=0.3),
    # One query row per program on tensor cores: RoPE turns the query per key (keys stay unrotated).
    param("fp16-rope-tc-mha", True, length=150, hq=4, hkv=4, pos_encoding_mode="ROPE_LLAMA", use_tensor_cores=True,
          seed=21),
    param("fp16-rope-tc-mha-window-scaled", True, length=90, hq=2, hkv=2, pos_encoding_mode="ROPE_LLAMA",
          use_tensor_cores=True, window_left=40, rope_scale=3.0, rope_theta=5e5, seed=22),
    # --- GPU grid -------------------------------------------------------------------------------
    *[param(f"bf16-{mode}-{layout}-{'tc' if tc else 'cuda'}-D{d}-L{length}-H{hq}x{hkv}", length=length, hq=hq,
            hkv=hkv, d=d, dtype=torch.bfloat16, layout=layout, pos_encoding_mode=mode, use_tensor_cores=tc,
            seed=length + d)
      for mode in ("NONE", "ROPE_LLAMA", "ALIBI") for layout in ("NHD", "HND") for tc in (False, True)
      for d, length, hq, hkv in ((64, 1, 8, 8), (128, 999, 32, 32), (128, 4100, 32, 8), (256, 3000, 4, 1))],
    *[param(f"fp16-window{w}-L{length}", length=length, window_left=w, seed=w)
      for length in (1, 64, 3000) for w in (0, 1, 63, 64, 2999)],
    *[param(f"fp16-softcap{c}-{mode}", length=2500, logits_soft_cap=c, pos_encoding_mode=mode, sm_scale=0.5)
      for c in (1.0, 30.0) for mode in ("NONE", "ALIBI")],
    *[param(f"bf16-fp8kv-{mode}", length=5000, dtype=torch.bfloat16, kv_fp8=True, q_scale=0.9, k_scale=1.2,
            v_scale=0.6, pos_encoding_mode=mode, hq=32, hkv=8, d=128)
      for mode in ("NONE", "ROPE_LLAMA")],
    param("bf16-rope-mha-L131072", length=131072, dtype=torch.bfloat16, pos_encoding_mode="ROPE_LLAMA", hq=4,
          hkv=4, d=128, use_tensor_cores=True),
    param("bf16-long-rope-scaled", length=40000, dtype=torch.bfloat16, pos_encoding_mode="ROPE_LLAMA",
          rope_scale=4.0, rope_theta=1e6, hq=32, hkv=8, d=128),
    param("fp16-alibi-H12", length=700, hq=12, hkv=4, pos_encoding_mode="ALIBI"),
    # MHA 32 x 128 past the streaming spans (12800 keys on an H100): the one-row contiguous tiles.
    param("bf16-contig-NONE-NHD-L20000-H32", length=20000, dtype=torch.bfloat16, hq=32, hkv=32, d=128, seed=31),
    param("bf16-contig-alibi-softcap-window-HND-L13001-H32", length=13001, dtype=torch.bfloat16, hq=32, hkv=32,
          d=128, layout="HND", pos_encoding_mode="ALIBI", logits_soft_cap=20.0, window_left=12900, seed=32),
]


@pytest.mark.parametrize("kw", CASES)
def test_single_decode_matches_oracles(kw, kernel_device, triton_backend, monkeypatch):
    run_case(kernel_device, monkeypatch, **kw)


@GPU_ONLY
@pytest.mark.parametrize(
    "kw,tma",
    [(dict(length=4097), True), (dict(length=3001, layout="HND"), True),
     (dict(length=1, layout="HND"), True),
     (dict(length=5000, window_left=700, logits_soft_cap=30.0, rope_scale=2.0, rope_theta=5e5), True),
     (dict(length=12800, use_tensor_cores=True), True),
     (dict(length=4097, kv_offset=4), False)],
    ids=["NHD-L4097", "HND-L3001", "HND-L1", "window-softcap-scaled-L5000", "L12800-at-limit", "unaligned-L4097"],
)
def test_rope_single_decode_reads_by_tma_in_cuda_graphs(kw, tma, triton_backend, monkeypatch):
    """RoPE single decode with one query head a KV head (bf16, D 128, 32 heads) within the
    streaming spans, captured in a CUDA graph: on Hopper its tiles are read by TMA (the copies
    hinted evict-first; tokens past the end read as TMA's zeros), eager calls by cp.async; both
    match the oracles. K/V bases off 16 bytes take cp.async in the graph too."""
    monkeypatch.setattr(decode_launch, "_PLANS", {})
    kw = dict(kw)
    length, layout, offset = kw.pop("length"), kw.pop("layout", "NHD"), kw.pop("kv_offset", 0)
    device = torch.device("cuda")
    q, k, v = make_inputs(device, length=length, hq=32, hkv=32, d=128, dtype=torch.bfloat16, layout=layout,
                          seed=length, kv_offset=offset)
    args = dict(kv_layout=layout, return_lse=True, pos_encoding_mode="ROPE_LLAMA", **kw)
    # The eager call compiles and loads the kernels the capture of the same call will launch
    # (the TMA one too), so the capture loads no module (drivers before CUDA 12.3 refuse that).
    eager = kvattn.decode.single_decode_with_kv_cache(q, k, v, **args)
    torch.cuda.synchronize()
    compiles, loads = [], []
    real_compile, real_load = JITFunction._do_compile, CompiledKernel._init_handles
    graph = torch.cuda.CUDAGraph()
    with pytest.MonkeyPatch.context() as spy:
        spy.setattr(JITFunction, "_do_compile", lambda self, *a: compiles.append(self) or real_compile(self, *a))
        spy.setattr(CompiledKernel, "_init_handles",
                    lambda self: (loads.append(self) if self.module is None else None, real_load(self))[1])
        with torch.cuda.graph(graph):
            out, lse = kvattn.decode.single_decode_with_kv_cache(q, k, v, **args)
    assert compiles == [] and loads == []
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    ref_out, _ = kvattn.decode.single_decode_with_kv_cache(q, k, v, **args)
    for got, got_lse in (eager, (out, lse)):
        assert_matches_oracles(q, k, v, got, got_lse, ref_out, args)
    if not _device.is_hopper(device):
        pytest.skip("the TMA tiles are Hopper's table")
    by_tma = {plan.tma_ok: plan.launches(min(length, kw.get("window_left", length) + 1))[0].constexprs
              for plan in decode_launch._PLANS.values()}
    assert set(by_tma) == ({False, True} if tma else {False})  # the eager plan and the captured one
    for uses_tma, constexprs in by_tma.items():
        assert constexprs["KV_TMA"] is uses_tma and constexprs["KV_EVICT_FIRST"]


@pytest.mark.parametrize("merge", ["in-kernel", "combine-launch"])
def test_split_kv_single_decode(merge, kernel_device, triton_backend, monkeypatch):
    """Forced short splits: partials and their LSE merge (output and returned LSE), in each head's
    last split program or in the combine launch (``KVATTN_FUSED_MERGE=0``). The in-kernel merge's
    counters (kept per device and stream, single decode having no workspace) are back at zero after
    every call, so the next call, of another shape, merges right too."""
    from kvattn.runtime import workspace as launch_workspace

    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1" if merge == "in-kernel" else "0")
    monkeypatch.setattr(decode_launch, "MAX_MERGE_ROUNDS", 1 << 30)  # merge in the kernel however many splits
    length = 200 if not ON_GPU else 20000
    with decode_configs.override(min_chunk=32, waves=64):
        run_case(kernel_device, monkeypatch, length=length, pos_encoding_mode="ALIBI", logits_soft_cap=4.0)
        run_case(kernel_device, monkeypatch, length=length, pos_encoding_mode="ROPE_LLAMA", window_left=150)
        run_case(kernel_device, monkeypatch, length=length - 37, hq=4, hkv=4, seed=2)
    kind = torch.device(kernel_device).type
    counters = [c for (dev, _), c in launch_workspace._STREAM_COUNTERS.items() if dev.type == kind]
    if merge == "in-kernel":
        assert counters, "no counters were made: the launches did not merge in the kernel"
    assert all((c == 0).all() for c in counters)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("mode", ["NONE", "ROPE_LLAMA"])
def test_single_decode_in_cuda_graphs(mode, triton_backend, monkeypatch):
    """Two captured calls (their own zeroed counters, cut from the device's chunk for captures),
    replayed several times each, alternately and with new K/V in place, follow the new values."""
    from kvattn.runtime import workspace as launch_workspace

    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    monkeypatch.setattr(decode_launch, "MAX_MERGE_ROUNDS", 1 << 30)
    device = torch.device("cuda")
    q, k, v = make_inputs(device, length=20000, hq=32, hkv=8, d=128, dtype=torch.bfloat16, seed=4)
    q2, k2, v2 = make_inputs(device, length=4096, hq=8, hkv=8, d=128, dtype=torch.bfloat16, seed=5)

    def call(q, k, v):
        return kvattn.decode.single_decode_with_kv_cache(q, k, v, pos_encoding_mode=mode, return_lse=True)

    call(q, k, v), call(q2, k2, v2)  # compile (and make the chunk) outside the capture
    torch.cuda.synchronize()
    used = launch_workspace._CAPTURE_CHUNKS[q.device][1]
    graphs, results = [], []
    for args in ((q, k, v), (q2, k2, v2)):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            results.append(call(*args))
        graphs.append(graph)
    assert launch_workspace._CAPTURE_CHUNKS[q.device][1] == used + 2 * 32  # a slice of counters each
    for step in range(3):
        for (qq, kk, vv), graph, (out, lse) in zip(((q, k, v), (q2, k2, v2)), graphs, results):
            g = torch.Generator().manual_seed(step)
            kk.copy_(torch.randn(kk.shape, generator=g).to(kk))
            vv.copy_(torch.randn(vv.shape, generator=g).to(vv))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            exact, exact_lse = dense.single_decode(qq.cpu(), kk.cpu(), vv.cpu(), pos_encoding_mode=mode,
                                                   return_lse=True)
            assert relative_error(out.cpu().double(), exact) <= 2e-2, (step, qq.shape[0])
            assert torch.allclose(lse.cpu().double(), exact_lse, atol=0.05, rtol=0)


def rotate_pairs(x: torch.Tensor, positions: torch.Tensor, rope_scale: float, theta: float) -> torch.Tensor:
    """Independent RoPE: each pair (x[i], x[i + D/2]) rotated by the angle ``pos * freq_i`` as a
    2x2 rotation matrix applied in float64. x ``[N, H, D]``, positions ``[N]``."""
    d = x.shape[-1]
    half = d // 2
    x = x.double()
    out = torch.empty_like(x)
    for i in range(half):
        freq = theta ** (-2.0 * i / d) / rope_scale
        ang = positions.double() * freq
        c, s = torch.cos(ang).view(-1, 1), torch.sin(ang).view(-1, 1)
        out[..., i] = x[..., i] * c - x[..., i + half] * s
        out[..., i + half] = x[..., i + half] * c + x[..., i] * s
    return out


@pytest.mark.parametrize("mha", [False, True], ids=["gqa", "mha"])
@pytest.mark.parametrize("tc", [False, True], ids=["cuda-cores", "tensor-cores"])
def test_rope_equals_rotate_then_attend(tc, mha, kernel_device, triton_backend):
    length, hq, hkv, d = (120, 4, 2, 64) if not ON_GPU else (3000, 32, 8, 128)
    hkv = hq if mha else hkv
    rope_scale, theta = 1.5, 2e4
    q, k, v = make_inputs(kernel_device, length=length, hq=hq, hkv=hkv, d=d, dtype=torch.float16, seed=11)
    out, lse = kvattn.decode.single_decode_with_kv_cache(
        q, k, v, pos_encoding_mode="ROPE_LLAMA", use_tensor_cores=tc, rope_scale=rope_scale, rope_theta=theta,
        return_lse=True)
    qr = rotate_pairs(q.cpu().unsqueeze(0), torch.tensor([length - 1]), rope_scale, theta)[0]  # [Hq, D]
    kr = rotate_pairs(k.cpu(), torch.arange(length), rope_scale, theta)  # [L, Hkv, D]
    g = hq // hkv
    logits = torch.einsum("hd,lhd->hl", qr, kr.repeat_interleave(g, dim=1)) / math.sqrt(d)
    p = torch.softmax(logits, dim=-1)
    expect = torch.einsum("hl,lhd->hd", p, v.cpu().double().repeat_interleave(g, dim=1))
    expect_lse = torch.logsumexp(logits, dim=-1) / math.log(2.0)
    assert relative_error(out.cpu(), expect) <= 3e-3
    assert float((lse.cpu().double() - expect_lse).abs().max()) <= 2e-2


def test_lse_is_base2_logsumexp_of_scaled_logits(kernel_device, triton_backend):
    length, hq, hkv, d = (77, 4, 1, 64) if not ON_GPU else (5000, 16, 2, 128)
    q, k, v = make_inputs(kernel_device, length=length, hq=hq, hkv=hkv, d=d, dtype=torch.float16, seed=12)
    sm, q_scale, k_scale = 0.2, 1.3, 0.7
    _, lse = kvattn.decode.single_decode_with_kv_cache(q, k, v, sm_scale=sm, q_scale=q_scale, k_scale=k_scale,
                                                       v_scale=5.0, return_lse=True)
    logits = torch.einsum("hd,lhd->hl", q.cpu().double(), k.cpu().double().repeat_interleave(hq // hkv, dim=1))
    expect = torch.logsumexp(logits * sm * q_scale * k_scale, dim=-1) / math.log(2.0)
    assert float((lse.cpu().double() - expect).abs().max()) <= 1e-4 * max(1.0, float(expect.abs().max()))


def test_use_tensor_cores_changes_only_rounding(kernel_device, triton_backend):
    q, k, v = make_inputs(kernel_device, length=300, hq=4, hkv=4, d=64, dtype=torch.float16, seed=13)
    a = kvattn.decode.single_decode_with_kv_cache(q, k, v, use_tensor_cores=False, pos_encoding_mode="ALIBI")
    b = kvattn.decode.single_decode_with_kv_cache(q, k, v, use_tensor_cores=True, pos_encoding_mode="ALIBI")
    assert relative_error(a, b.float()) <= 2e-3


def _windowed_rope_case(device, *, length, window, hq, hkv, d, dtype, seed):
    """A ``length``-token K/V of which only the last ``window + 1`` keys are visible, and the float64
    result over those keys at their absolute positions (rotate, then attend)."""
    g = torch.Generator().manual_seed(seed)
    n = window + 1
    q = torch.randn(hq, d, generator=g).to(dtype)
    k_win = torch.randn(n, hkv, d, generator=g).to(dtype)
    v_win = torch.randn(n, hkv, d, generator=g).to(dtype)
    # Keys outside the window are never read: leave them uninitialised (NaN-free is not promised).
    k = torch.empty(length, hkv, d, dtype=dtype, device=device)
    v = torch.empty(length, hkv, d, dtype=dtype, device=device)
    k[-n:], v[-n:] = k_win.to(device), v_win.to(device)
    pos = torch.arange(length - n, length)
    theta, scale = 5e5, 2.0
    qr = dense.rope_rotate(q.double().view(1, hq, d), torch.tensor([length - 1]), scale, theta)[0]
    kr = dense.rope_rotate(k_win.double(), pos, scale, theta).repeat_interleave(hq // hkv, dim=1)
    logits = torch.einsum("hd,nhd->hn", qr, kr) / math.sqrt(d)
    expected = torch.einsum("hn,nhd->hd", logits.softmax(-1), v_win.double().repeat_interleave(hq // hkv, dim=1))
    return q.to(device), k, v, dict(rope_theta=theta, rope_scale=scale, window_left=window), expected


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 1)], ids=["MHA-query-side", "GQA-key-side"])
def test_rope_positions_near_2_pow_20(hq, hkv, kernel_device, triton_backend):
    """Angles at positions ~2^20 are computed in float64: float32 products would be off by ~0.1 rad
    there and move the logits far beyond the output's rounding."""
    length = (1 << 20) + 77
    q, k, v, kw, expected = _windowed_rope_case(kernel_device, length=length, window=40, hq=hq, hkv=hkv, d=64,
                                                dtype=torch.float16, seed=hq)
    for tc in (False, True):
        out = kvattn.decode.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA",
                                                       use_tensor_cores=tc, **kw)
        err = relative_error(out.cpu().double(), expected)
        # float16 rounding alone gives ~3e-4 here; float32 angles gave 2e-3 (and 2e-2 at 2^23)
        assert err < 1e-3, f"use_tensor_cores={tc}: relative error {err:.3g} at position ~2^20"


@GPU_ONLY
@pytest.mark.parametrize("mode", ["NONE", "ROPE_LLAMA"])
def test_one_million_tokens(mode, triton_backend):
    """kv_len 2^20: split over the whole GPU and combined; checked against the float64 oracle."""
    q, k, v = make_inputs("cuda", length=1 << 20, hq=4, hkv=2, d=128, dtype=torch.bfloat16, seed=5)
    out = kvattn.decode.single_decode_with_kv_cache(q, k, v, pos_encoding_mode=mode)
    o_ref, _ = dense.single_decode(q.cpu(), k.cpu(), v.cpu(), pos_encoding_mode=mode)
    err = relative_error(out.cpu().double(), o_ref)
    assert err < 1e-2, f"relative error {err:.3g}"
