"""``kvattn bench``'s problems and torch peers (``kvattn.benchmarking.builtin``, ``torch_peers``) on
the CPU: kvattn's call on the paged inputs and the peers' contiguous view of them are the same
attention (float64 softmax of the peers' tensors), the SDPA peer's folded heads unfold to the right
rows, and a backend this machine lacks is "not available"."""

from __future__ import annotations

import pytest
import torch

from kvattn._console import FUNCTION_KEYS
from kvattn.benchmarking.availability import NotAvailable
from kvattn.benchmarking.builtin import build
from kvattn.benchmarking.torch_peers import PeerInputs, sdpa

CPU = torch.device("cpu")
TOL = 2e-2  # bf16 inputs and outputs: kvattn's reference lands near 2e-3 of float64


def dense(p: PeerInputs) -> torch.Tensor:
    """``softmax(scale q k^T) v`` in float64, ``[B, Hq, Lq, Dv]``, causal aligned to the last query."""
    g = p.q.shape[1] // p.k.shape[1]
    q, k, v = p.q.double(), p.k.double().repeat_interleave(g, 1), p.v.double().repeat_interleave(g, 1)
    s = p.scale * q @ k.transpose(-1, -2)
    if p.causal:
        lq, n = q.shape[2], k.shape[2]
        keep = torch.arange(n)[None, :] <= torch.arange(lq)[:, None] + (n - lq)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all()
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("key", [k for k in FUNCTION_KEYS if k != "xqa"])
def test_kvattn_and_the_peers_inputs_are_one_attention(key):
    prob = build(key, CPU)
    ref = dense(prob.peers)
    out = prob.common(prob.run())
    assert out.shape == ref.shape and _err(out, ref) < TOL


def test_xqa_reads_the_same_pools_as_batch_decode():
    decode, xqa = build("batch_decode", CPU), build("xqa", CPU)
    assert xqa.peers is None and "batch decode" in xqa.peer_note
    a, b = decode.common(decode.run()), xqa.common(xqa.run())
    assert _err(b, dense(decode.peers)) < TOL and torch.allclose(a.float(), b.float(), atol=2e-2)


@pytest.mark.parametrize("key", ["batch_decode", "single_decode", "prefill"])
def test_sdpa_peer_unfolds_to_the_query_rows(key):
    peers = build(key, CPU).peers
    var = sdpa(peers, "flash")  # torch's CPU flash kernel
    out = var.unfold(var.fns[0]())
    assert out.shape == peers.q.shape[:3] + peers.v.shape[-1:] and _err(out, dense(peers)) < TOL


def test_a_backend_this_machine_lacks_is_not_available():
    with pytest.raises(NotAvailable):
        sdpa(build("single_decode", CPU).peers, "cudnn")


def test_unknown_function_names_the_choices():
    with pytest.raises(ValueError, match="'nope'.*batch_decode"):
        build("nope", CPU)
