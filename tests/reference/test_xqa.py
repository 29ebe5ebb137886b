"""Reference ``xqa`` (CPU) against the dense float64 formulation."""

import math

import pytest
import torch
from .refcheck import assert_close, paged_case, poisoned, randq, scale_arg, workspace

import kvattn
from kvattn import dense
from kvattn.formats import FP8_DTYPE

pytestmark = pytest.mark.usefixtures("reference_backend")  # the plain-PyTorch backend, explicitly


def flat_pools(case):
    """xqa's flat ``[pages * page_size * Hkv, D]`` pools from an NHD tuple case."""
    k, v = case.kv_cache
    return k.contiguous().reshape(-1, k.shape[-1]), v.contiguous().reshape(-1, v.shape[-1])


def run_xqa(q, k, v, case, *, hkv, output=None, **kw):
    lens = case.seq_lens.to(torch.uint32).view(-1, 1)
    if output is None:
        output = poisoned(*q.shape, dtype=q.dtype)
    res = kvattn.xqa.xqa(q, k, v, case.block_tables, lens, output, workspace(), torch.zeros(8, dtype=torch.uint32),
                         hkv, case.page_size, **kw)
    assert res is None
    ref = dense.xqa(q, k, v, case.block_tables, lens, hkv, case.page_size, **kw)
    return output, ref


@pytest.mark.parametrize("kv_format", ["float16", "bfloat16", "fp8"])
@pytest.mark.parametrize("page", [16, 32, 64, 128], ids=lambda p: f"page{p}")
def test_flat_pool(page, kv_format):
    case = paged_case([1, page + 5, 0, 2 * page], page=page, kv_format=kv_format, form="tuple", seed=page)
    k, v = flat_pools(case)
    qdtype = torch.float16 if kv_format == "float16" else torch.bfloat16
    q = randq(4, 1, 8, 64, dtype=qdtype, seed=page)
    kw = {"kv_scale": torch.tensor([0.6])} if kv_format == "fp8" else {}
    out, ref = run_xqa(q, k, v, case, hkv=2, q_scale=1.3, **kw)
    assert_close(out, ref)
    assert (out[2].float() == 0).all()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_page_tensors(layout):
    case = paged_case([9, 40], layout=layout, form="tuple", seed=3)
    k, v = case.kv_cache
    q = randq(2, 1, 4, 64, seed=3)
    out, ref = run_xqa(q, k, v, case, hkv=2, kv_layout=layout)
    assert_close(out, ref)


def test_logit_scale_includes_inv_sqrt_d():
    """xqa adds 1/sqrt(D) itself: q_scale = sqrt(D) gives the unscaled dot product."""
    case = paged_case([30], form="tuple", d=128, seed=4)
    k, v = flat_pools(case)
    q = randq(1, 1, 4, 128, seed=4, scale=0.05)
    out, ref = run_xqa(q, k, v, case, hkv=2, q_scale=math.sqrt(128))
    assert_close(out, ref)
    other = dense.batch_decode(q[:, 0], case.kv_cache, case.block_tables, case.seq_lens, bmm1_scale=1.0)
    torch.testing.assert_close(ref[:, 0], other)


@pytest.mark.parametrize("as_tensor", [False, True], ids=["q_scale-float", "q_scale-tensor"])
def test_fp8_kv_scale_and_q_scale(as_tensor):
    case = paged_case([50, 17], kv_format="fp8", form="tuple", seed=5)
    k, v = flat_pools(case)
    q = randq(2, 1, 8, 64, seed=5)
    out, ref = run_xqa(q, k, v, case, hkv=2, q_scale=scale_arg(0.8, as_tensor), kv_scale=torch.tensor([1.7]))
    assert_close(out, ref)


def test_kv_scale_ignored_for_half_cache():
    case = paged_case([20], form="tuple", seed=6)
    k, v = flat_pools(case)
    q = randq(1, 1, 4, 64, seed=6)
    with_scale, _ = run_xqa(q, k, v, case, hkv=2, kv_scale=torch.tensor([3.0]))
    without, ref = run_xqa(q, k, v, case, hkv=2)
    assert_close(with_scale, ref)
    torch.testing.assert_close(with_scale, without, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["moderate", "dominating"])
def test_sinks_per_kv_head_and_group(kind):
    case = paged_case([3, 44], form="tuple", seed=7)
    k, v = flat_pools(case)
    q = randq(2, 1, 8, 64, seed=7)
    sinks = torch.randn(2, 4) if kind == "moderate" else torch.full((2, 4), 30.0)
    out, ref = run_xqa(q, k, v, case, hkv=2, sinks=sinks)
    assert_close(out, ref)
    # Query head h uses sinks[h // G, h % G]: compare with the [Hq]-sinks batch decode.
    other = dense.batch_decode(q[:, 0], case.kv_cache, case.block_tables, case.seq_lens, bmm1_scale=64**-0.5,
                               sinks=sinks.reshape(-1))
    torch.testing.assert_close(ref[:, 0], other)


@pytest.mark.parametrize("win", ["L", "L-1", "1", "0"])
def test_sliding_window(win):
    L = 45
    case = paged_case([L, L], form="tuple", seed=8)
    k, v = flat_pools(case)
    q = randq(2, 1, 4, 64, seed=8)
    w = {"L": L, "L-1": L - 1, "1": 1, "0": 0}[win]
    out, ref = run_xqa(q, k, v, case, hkv=2, sliding_win_size=w)
    assert_close(out, ref)
    full = dense.xqa(q, k, v, case.block_tables, case.seq_lens.view(-1, 1), 2, 16)
    if win in ("L", "0"):
        torch.testing.assert_close(ref, full)
    else:
        assert not torch.allclose(ref, full)
    if win == "1":
        last = torch.stack([case.v_tokens[b][L - 1] for b in range(2)]).double().repeat_interleave(2, dim=1)
        torch.testing.assert_close(ref[:, 0], last)


def test_fp8_output():
    case = paged_case([31, 64], kv_format="fp8", form="tuple", seed=9)
    k, v = flat_pools(case)
    q = randq(2, 1, 8, 64, seed=9)
    out = poisoned(2, 1, 8, 64, dtype=FP8_DTYPE)
    out, ref = run_xqa(q, k, v, case, hkv=2, output=out, kv_scale=torch.tensor([2.5]))
    assert_close(out, ref)


@pytest.mark.parametrize("group", [1, 4, 16], ids=lambda g: f"G{g}")
@pytest.mark.parametrize("d", [64, 128, 256], ids=lambda d: f"D{d}")
def test_head_dims_and_groups(d, group):
    case = paged_case([26], hkv=1, d=d, form="tuple", seed=d + group)
    k, v = flat_pools(case)
    q = randq(1, 1, group, d, seed=group)
    out, ref = run_xqa(q, k, v, case, hkv=1, sm_count=1)
    assert_close(out, ref)


def test_callable_module_alias():
    case = paged_case([12], form="tuple", seed=10)
    k, v = flat_pools(case)
    q = randq(1, 1, 4, 64, seed=10)
    out = poisoned(1, 1, 4, 64, dtype=torch.bfloat16)
    kvattn.xqa(q, k, v, case.block_tables, case.seq_lens.view(1, 1), out, workspace(),
               torch.zeros(1, dtype=torch.uint32), 2, 16)
    assert_close(out, dense.xqa(q, k, v, case.block_tables, case.seq_lens, 2, 16))
