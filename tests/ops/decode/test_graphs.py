"""Decode under CUDA-graph capture and under ``torch.compile``.

The graph test captures one call, then changes the lengths and the page table in place (as a
serving engine does between steps) and replays: the replay must follow the new values, which it
can only do if the launch reads nothing from the device on the host side and allocates nothing.
"""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.testing import make_paged_kv, poison_, relative_error

from ..compiled import assert_close_to_eager, compile_backend, eager_and_compiled
from ..oracle import dense

ON_GPU = torch.cuda.is_available()


POOL_PAGES = 400


def _case(device, lens, pages_per_seq, seed):
    """A pool of POOL_PAGES pages whatever the lengths, so one step's pool can replace another's."""
    used = sum((n + 15) // 16 for n in lens)
    return make_paged_kv(lens, num_kv_heads=2, head_dim=128, page_size=16, dtype=torch.bfloat16,
                         device=device, seed=seed, pages_per_seq=pages_per_seq, extra_pages=POOL_PAGES - used)


def _exact(q, case, lens_t, tables, **kw):
    return dense.batch_decode(q.cpu(), case.kv_cache.cpu(), tables.cpu(), lens_t.cpu(), bmm1_scale=0.1, **kw)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("q_len", [1, 3], ids=["Q1", "Q3"])
def test_cuda_graph_replay_follows_new_lengths_and_tables(q_len, triton_backend):
    device = torch.device("cuda")
    lens = [700, 40, 2500, 0]
    width = 200
    case = _case(device, lens, width, seed=1)
    batch, hq, d = len(lens), 8, 128
    q = torch.randn(batch * q_len, hq, d, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device=device)
    seq_lens = case.seq_lens.clone()
    tables = case.block_tables.clone()
    max_len = width * 16
    sinks = torch.randn(hq, device=device)

    def call():
        kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, tables, seq_lens, max_len,
                                                     bmm1_scale=0.1, out=out, q_len_per_req=q_len, sinks=sinks)

    call()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()

    # New step: other lengths (one request grows, one shrinks, one becomes empty, one starts), and
    # a fresh permutation of the same pages.
    new_lens = [1200, 0, 2400, 33]
    new_case = _case(device, new_lens, width, seed=2)
    case.kv_cache.copy_(new_case.kv_cache)
    seq_lens.copy_(new_case.seq_lens)
    tables.copy_(new_case.block_tables)
    poison_(out)
    graph.replay()
    torch.cuda.synchronize()
    exact = _exact(q, case, seq_lens, tables, sinks=sinks.cpu(), q_len_per_req=q_len)
    assert relative_error(out.cpu(), exact) <= 1e-2
    assert (out[q_len : 2 * q_len].float() == 0).all()


@pytest.mark.parametrize("fullgraph", [True], ids=["fullgraph"])
def test_torch_compile_traces_the_public_functions(fullgraph, kernel_device, triton_backend):
    """The custom ops' fake implementations let torch.compile trace batch and single decode."""
    lens = [50, 3]
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16,
                         device=kernel_device, seed=3)
    q = torch.randn(2, 8, 64, device=kernel_device, dtype=torch.float16)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=kernel_device)
    k, v = (torch.randn(70, 2, 64, device=kernel_device, dtype=torch.float16) for _ in range(2))

    def step(q, kv, tables, lens_t, k, v):
        o = kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, tables, lens_t, 64, bmm1_scale=0.125)
        s = kvattn.decode.single_decode_with_kv_cache(q[0], k, v, pos_encoding_mode="ROPE_LLAMA")
        return o * 2, s + 1

    args = (q, case.kv_cache, case.block_tables, case.seq_lens, k, v)
    eager, got = eager_and_compiled(step, args, compile_backend(ON_GPU), fullgraph)
    for a, b in zip(got, eager):
        assert_close_to_eager(a, b)
