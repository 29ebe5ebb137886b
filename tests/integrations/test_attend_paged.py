"""The integration's attention core (``kvattn.integrations.transformers.attend_paged``) on the
Triton kernels against the reference, for the page forms the integration builds: transformers'
pages (page size 16 here; 256 by default there), pages of one token (the gathered window of a
sliding layer, and the strided ``[B, H, L, D]`` view of a contiguous cache), decode and prefill
batches, a sliding window and sinks. Needs no transformers.
"""

from __future__ import annotations

import pytest
import torch

from kvattn.integrations.transformers import attend_paged, tables_contiguous, token_pages
from kvattn.testing import relative_error

ON_GPU = torch.cuda.is_available()
DEV = "cuda" if ON_GPU else "cpu"
DTYPE = torch.bfloat16 if ON_GPU else torch.float16


def run(monkeypatch, backend, *args, **kw):
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    return attend_paged(*args, **kw).float()


@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("window,sinks", [(-1, False), (5, True)])
def test_gathered_rows_as_pages_of_one_token(monkeypatch, decode, window, sinks):
    g = torch.Generator().manual_seed(0)
    hq, hkv, d = 4, 2, 64
    q_lens = [1, 1, 1] if decode else [3, 1, 6]
    k_lens = [9, 1, 14]
    cu_k = torch.tensor([0, 9, 10, 24], dtype=torch.int32, device=DEV)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    rows = torch.randn(24, hkv, d, generator=g).to(DEV, DTYPE)
    vals = torch.randn(24, hkv, d, generator=g).to(DEV, DTYPE)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(DEV, DTYPE)
    s = torch.randn(hq, generator=g).to(DEV) if sinks else None
    args = (q, rows.unsqueeze(1), vals.unsqueeze(1), tables_contiguous(cu_k, 14), cu_k[1:] - cu_k[:-1], cu_q)
    kw = dict(max_q=max(q_lens), max_k=14, scale=d ** -0.5, window_left=window, sinks=s, cu_k=cu_k)
    ref = run(monkeypatch, "reference", *args, **kw)
    got = run(monkeypatch, "triton", *args, **kw)
    assert relative_error(got, ref) < 1e-2


@pytest.mark.parametrize("lq", [1, 5])
def test_contiguous_cache_view(monkeypatch, lq):
    g = torch.Generator().manual_seed(1)
    b, hq, hkv, length, d = 2, 4, 2, 11, 64
    base_k = torch.randn(b, hkv, length + 3, d, generator=g).to(DEV, DTYPE)  # a cache with spare room
    base_v = torch.randn(b, hkv, length + 3, d, generator=g).to(DEV, DTYPE)
    k, v = base_k[:, :, :length], base_v[:, :, :length]  # strided, as a grown cache slice
    (kp, row), (vp, _) = token_pages(k), token_pages(v)
    assert kp.data_ptr() == k.data_ptr() and row == hkv * (length + 3)
    tables = (torch.arange(b, device=DEV, dtype=torch.int32)[:, None] * row
              + torch.arange(length, device=DEV, dtype=torch.int32)[None])
    q = torch.randn(b * lq, hq, d, generator=g).to(DEV, DTYPE)
    lens = torch.full((b,), length, dtype=torch.int32, device=DEV)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=DEV) * lq
    kw = dict(max_q=lq, max_k=length, scale=d ** -0.5)
    ref = run(monkeypatch, "reference", q, kp, vp, tables, lens, cu_q, **kw)
    got = run(monkeypatch, "triton", q, kp, vp, tables, lens, cu_q, **kw)
    assert relative_error(got, ref) < 1e-2
    # and the view reads the right rows: the reference over the view equals attention over k, v
    kk = k.float().repeat_interleave(hq // hkv, 1)
    vv = v.float().repeat_interleave(hq // hkv, 1)
    qq = q.float().view(b, lq, hq, d)
    s = torch.einsum("blhd,bhnd->bhln", qq, kk) * d ** -0.5
    pos = torch.arange(length - lq, length, device=DEV)[:, None]
    s = s.masked_fill(torch.arange(length, device=DEV)[None] > pos, float("-inf"))
    dense = torch.einsum("bhln,bhnd->blhd", s.softmax(-1), vv).reshape(b * lq, hq, d)
    assert relative_error(ref, dense) < 1e-2
