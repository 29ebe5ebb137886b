"""The call cache's hit path on the GPU (kvattn.runtime.callcache ``_hot_entry``,
kvattn.runtime.native_checks): the C++ tensor check tells CUDA devices apart (type and index) as
the key does; calls made under ``torch.inference_mode`` (a serving engine's) replay from the
entries checked first and give the bits of the call with the cache off."""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.runtime import callcache as _callcache, native_checks
from kvattn.testing import make_paged_kv

ON_GPU = torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="CUDA tensors and compiled kernels")]


def test_the_tensor_check_tells_devices_apart():
    a = torch.zeros(4, 8, device="cuda")
    check = native_checks.tensor_guard([a])
    assert check is not None and check(torch.ones(4, 8, device="cuda"))
    assert not check(torch.ones(4, 8))
    if torch.cuda.device_count() > 1:
        assert not check(torch.ones(4, 8, device="cuda:1"))


def _decode_call():
    case = make_paged_kv([700, 1, 2500], num_kv_heads=2, head_dim=128, page_size=16, dtype=torch.bfloat16,
                         device="cuda", seed=3)
    q = torch.randn(3, 16, 128, device="cuda").to(torch.bfloat16)
    ws = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")
    args = (q, case.kv_cache, ws, case.block_tables, case.seq_lens, 2500)
    return kvattn.decode.xqa_batch_decode_with_kv_cache, args


@pytest.mark.parametrize("form", ["out", "no-out+lse"])
def test_inference_mode_calls_replay_from_the_hot_entries(form, monkeypatch):
    fn, args = _decode_call()
    cache = {c.name: c for c in _callcache._caches}[fn.__name__]
    kw = dict(bmm1_scale=128 ** -0.5)
    if form == "out":
        kw["out"] = torch.empty_like(args[0])
    else:
        kw["return_lse"] = True
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    want = fn(*args, **kw)
    want = tuple(t.clone() for t in want) if isinstance(want, tuple) else want.clone()
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    with torch.inference_mode():
        for _ in range(3):  # compiled, seen, recorded
            fn(*args, **kw)
        hits = cache.hits
        for _ in range(3):
            got = fn(*args, **kw)
        assert cache.hits == hits + 3
        assert any(cache.hot.values())
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want))
