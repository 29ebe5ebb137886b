"""A draft mask with one query token a request (``q_len_per_req = 1``, xqa's ``q_seq_len = 1``): every
backend the same.

Found by ``kvattn fuzz`` in Triton's interpreter: with ``Q = 1`` and a ``mask`` whose bit (0, 0) is
clear, the reference hid the row's own key (a request of one token then saw nothing: zero row,
LSE -inf) while the Triton kernels ignored the mask. Settled in docs/semantics.md: with one query
token the mask is not read (the token sees its own key, as in plain decode); every backend and the
float64 formulation follow it.
"""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.testing import make_paged_kv, randn, seeded

from ..oracle import run_both


@pytest.mark.parametrize("ragged", [False, True], ids=["B1-Q1", "B1-Q1-ragged"])
@pytest.mark.parametrize("length", [1, 5], ids=["L1", "L5"])
def test_mask_with_one_token_agrees_across_backends(length, ragged, kernel_device, monkeypatch):
    case = make_paged_kv([length], num_kv_heads=1, head_dim=64, page_size=16, dtype=torch.float16, seed=1,
                         device=kernel_device)
    q = randn(1, 4, 64, dtype=torch.float16, generator=seeded(0)).to(kernel_device)
    # Bit (0, 0) clear: the row may not see its own key.
    mask = torch.zeros((1, 2) if ragged else (1, 1, 2), dtype=torch.uint16, device=kernel_device)
    cu = torch.tensor([0, 1], dtype=torch.int32, device=kernel_device) if ragged else None
    ws = torch.zeros(16 << 20, dtype=torch.uint8, device=kernel_device)

    def call(with_mask=True):
        return kvattn.decode.xqa_batch_decode_with_kv_cache(
            q, case.kv_cache, ws, case.block_tables, case.seq_lens, length, bmm1_scale=0.125, q_len_per_req=1,
            mask=mask if with_mask else None, q_cu_seq_lens=cu).float()

    kernel, reference = run_both(call, monkeypatch)
    torch.testing.assert_close(kernel, reference, rtol=2e-3, atol=2e-3)
    _, unmasked = run_both(lambda: call(False), monkeypatch)
    assert torch.equal(reference, unmasked) and reference.abs().sum() > 0, "the mask was read at Q = 1"


def test_xqa_mask_with_one_token_agrees_across_backends(kernel_device, monkeypatch):
    case = make_paged_kv([5], num_kv_heads=1, head_dim=64, page_size=16, dtype=torch.float16, seed=1, form="tuple",
                         device=kernel_device)
    k_cache, v_cache = (t.contiguous() for t in case.kv_cache)
    q = randn(1, 1, 4, 64, dtype=torch.float16, generator=seeded(0)).to(kernel_device)
    mask = torch.zeros(1, 1, 2, dtype=torch.uint16, device=kernel_device)  # bit (0, 0) clear
    ws = torch.zeros(16 << 20, dtype=torch.uint8, device=kernel_device)

    def call(with_mask=True):
        out = torch.empty_like(q)
        kvattn.xqa.xqa(q, k_cache, v_cache, case.block_tables, case.seq_lens.view(1, 1), out, ws,
                       torch.zeros(8, dtype=torch.uint32, device=kernel_device), 1, 16,
                       mask=mask if with_mask else None)
        return out.float()

    kernel, reference = run_both(call, monkeypatch)
    torch.testing.assert_close(kernel, reference, rtol=2e-3, atol=2e-3)
    _, unmasked = run_both(lambda: call(False), monkeypatch)
    assert torch.equal(reference, unmasked) and reference.abs().sum() > 0, "the mask was read at Q = 1"
