"""kvattn.merge_state / merge_states against a float64 formula, on both backends.

The Triton kernel runs compiled on a GPU and in Triton's interpreter on a CPU machine (float16 and
float32 states there: the interpreter has no bfloat16 arithmetic); the reference runs on CPU
tensors. Every case poisons the outputs, puts NaN in the outputs of empty states (which must never
be read in) and includes rows whose states are all empty.
"""

from __future__ import annotations

import math

import pytest
import torch

import kvattn
from kvattn.testing import poison_

from ops.compiled import compile_backend, eager_and_compiled

ON_GPU = torch.cuda.is_available()
LN2 = math.log(2.0)


def exact_merge(o: torch.Tensor, lse: torch.Tensor, sinks=None):
    """float64 ``(o [...], lse [...])`` of states ``o [S, ..., D]``, ``lse [S, ...]``."""
    o, lse = o.double(), lse.double()
    m = lse.amax(0) if lse.shape[0] else torch.full(lse.shape[1:], -math.inf, dtype=torch.float64)
    m_safe = torch.where(torch.isneginf(m), 0.0, m)
    w = torch.exp2(lse - m_safe)
    acc = torch.where(torch.isneginf(lse).unsqueeze(-1), 0.0, w.unsqueeze(-1) * o).sum(0)
    den = w.sum(0)
    merged_lse = torch.where(den > 0, m_safe + torch.log2(torch.where(den > 0, den, 1.0)), -math.inf)
    if sinks is not None:
        den = den + torch.exp2(sinks.double() / LN2 - m_safe)
    merged = torch.where(den.unsqueeze(-1) > 0, acc / torch.where(den > 0, den, 1.0).unsqueeze(-1), 0.0)
    return merged, merged_lse


def make_states(s, shape, d, dtype, device, seed=0, spread=8.0):
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(s, *shape, d, generator=g)
    lse = torch.randn(s, *shape, generator=g) * spread
    if s:
        empty = torch.rand(s, *shape, generator=g) < 0.25
        lse[empty] = -math.inf
        o[empty] = math.nan  # an empty state's output must never be read in
        lse[:, 0] = -math.inf  # a row whose every state is empty
        o[:, 0] = math.nan
    return o.to(device=device, dtype=dtype), lse.to(device)


def check(got_o, got_lse, want_o, want_lse, dtype):
    tol = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    got_o, got_lse = got_o.double().cpu(), got_lse.double().cpu()
    assert torch.isfinite(got_o).all(), "non-finite merged outputs"
    assert torch.equal(torch.isneginf(got_lse), torch.isneginf(want_lse))
    fin = torch.isfinite(want_lse)
    lse_err = (got_lse[fin] - want_lse[fin]).abs()
    assert (lse_err <= 1e-5 + 4e-7 * want_lse[fin].abs()).all(), float(lse_err.max())  # float32 rounding
    assert ((got_o - want_o).abs() <= tol * (1 + want_o.abs())).all(), float((got_o - want_o).abs().max())
    assert (got_o[~fin] == 0).all(), "a row of empty states must give zeros"


BACKENDS = ["reference", "triton"]
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])


def _device(backend):
    return torch.device("cuda") if backend == "triton" and ON_GPU else torch.device("cpu")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("s,shape,d", [(2, (5, 4), 64), (3, (7,), 128), (1, (3, 2), 96), (5, (2, 8), 512),
                                       (0, (3, 4), 64)])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_merge_states_matches_float64(backend, dtype, s, shape, d, with_sinks, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    o, lse = make_states(s, shape, d, dtype, device, seed=s * 7 + d)
    sinks = torch.randn(shape[-1]).to(device) * 3 if with_sinks and len(shape) > 1 else None
    out = poison_(torch.empty(*shape, d, dtype=dtype, device=device))
    out_lse = poison_(torch.empty(shape, device=device))
    got, got_lse = kvattn.merge_states(o, lse, out=out, out_lse=out_lse, sinks=sinks)
    assert got is out and got_lse is out_lse
    want, want_lse = exact_merge(o.cpu(), lse.cpu(), None if sinks is None else sinks.cpu())
    check(got, got_lse, want, want_lse, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_state_pair_matches_float64_and_works_in_place(backend, dtype, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    o, lse = make_states(2, (6, 4), 128, dtype, device, seed=3)
    want, want_lse = exact_merge(o.cpu(), lse.cpu())
    got, got_lse = kvattn.merge_state(o[0], lse[0], o[1], lse[1])
    assert got.dtype == dtype and got_lse.dtype == torch.float32
    check(got, got_lse, want, want_lse, dtype)
    o_a, lse_a = o[0].clone(), lse[0].clone()
    got, got_lse = kvattn.merge_state(o_a, lse_a, o[1], lse[1], out=o_a, out_lse=lse_a)  # in place
    assert got is o_a and got_lse is lse_a
    check(o_a, lse_a, want, want_lse, dtype)
    o_s, lse_s = o.clone(), lse.clone()
    kvattn.merge_states(o_s, lse_s, out=o_s[1], out_lse=lse_s[1])  # in place into one of the states
    check(o_s[1], lse_s[1], want, want_lse, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_is_exact_against_attention_over_the_union(backend, monkeypatch):
    """Attention over 300 keys = the merge of its three 100-key slices (float32 states)."""
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(*shape, generator=g).to(device) for shape in ((1, 4, 64), (300, 4, 64), (300, 4, 64)))
    sinks = torch.randn(4, generator=g).to(device)
    every = torch.ones(1, 100, dtype=torch.bool, device=device)
    parts = [kvattn.reference.attend(q, k[i : i + 100], v[i : i + 100], every, 3.0) for i in (0, 100, 200)]
    o, lse = kvattn.merge_states(torch.stack([p[0][0] for p in parts]), torch.stack([p[1][0] for p in parts]),
                                 sinks=sinks)
    whole, whole_lse = kvattn.reference.attend(q, k, v, torch.ones(1, 300, dtype=torch.bool, device=device), 3.0,
                                               sinks=sinks)
    torch.testing.assert_close(o.cpu(), whole[0].cpu(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.cpu(), whole_lse[0].cpu(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_extreme_lse_values_do_not_overflow(backend, monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    o = torch.randn(3, 4, 64, device=device)
    lse = torch.tensor([[1000.0, -1000.0, 200.0, -math.inf], [999.0, -1001.0, -300.0, -math.inf],
                        [-math.inf, -1000.0, 200.0, 5.0]], device=device)
    got, got_lse = kvattn.merge_states(o, lse)
    want, want_lse = exact_merge(o.cpu(), lse.cpu())
    check(got, got_lse, want, want_lse, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_states_and_float32_out(backend, monkeypatch):
    """States as strided views (a packed receive buffer), a non-contiguous last dim (copied), and a
    float32 output of 16-bit states."""
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    device = _device(backend)
    dtype = torch.float16
    o, lse = make_states(3, (5, 4), 64, dtype, device, seed=5)
    per = 5 * 4 * 65 + 7
    packed_o = torch.full((3 * per,), math.nan, dtype=dtype, device=device)
    packed_lse = torch.full((3 * per,), math.nan, device=device)
    o_view = packed_o.as_strided((3, 5, 4, 64), (per, 4 * 64, 64, 1), 3)
    lse_view = packed_lse.as_strided((3, 5, 4), (per, 4, 1), 11)
    o_view.copy_(o)
    lse_view.copy_(lse)
    got, got_lse = kvattn.merge_states(o_view, lse_view, out=torch.empty(5, 4, 64, device=device))
    want, want_lse = exact_merge(o.cpu(), lse.cpu())
    check(got, got_lse, want, want_lse, dtype)
    o_t = o.transpose(-1, -2).contiguous().transpose(-1, -2)  # last dim stride 4 * 5 ...
    got, got_lse = kvattn.merge_states(o_t, lse)
    check(got, got_lse, want, want_lse, dtype)


def _err(call, exc, name):
    with pytest.raises(exc, match=f"^{name}"):
        call()


def test_bad_arguments_name_themselves():
    o, lse = torch.randn(2, 3, 4, 64), torch.randn(2, 3, 4)
    _err(lambda: kvattn.merge_states(o, lse[:, :, :2]), ValueError, "lse:")
    _err(lambda: kvattn.merge_states(o, lse.double()), TypeError, "lse:")
    _err(lambda: kvattn.merge_states(o.int(), lse), TypeError, "o:")
    _err(lambda: kvattn.merge_states(o[0, 0, 0], lse[0, 0, 0]), ValueError, "lse:")
    _err(lambda: kvattn.merge_states(o, lse, out=torch.empty(3, 4, 32)), ValueError, "out:")
    _err(lambda: kvattn.merge_states(o, lse, out=torch.empty(3, 4, 64).int()), TypeError, "out:")
    _err(lambda: kvattn.merge_states(o, lse, out_lse=torch.empty(4, 3)), ValueError, "out_lse:")
    _err(lambda: kvattn.merge_states(o, lse, out=torch.empty(4, 3, 64).transpose(0, 1)), ValueError, "out")
    _err(lambda: kvattn.merge_states(o, lse, sinks=torch.randn(3)), ValueError, "sinks:")
    _err(lambda: kvattn.merge_state(o[0], lse[0], o[1, :2], lse[1, :2]), ValueError, "o_b:")
    _err(lambda: kvattn.merge_state(o[0], lse[0], o[1], lse[1, :2]), ValueError, "lse_b:")
    _err(lambda: kvattn.merge_state(o[0], lse[0].half(), o[1], lse[1]), TypeError, "lse_a:")


def test_merge_traces_under_torch_compile(monkeypatch):
    """The op's fake implementation lets torch.compile(fullgraph=True) trace the public function."""
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    device = torch.device("cuda") if ON_GPU else torch.device("cpu")
    o, lse = make_states(3, (4, 2), 64, torch.float32, device, seed=9)
    out, out_lse = torch.empty(4, 2, 64, device=device), torch.empty(4, 2, device=device)

    def step(o, lse):
        kvattn.merge_states(o, lse, out=out, out_lse=out_lse)
        return out * 2

    eager, got = eager_and_compiled(step, (o, lse), compile_backend(ON_GPU))
    torch.testing.assert_close(got, eager)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_merge_replays_in_a_cuda_graph():
    o, lse = make_states(4, (8, 32), 128, torch.bfloat16, "cuda", seed=1)
    sinks = torch.randn(32, device="cuda")
    out, out_lse = torch.empty(8, 32, 128, dtype=torch.bfloat16, device="cuda"), torch.empty(8, 32, device="cuda")
    kvattn.merge_states(o, lse, out=out, out_lse=out_lse, sinks=sinks)  # warm-up (compiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kvattn.merge_states(o, lse, out=out, out_lse=out_lse, sinks=sinks)
    o2, lse2 = make_states(4, (8, 32), 128, torch.bfloat16, "cuda", seed=2)
    o.copy_(o2)
    lse.copy_(lse2)
    poison_(out)
    graph.replay()
    torch.cuda.synchronize()
    want, want_lse = exact_merge(o2.cpu(), lse2.cpu(), sinks.cpu())
    check(out, out_lse, want, want_lse, torch.bfloat16)
