"""``KVATTN_DEBUG=1``: device-value checks (page ids inside the cache, seq_lens within capacity).

Off by default: validation then reads no device values, so a bad page id or length raises nothing
at the boundary (the backend is stubbed out here, since what it computes is then undefined).
"""

import pytest
import torch
from validation_cases import BF16, paged

import kvattn
from kvattn import reference


def _decode_args():
    c = paged(lens=(5, 20))
    return dict(query=torch.randn(2, 8, 64, dtype=BF16), kv_cache=c.kv_cache,
                workspace_buffer=torch.zeros(1024, dtype=torch.uint8), block_tables=c.block_tables.clone(),
                seq_lens=c.seq_lens.clone(), max_seq_len=20)


def _bad_page(kw):
    kw["block_tables"][1, 1] = kw["kv_cache"].shape[0] + 3  # a page request 1 uses (tokens 16..19)


def _bad_len(kw):
    kw["seq_lens"][0] = kw["block_tables"].shape[1] * 16 + 1


def _prefill_args():
    c = paged(lens=(5, 20), layout="HND", split_tables=True)
    cq = torch.tensor([0, 5, 15], dtype=torch.int32)
    return dict(query=torch.randn(15, 8, 64, dtype=BF16), kv_cache=c.kv_cache,
                workspace_buffer=torch.zeros(1024, dtype=torch.uint8), block_tables=c.block_tables.clone(),
                seq_lens=c.seq_lens.clone(), max_q_len=10, max_kv_len=20, bmm1_scale=0.1, bmm2_scale=1.0,
                batch_size=2, cum_seq_lens_q=cq, cum_seq_lens_kv=cq, uses_shared_paged_kv_idx=False)


@pytest.fixture
def debug_on(monkeypatch):
    monkeypatch.setenv("KVATTN_DEBUG", "1")


@pytest.mark.parametrize("breaker, name", [(_bad_page, "block_tables"), (_bad_len, "seq_lens")],
                         ids=["page-id-outside-cache", "seq_len-over-capacity"])
def test_batch_decode_debug_reports(debug_on, breaker, name):
    kw = _decode_args()
    breaker(kw)
    with pytest.raises(ValueError, match=f"^{name}:"):
        kvattn.xqa_batch_decode_with_kv_cache(**kw)


def test_negative_page_id_reported(debug_on):
    kw = _decode_args()
    kw["block_tables"][0, 0] = -1
    with pytest.raises(ValueError, match="^block_tables:"):
        kvattn.xqa_batch_decode_with_kv_cache(**kw)


def test_unused_table_entries_are_not_checked(debug_on):
    kw = _decode_args()
    kw["block_tables"][0, 1:] = 1 << 30  # request 0 (5 tokens) uses only its first page
    kvattn.xqa_batch_decode_with_kv_cache(**kw)


def test_split_v_table_checked(debug_on):
    kw = _prefill_args()
    kw["block_tables"][1, 1, 0] = 10_000  # request 1's first V page
    with pytest.raises(ValueError, match="^block_tables:"):
        kvattn.trtllm_batch_context_with_kv_cache(**kw)


def test_xqa_page_table_checked(debug_on):
    pool = 4 * 16 * 2
    kw = dict(q=torch.randn(2, 1, 8, 64, dtype=BF16), k_cache=torch.randn(pool, 64, dtype=BF16),
              v_cache=torch.randn(pool, 64, dtype=BF16), page_table=torch.tensor([[3, 9], [0, 2]], dtype=torch.int32),
              seq_lens=torch.tensor([[20], [32]], dtype=torch.uint32), output=torch.empty(2, 1, 8, 64, dtype=BF16),
              workspace_buffer=torch.zeros(64, dtype=torch.uint8), semaphores=torch.zeros(1, dtype=torch.uint32),
              num_kv_heads=2, page_size=16)
    with pytest.raises(ValueError, match="^page_table:"):
        kvattn.xqa(**kw)


def test_mla_seq_len_checked(debug_on):
    with pytest.raises(ValueError, match="^seq_lens:"):
        kvattn.xqa_batch_decode_with_kv_cache_mla(
            torch.randn(1, 1, 16, 576, dtype=BF16), torch.randn(2, 32, 576, dtype=BF16), torch.zeros(8, dtype=torch.uint8),
            128, 512, 64, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([65], dtype=torch.int32), 64)


@pytest.mark.parametrize("breaker", [_bad_page, _bad_len], ids=["page-id-outside-cache", "seq_len-over-capacity"])
def test_off_by_default(monkeypatch, breaker):
    monkeypatch.delenv("KVATTN_DEBUG", raising=False)
    calls = []
    monkeypatch.setattr(reference, "batch_decode", lambda *a, **k: calls.append(1))
    kw = _decode_args()
    breaker(kw)
    kvattn.xqa_batch_decode_with_kv_cache(**kw)  # validation raises nothing
    assert calls == [1]


def test_debug_zero_is_off(monkeypatch):
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    monkeypatch.setattr(reference, "context", lambda query, *a, **k: torch.zeros(query.shape))
    kw = _prefill_args()
    kw["block_tables"][1, 1, 0] = 10_000
    kvattn.trtllm_batch_context_with_kv_cache(**kw)
