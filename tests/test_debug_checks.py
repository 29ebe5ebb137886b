"""Device-value checks (page ids inside the cache, seq_lens within capacity, prefill's offsets).

On by default for CPU tensors (reading a value there waits for no GPU), off by default for CUDA
tensors; ``KVATTN_DEBUG=1`` turns them on everywhere, ``KVATTN_DEBUG=0`` off everywhere (then a bad
page id or length raises nothing at the boundary: the backend is stubbed out here, since what it
computes is then undefined). Any other value of ``KVATTN_DEBUG`` is an error.
"""

import pytest
import torch
from validation_cases import BF16, paged

import kvattn
from kvattn import reference


def _decode_args():
    c = paged(lens=(5, 20))
    return dict(query=torch.randn(2, 8, 64, dtype=BF16), kv_cache=c.kv_cache,
                workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), block_tables=c.block_tables.clone(),
                seq_lens=c.seq_lens.clone(), max_seq_len=20)


def _bad_page(kw):
    kw["block_tables"][1, 1] = kw["kv_cache"].shape[0] + 3  # a page request 1 uses (tokens 16..19)


def _bad_len(kw):
    kw["seq_lens"][0] = kw["block_tables"].shape[1] * 16 + 1


def _prefill_args():
    c = paged(lens=(5, 20), layout="HND", split_tables=True)
    cq = torch.tensor([0, 5, 15], dtype=torch.int32)
    ckv = torch.tensor([0, 5, 25], dtype=torch.int32)
    return dict(query=torch.randn(15, 8, 64, dtype=BF16), kv_cache=c.kv_cache,
                workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), block_tables=c.block_tables.clone(),
                seq_lens=c.seq_lens.clone(), max_q_len=10, max_kv_len=20, bmm1_scale=0.1, bmm2_scale=1.0,
                batch_size=2, cum_seq_lens_q=cq, cum_seq_lens_kv=ckv, uses_shared_paged_kv_idx=False)


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
              workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), semaphores=torch.zeros(1, dtype=torch.uint32),
              num_kv_heads=2, page_size=16)
    with pytest.raises(ValueError, match="^page_table:"):
        kvattn.xqa(**kw)


def test_mla_seq_len_checked(debug_on):
    with pytest.raises(ValueError, match="^seq_lens:"):
        kvattn.xqa_batch_decode_with_kv_cache_mla(
            torch.randn(1, 1, 16, 576, dtype=BF16), torch.randn(2, 32, 576, dtype=BF16), torch.zeros(1 << 15, dtype=torch.uint8),
            128, 512, 64, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([65], dtype=torch.int32), 64)


@pytest.mark.parametrize("breaker, name", [(_bad_page, "block_tables"), (_bad_len, "seq_lens")],
                         ids=["page-id-outside-cache", "seq_len-over-capacity"])
def test_cpu_tensors_checked_by_default(monkeypatch, breaker, name):
    monkeypatch.delenv("KVATTN_DEBUG", raising=False)
    kw = _decode_args()
    breaker(kw)
    with pytest.raises(ValueError, match=f"^{name}:"):
        kvattn.xqa_batch_decode_with_kv_cache(**kw)


@pytest.mark.parametrize("breaker", [_bad_page, _bad_len], ids=["page-id-outside-cache", "seq_len-over-capacity"])
def test_debug_zero_turns_cpu_checks_off(monkeypatch, breaker):
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    calls = []
    monkeypatch.setattr(reference, "batch_decode", lambda *a, **k: calls.append(1))
    kw = _decode_args()
    breaker(kw)
    kvattn.xqa_batch_decode_with_kv_cache(**kw)  # validation raises nothing
    assert calls == [1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: CUDA tensors are unchecked by default")
def test_cuda_tensors_unchecked_by_default(monkeypatch):
    """A page id outside the cache on CUDA tensors: no check (it would wait for the GPU); the
    kernels never read outside the cache whatever the table holds."""
    monkeypatch.delenv("KVATTN_DEBUG", raising=False)
    monkeypatch.delenv("KVATTN_BACKEND", raising=False)
    kw = _decode_args()
    _bad_page(kw)
    kw = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    kvattn.xqa_batch_decode_with_kv_cache(**kw)
    torch.cuda.synchronize()
    monkeypatch.setenv("KVATTN_DEBUG", "1")
    with pytest.raises(ValueError, match="^block_tables:"):
        kvattn.xqa_batch_decode_with_kv_cache(**kw)


@pytest.mark.parametrize("value", ["2", "debug", "-1"])
def test_debug_other_values_are_an_error(monkeypatch, value):
    monkeypatch.setenv("KVATTN_DEBUG", value)
    with pytest.raises(ValueError, match=f"^KVATTN_DEBUG: expected 1 or 0 .*got '{value}'"):
        kvattn.xqa_batch_decode_with_kv_cache(**_decode_args())


def test_debug_zero_is_off(monkeypatch):
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    monkeypatch.setattr(reference, "context", lambda query, *a, **k: torch.zeros(query.shape))
    kw = _prefill_args()
    kw["block_tables"][1, 1, 0] = 10_000
    kvattn.trtllm_batch_context_with_kv_cache(**kw)


# ---------------------------------------------------------------------------------------------
# lengths, host bounds, offsets, scales (each a call that is valid but for one device value)
# ---------------------------------------------------------------------------------------------
def _xqa_args():
    pool = 4 * 16 * 2
    return dict(q=torch.randn(2, 1, 8, 64, dtype=BF16), k_cache=torch.randn(pool, 64, dtype=BF16),
                v_cache=torch.randn(pool, 64, dtype=BF16), page_table=torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
                seq_lens=torch.tensor([[20], [32]], dtype=torch.uint32), output=torch.empty(2, 1, 8, 64, dtype=BF16),
                workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), semaphores=torch.zeros(1, dtype=torch.uint32),
                num_kv_heads=2, page_size=16)


def _mla_args():
    return dict(query=torch.randn(2, 1, 16, 576, dtype=BF16), kv_cache=torch.randn(4, 32, 576, dtype=BF16),
                workspace_buffer=torch.zeros(1 << 15, dtype=torch.uint8), qk_nope_head_dim=128, kv_lora_rank=512,
                qk_rope_head_dim=64, block_tables=torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
                seq_lens=torch.tensor([40, 64], dtype=torch.int32), max_seq_len=64)


def _set(key, index, value):
    def mutate(kw):
        kw[key][index] = value
    return mutate


def _replace(**changes):
    def mutate(kw):
        kw.update({k: (v(kw) if callable(v) else v) for k, v in changes.items()})
    return mutate


def _spec(kw):  # two draft tokens a request
    kw.update(query=torch.randn(4, 8, 64, dtype=BF16), q_len_per_req=2)


DEBUG_CASES = [
    # batch decode
    ("decode", "negative-length", _set("seq_lens", 0, -1), "seq_lens"),
    ("decode", "uint32-length-2^31", _replace(seq_lens=lambda kw: torch.tensor([5, 2**31], dtype=torch.int64).to(
        torch.uint32)), "seq_lens"),
    ("decode", "max_seq_len-below-a-length", _replace(max_seq_len=19), "max_seq_len"),
    ("decode", "length-shorter-than-drafts", lambda kw: (_spec(kw), kw["seq_lens"].__setitem__(0, 1)), "seq_lens"),
    ("decode", "bmm1_scale-nan", _replace(bmm1_scale=torch.tensor([float("nan")])), "bmm1_scale"),
    ("decode", "bmm2_scale-inf", _replace(bmm2_scale=torch.tensor([float("inf")])), "bmm2_scale"),
    # prefill
    ("prefill", "negative-length", _set("seq_lens", 1, -4), "seq_lens"),
    ("prefill", "max_kv_len-below-a-length", _replace(max_kv_len=19, max_q_len=10), "max_kv_len"),
    ("prefill", "max_q_len-below-a-run", _replace(max_q_len=9), "max_q_len"),
    ("prefill", "length-shorter-than-query-rows", _set("seq_lens", 1, 9), "seq_lens"),
    ("prefill", "cum_q-not-from-0", _replace(cum_seq_lens_q=torch.tensor([1, 5, 15], dtype=torch.int32)),
     "cum_seq_lens_q"),
    ("prefill", "cum_q-decreasing", _replace(cum_seq_lens_q=torch.tensor([0, 16, 15], dtype=torch.int32)),
     "cum_seq_lens_q"),
    ("prefill", "cum_q-not-ending-at-rows", _replace(cum_seq_lens_q=torch.tensor([0, 5, 14], dtype=torch.int32)),
     "cum_seq_lens_q"),
    ("prefill", "cum_kv-not-from-0", _replace(cum_seq_lens_kv=torch.tensor([2, 7, 27], dtype=torch.int32)),
     "cum_seq_lens_kv"),
    ("prefill", "cum_kv-decreasing", _replace(cum_seq_lens_kv=torch.tensor([0, 5, 4], dtype=torch.int32)),
     "cum_seq_lens_kv"),
    ("prefill", "cum_kv-not-the-lengths", _replace(cum_seq_lens_kv=torch.tensor([0, 5, 24], dtype=torch.int32)),
     "cum_seq_lens_kv"),
    ("prefill", "bmm1_scale-inf", _replace(bmm1_scale=torch.tensor([float("-inf")])), "bmm1_scale"),
    # xqa
    ("xqa", "uint32-length-2^32-1", _replace(seq_lens=lambda kw: torch.tensor([[20], [2**32 - 1]], dtype=torch.int64)
                                             .to(torch.uint32)), "seq_lens"),
    ("xqa", "negative-int32-length", _replace(seq_lens=torch.tensor([[20], [-3]], dtype=torch.int32)), "seq_lens"),
    ("xqa", "page-id-in-v-pool-only", lambda kw: kw.update(v_cache=torch.cat((kw["v_cache"], kw["v_cache"][:32])),
                                                           page_table=torch.tensor([[3, 4], [0, 2]], dtype=torch.int32)),
     "page_table"),
    ("xqa", "q_scale-nan", _replace(q_scale=torch.tensor([float("nan")])), "q_scale"),
    ("xqa", "kv_scale-inf", lambda kw: kw.update(k_cache=kw["k_cache"].to(torch.float8_e4m3fn),
                                                 v_cache=kw["v_cache"].to(torch.float8_e4m3fn),
                                                 kv_scale=torch.tensor([float("inf")])), "kv_scale"),
    # MLA
    ("mla", "negative-length", _set("seq_lens", 1, -64), "seq_lens"),
    ("mla", "max_seq_len-below-a-length", _replace(max_seq_len=63), "max_seq_len"),
    ("mla", "bmm2_scale-nan", _replace(bmm2_scale=torch.tensor([float("nan")])), "bmm2_scale"),
    ("mla", "length-shorter-than-tokens", _replace(query=torch.randn(2, 3, 16, 576, dtype=BF16),
                                                   seq_lens=torch.tensor([2, 64], dtype=torch.int32)), "seq_lens"),
]
_FUNCS = {"decode": (kvattn.xqa_batch_decode_with_kv_cache, _decode_args),
          "prefill": (kvattn.trtllm_batch_context_with_kv_cache, _prefill_args),
          "xqa": (kvattn.xqa, _xqa_args), "mla": (kvattn.xqa_batch_decode_with_kv_cache_mla, _mla_args)}


@pytest.mark.parametrize("func, mutate, name", [pytest.param(f, m, n, id=f"{f}-{i}") for f, i, m, n in DEBUG_CASES])
def test_debug_reports(debug_on, func, mutate, name):
    fn, args = _FUNCS[func]
    kw = args()
    mutate(kw)
    with pytest.raises(ValueError, match=f"^{name}:"):
        fn(**kw)


@pytest.mark.parametrize("func, mutate, name", [pytest.param(f, m, n, id=f"{f}-{i}") for f, i, m, n in DEBUG_CASES])
def test_debug_cases_pass_validation_when_off(monkeypatch, func, mutate, name):
    """Each case above is a device value only the device-value checks read: with them off,
    validation passes (the computation is stubbed: what it gives for such values is
    docs/semantics.md's business)."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    calls = []
    for op in ("batch_decode", "context", "mla_decode"):
        monkeypatch.setattr(reference, op, lambda *a, **k: calls.append(op) or torch.zeros(a[0].shape))
    fn, args = _FUNCS[func]
    kw = args()
    mutate(kw)
    fn(**kw)
    assert calls


@pytest.mark.parametrize("func", list(_FUNCS))
def test_debug_accepts_valid_calls(debug_on, func):
    fn, args = _FUNCS[func]
    fn(**args())


def test_debug_accepts_empty_requests_among_drafts(debug_on):
    kw = _decode_args()
    _spec(kw)
    kw["seq_lens"][0] = 0  # an empty (padding) request: no drafts to count
    kvattn.xqa_batch_decode_with_kv_cache(**kw)


def test_mla_request_exactly_q_long_or_empty_is_not_reported(debug_on):
    """Q tokens over a request of exactly Q keys, beside an empty one: well formed, no report."""
    kw = _mla_args()
    kw.update(query=torch.randn(2, 3, 16, 576, dtype=BF16), seq_lens=torch.tensor([3, 0], dtype=torch.int32))
    assert kvattn.xqa_batch_decode_with_kv_cache_mla(**kw).shape == (2, 3, 16, 512)
