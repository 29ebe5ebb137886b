"""GPU tier of the device-side clamps and the batch-invariant mode, at serving shapes and in
bfloat16 (the interpreter has no bfloat16 arithmetic), on the kernels only a GPU runs: the Gluon
MLA kernels (plain and warp-specialised, its e4m3 form too) and the warp-specialised Gluon prefill kernel.

The CPU tier of the same rules is ``test_device_clamps.py`` and ``test_batch_invariant.py`` (both
also run here). Run under compute-sanitizer as well (``benchmarks/sanitize.sh`` runs its own
driver; for these tests:
``compute-sanitizer --tool memcheck python -m pytest -q tests/ops/test_guards_gpu.py``).
"""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.testing import make_paged_kv

from .oracle import GPU_ONLY

pytestmark = GPU_ONLY

WS = 256 << 20


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------------------------------------
# batch invariance at serving shapes
# ---------------------------------------------------------------------------------------------
def _decode_request0(batch, lens_rest, *, hkv=8, group=4, d=128, page=16, seed=0):
    """Request 0 (4096 keys, fixed values) in a batch of ``batch`` requests: its (out, lse)."""
    n0 = 4096
    lens = [n0] + list(lens_rest)[: batch - 1]
    lens += [1000] * (batch - len(lens))
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.bfloat16, device="cuda",
                         seed=seed + batch, nan_fill=False)
    ref = make_paged_kv([n0], num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.bfloat16, device="cuda",
                        seed=seed, nan_fill=False)
    kv = case.kv_cache
    pages = -(-n0 // page)
    kv[case.block_tables[0, :pages].long()] = ref.kv_cache[ref.block_tables[0, :pages].long()]
    g = torch.Generator().manual_seed(seed)
    q0 = torch.randn(1, hkv * group, d, generator=g)
    q = torch.cat([q0, torch.randn(batch - 1, hkv * group, d, generator=g)]).to("cuda", torch.bfloat16)
    ws = torch.zeros(WS, dtype=torch.uint8, device="cuda")
    out, lse = kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, case.block_tables, case.seq_lens, max(lens),
                                                            bmm1_scale=d ** -0.5, return_lse=True)
    return out[0].clone(), lse[0].clone()


def test_decode_64_batch_vs_alone_bitwise():
    with kvattn.batch_invariant():
        alone = _decode_request0(1, [])
        for batch, rest in ((64, [8192, 300] * 32), (7, [17, 20000, 5]), (128, [4096] * 127)):
            assert _same(alone, _decode_request0(batch, rest)), f"batch {batch}"


def _mla_request0(batch, rest, *, hq=128, page=64, seed=3, fp8=False):
    """Request 0 (4096 keys, fixed values) in a batch: its output rows (``fp8``: an e4m3 query and
    cache, the bf16 draws converted)."""
    n0 = 4096
    lens = [n0] + list(rest)[: batch - 1]
    lens += [777] * (batch - len(lens))
    case = make_paged_kv(lens, num_kv_heads=1, head_dim=576, page_size=page, dtype=torch.bfloat16, form="shared",
                         device="cuda", seed=seed + batch, nan_fill=False)
    ref = make_paged_kv([n0], num_kv_heads=1, head_dim=576, page_size=page, dtype=torch.bfloat16, form="shared",
                        device="cuda", seed=seed, nan_fill=False)
    cache = case.kv_cache[:, 0, :, 0]
    pages = -(-n0 // page)
    cache[case.block_tables[0, :pages].long()] = ref.kv_cache[:, 0, :, 0][ref.block_tables[0, :pages].long()]
    g = torch.Generator().manual_seed(seed)
    q0 = torch.randn(1, 1, hq, 576, generator=g)
    q = torch.cat([q0, torch.randn(batch - 1, 1, hq, 576, generator=g)]).to("cuda", torch.bfloat16)
    if fp8:
        cache, q = cache.to(torch.float8_e4m3fn), q.to(torch.float8_e4m3fn)
    ws = torch.zeros(WS, dtype=torch.uint8, device="cuda")
    out = kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, case.block_tables,
                                                        case.seq_lens, max(lens), bmm1_scale=0.07)
    return (out[0].clone(),)


@pytest.mark.parametrize("kernel", ["gluon-ws", "gluon", "triton", "gluon-ws-fp8", "triton-fp8"])
def test_mla_batch_vs_alone_bitwise(kernel, monkeypatch):
    monkeypatch.setenv("KVATTN_GLUON", "0" if kernel.startswith("triton") else "1")
    monkeypatch.setenv("KVATTN_GLUON_WS", "1" if kernel.startswith("gluon-ws") else "0")
    fp8 = kernel.endswith("fp8")
    with kvattn.batch_invariant():
        alone = _mla_request0(1, [], fp8=fp8)
        for batch, rest in ((64, [8192, 100] * 32), (5, [30000, 1, 64, 2048])):
            assert _same(alone, _mla_request0(batch, rest, fp8=fp8)), f"batch {batch}"


def test_single_decode_bitwise_on_any_split_plan(monkeypatch):
    from kvattn.runtime import device as _device
    g = torch.Generator().manual_seed(1)
    q = torch.randn(32, 128, generator=g).to("cuda", torch.bfloat16)
    k = torch.randn(20000, 8, 128, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(20000, 8, 128, generator=g).to("cuda", torch.bfloat16)
    real = _device.sm_count
    results = []
    with kvattn.batch_invariant():
        for sms in (None, 16, 200):
            monkeypatch.setattr(_device, "sm_count", lambda dev, n=sms: n or real(dev))
            results.append(kvattn.decode.single_decode_with_kv_cache(q, k, v, return_lse=True))
    assert all(_same(results[0], r) for r in results[1:])


@pytest.mark.parametrize("page,d", [(64, 128), (16, 128)], ids=["gluon-ws", "triton"])
def test_prefill_batch_vs_alone_bitwise(page, d):
    q_len, kv_len, hkv, group = 300, 2000, 8, 4
    ref = make_paged_kv([kv_len], num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.bfloat16, device="cuda",
                        seed=4, nan_fill=False)
    g = torch.Generator().manual_seed(4)
    q0 = torch.randn(q_len, hkv * group, d, generator=g)
    results = []
    with kvattn.batch_invariant():
        for mates in ([], [(1000, 1000), (7, 5000)], [(128, 128)] * 20):
            lens = [kv_len] + [m[1] for m in mates]
            qs = [q_len] + [m[0] for m in mates]
            case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.bfloat16,
                                 device="cuda", seed=40 + len(lens), nan_fill=False)
            kv = case.kv_cache
            n = -(-kv_len // page)
            kv[case.block_tables[0, :n].long()] = ref.kv_cache[ref.block_tables[0, :n].long()]
            q = torch.cat([q0] + [torch.randn(m, hkv * group, d, generator=g) for m in qs[1:]]).to("cuda",
                                                                                                  torch.bfloat16)
            cum_q = torch.tensor([0] + torch.tensor(qs).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
            cum_kv = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
            ws = torch.zeros(WS, dtype=torch.uint8, device="cuda")
            out = kvattn.prefill.trtllm_batch_context_with_kv_cache(
                q, kv, ws, case.block_tables, case.seq_lens, max(qs), max(lens), d ** -0.5, 1.0, len(lens), cum_q,
                cum_kv, kv_layout="NHD")
            results.append(out[:q_len].clone())
    assert all(torch.equal(results[0], r) for r in results[1:])
