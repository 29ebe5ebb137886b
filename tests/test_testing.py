"""kvattn.testing's paged caches: the same values on every device (drawn on the CPU, quantised and
NaN-filled on the cache's device), so a spec replays alike on the CPU and a GPU."""

from __future__ import annotations

import pytest
import torch

from kvattn.testing import make_paged_kv


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).cpu()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compares a GPU-built cache with the CPU's")
@pytest.mark.parametrize("kv_format", ["bfloat16", "float16", "fp8", "nvfp4"])
@pytest.mark.parametrize("form", ["stacked", "tuple"])
def test_a_cache_built_on_the_gpu_has_the_cpus_bytes(kv_format, form):
    lens = [0, 1, 17, 64, 130]
    kw = dict(num_kv_heads=2, head_dim=64, page_size=16, kv_format=kv_format, layout="HND", form=form, seed=11,
              extra_pages=5)
    cpu, gpu = make_paged_kv(lens, device="cpu", **kw), make_paged_kv(lens, device="cuda", **kw)
    caches = [(cpu.kv_cache, gpu.kv_cache)] + ([(cpu.kv_cache_sf, gpu.kv_cache_sf)] if cpu.kv_cache_sf is not None else [])
    for a, b in caches:
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert y.device.type == "cuda" and torch.equal(_bytes(x), _bytes(y))
    assert torch.equal(cpu.block_tables, gpu.block_tables.cpu()) and torch.equal(cpu.seq_lens, gpu.seq_lens.cpu())
    for x, y in zip(cpu.k_tokens + cpu.v_tokens, gpu.k_tokens + gpu.v_tokens):
        assert torch.equal(x, y.cpu())


@pytest.mark.parametrize("kv_format", ["bfloat16", "fp8", "nvfp4"])
def test_spare_pages_are_poisoned_and_leave_the_pool_as_it_was(kv_format):
    lens = [3, 40, 0]
    kw = dict(num_kv_heads=2, head_dim=32, page_size=8, kv_format=kv_format, layout="HND", seed=4)
    plain, spared = make_paged_kv(lens, **kw), make_paged_kv(lens, spare_pages=5, **kw)
    pages = plain.kv_cache.shape[0]
    assert spared.kv_cache.shape[0] == pages + 5
    assert torch.equal(_bytes(spared.kv_cache[:pages]), _bytes(plain.kv_cache))
    assert torch.equal(spared.block_tables, plain.block_tables)
    if kv_format == "nvfp4":  # NaN block scales poison the spare pages' codes
        assert torch.isnan(spared.kv_cache_sf[pages:].float()).all()
        assert torch.equal(_bytes(spared.kv_cache_sf[:pages]), _bytes(plain.kv_cache_sf))
    else:
        assert torch.isnan(spared.kv_cache[pages:].float()).all()


def test_a_cache_built_under_a_default_device_context():
    """The draws use a CPU generator: under ``with torch.device(...)`` (how tests/test_entry_routing.py
    makes its tensors on a GPU) they must stay on the CPU, and the cache lands where it is asked."""
    from kvattn.testing import make_paged_kv

    with torch.device("meta"):
        case = make_paged_kv([5, 20], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16, device="cpu")
    assert case.kv_cache.device.type == case.block_tables.device.type == case.seq_lens.device.type == "cpu"
    plain = make_paged_kv([5, 20], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16, device="cpu")
    assert torch.equal(case.kv_cache.view(torch.int16), plain.kv_cache.view(torch.int16))
