"""Legal edge calls and unusable inputs, on both backends.

* An empty batch (B = 0: a serving step with no requests of a kind) returns empty outputs; zero
  heads are a ValueError naming the argument.
* Page ids and lengths a call cannot use follow one rule on both backends (docs/semantics.md,
  "Unusable page ids and lengths"): a token whose page id lies outside ``[0, num_pages)`` reads as
  a zero key and a zero value (as if its id named a page of zeros), a length is read as int32, a
  negative one is 0 and one past the table's capacity is the capacity. The zero-page formulation
  (:func:`_zero_page`) checks the rule independently of both backends. The reference is compared with the Triton kernels
  (Triton's interpreter on a CPU, float16: the interpreter has no bfloat16 arithmetic).
"""

import pytest
import torch

import kvattn
from kvattn.formats import FP8_DTYPE
from kvattn.testing import make_paged_kv

F16 = torch.float16
BACKENDS = ("reference", "triton")


@pytest.fixture(autouse=True)
def _device_checks_off(monkeypatch):
    """The values here are the ones the device-value checks reject (on by default for CPU
    tensors; tests/test_debug_checks.py tests them): what is tested is what each backend does
    with them, so the checks are off."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")


def on(backend, monkeypatch, fn, *args, **kwargs):
    monkeypatch.setenv("KVATTN_BACKEND", backend)
    return fn(*args, **kwargs)


def ws(device):
    return torch.zeros(1 << 22, dtype=torch.uint8, device=device)


# ---------------------------------------------------------------------------------------------
# empty batches, zero heads
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("q_len", [1, 3])
def test_batch_decode_empty_batch(backend, q_len, kernel_device, monkeypatch):
    kv = torch.randn(4, 2, 16, 2, 64, dtype=F16, device=kernel_device)
    q = torch.randn(0, 8, 64, dtype=F16, device=kernel_device)
    o, lse = on(backend, monkeypatch, kvattn.xqa_batch_decode_with_kv_cache, q, kv, ws(kernel_device),
                torch.zeros(0, 2, dtype=torch.int32, device=kernel_device),
                torch.zeros(0, dtype=torch.int32, device=kernel_device), 32, q_len_per_req=q_len, return_lse=True)
    assert o.shape == (0, 8, 64) and lse.shape == (0, 8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_xqa_empty_batch(backend, kernel_device, monkeypatch):
    d = kernel_device
    out = torch.empty(0, 1, 8, 64, dtype=F16, device=d)
    lse = on(backend, monkeypatch, kvattn.xqa, torch.randn(0, 1, 8, 64, dtype=F16, device=d),
             torch.randn(128, 64, dtype=F16, device=d), torch.randn(128, 64, dtype=F16, device=d),
             torch.zeros(0, 2, dtype=torch.int32, device=d), torch.zeros(0, 1, dtype=torch.uint32, device=d), out,
             ws(d), torch.zeros(1, dtype=torch.uint32, device=d), 2, 16, return_lse=True)
    assert lse.shape == (0, 1, 8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mla_empty_batch(backend, kernel_device, monkeypatch):
    d = kernel_device  # fp8 in, float32 out: nothing the interpreter computes in bfloat16
    q = torch.randn(0, 1, 16, 576, device=d).to(FP8_DTYPE)
    cache = torch.randn(2, 32, 576, device=d).to(FP8_DTYPE)
    o, lse = on(backend, monkeypatch, kvattn.xqa_batch_decode_with_kv_cache_mla, q, cache, ws(d), 128, 512, 64,
                torch.zeros(0, 2, dtype=torch.int32, device=d), torch.zeros(0, dtype=torch.int32, device=d), 64,
                out=torch.empty(0, 16, 512, device=d), return_lse=True)
    assert o.shape == (0, 16, 512) and lse.shape == (0, 16)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch", [0, 2])
def test_prefill_no_query_rows(backend, batch, kernel_device, monkeypatch):
    """No requests, or requests with no new rows: an empty output."""
    d = kernel_device
    kv = torch.randn(4, 2, 2, 16, 64, dtype=F16, device=d)
    cum = torch.zeros(batch + 1, dtype=torch.int32, device=d)
    o, lse = on(backend, monkeypatch, kvattn.trtllm_batch_context_with_kv_cache,
                torch.randn(0, 8, 64, dtype=F16, device=d), kv, ws(d),
                torch.arange(2 * batch, dtype=torch.int32, device=d).view(batch, 2),
                torch.full((batch,), 20, dtype=torch.int32, device=d), 0, 32, 0.1, 1.0, batch, cum, cum,
                return_lse=True)
    assert o.shape == (0, 8, 64) and lse.shape == (0, 8)


# ---------------------------------------------------------------------------------------------
# unusable page ids and lengths: one rule, both backends
# ---------------------------------------------------------------------------------------------
PAGE = 16
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def _both(monkeypatch, call):
    """``call()`` on the reference and on the Triton kernels, outputs as float32 (NaN-poisoned
    outputs: a row a backend leaves unwritten shows)."""
    got = []
    for backend in BACKENDS:
        monkeypatch.setenv("KVATTN_BACKEND", backend)
        got.append([t.float() for t in call()])
    return got


def _assert_agree(got, atol=2e-3):
    (ref_o, ref_lse), (tri_o, tri_lse) = got
    assert torch.isfinite(ref_o).all() and torch.isfinite(tri_o).all()
    torch.testing.assert_close(tri_o, ref_o, atol=atol, rtol=1e-2)
    torch.testing.assert_close(tri_lse, ref_lse, atol=atol, rtol=1e-3)


def _decode_case(device, lens=(20, 40, 7, 33), nan_fill=True, page=PAGE):
    """Unused cache slots hold NaN (``nan_fill``): a token read that should not be shows. Calls whose
    lengths reach past the tokens written read those slots as keys, so they take finite values."""
    c = make_paged_kv(list(lens), num_kv_heads=2, head_dim=64, page_size=page, dtype=F16, device=device,
                      nan_fill=nan_fill)
    tables = c.block_tables.clone()
    num_pages = c.kv_cache.shape[0]
    tables[0, 1] = -1  # request 0's tokens 16..19 (page 16)
    tables[1, 0] = num_pages  # request 1's tokens 0..15
    tables[1, 2] = INT_MAX  # request 1's tokens 32..39
    tables[3, 1] = INT_MIN  # request 3's tokens 16..31
    return c, tables


def _zero_page(cache: torch.Tensor, tables: torch.Tensor, num_pages: int | None = None):
    """The rule restated without it: ``(cache', tables')`` where the cache has one more page, of
    zeros, and every id outside ``[0, num_pages)`` (default: the cache's page count) names it."""
    n = cache.shape[0] if num_pages is None else num_pages
    bigger = torch.cat([cache, torch.zeros_like(cache[:1])])
    bad = (tables < 0) | (tables >= n)
    return bigger, torch.where(bad, torch.full_like(tables, cache.shape[0]), tables)


def _decode_call(c, tables, seq_lens, q, max_seq_len, device, **kw):
    def call():
        out = torch.full(q.shape, float("nan"), dtype=F16, device=device)
        return kvattn.xqa_batch_decode_with_kv_cache(q, c.kv_cache, ws(device), tables, seq_lens, max_seq_len,
                                                     bmm1_scale=0.125, out=out, return_lse=True, **kw)
    return call


class _Cache:
    """A cache in ``make_paged_kv``'s attribute names (what the call builders read)."""

    def __init__(self, kv_cache, block_tables):
        self.kv_cache, self.block_tables = kv_cache, block_tables


def test_batch_decode_reads_unusable_page_ids_as_zeros(kernel_device, monkeypatch):
    d = kernel_device
    c, tables = _decode_case(d)
    q = torch.randn(4, 8, 64, dtype=F16, device=d)
    got = _both(monkeypatch, _decode_call(c, tables, c.seq_lens, q, 40, d))
    _assert_agree(got)
    # Independently of both backends: the same call with those ids naming a page of zeros.
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    cache, zero_tables = _zero_page(c.kv_cache, tables)
    want_o, want_lse = _decode_call(_Cache(cache, zero_tables), zero_tables, c.seq_lens, q, 40, d)()
    torch.testing.assert_close(got[0][0], want_o.float(), atol=1e-3, rtol=0)
    torch.testing.assert_close(got[0][1], want_lse, atol=1e-4, rtol=0)
    # (and the rule is not "dropped": request 0's output moves when its page of zeros is left out)
    short = c.seq_lens.clone()
    short[0] = 16
    o16, _ = _decode_call(c, c.block_tables, short, q, 40, d)()
    assert not torch.allclose(got[0][0][0], o16[0].float(), atol=1e-3, rtol=0)


@pytest.mark.parametrize("q_len, window", [(1, 10), (2, -1)])
def test_batch_decode_unusable_ids_with_window_and_drafts(q_len, window, kernel_device, monkeypatch):
    d = kernel_device
    c, tables = _decode_case(d)
    q = torch.randn(4 * q_len, 8, 64, dtype=F16, device=d)
    _assert_agree(_both(monkeypatch, _decode_call(c, tables, c.seq_lens, q, 40, d, q_len_per_req=q_len,
                                                  window_left=window)))


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint32])
def test_batch_decode_lengths_below_zero_or_past_int32(dtype, kernel_device, monkeypatch):
    """Negative int32 lengths, and uint32 lengths of 2^31 or more (negative as int32), are 0: zero
    rows, LSE -inf; the reference allocates nothing for them."""
    d = kernel_device
    c, _ = _decode_case(d)
    lens = [20, -5, 7, INT_MIN] if dtype == torch.int32 else [20, 2**32 - 1, 7, 2**31]
    seq_lens = torch.tensor(lens, dtype=torch.int64).to(torch.uint32 if dtype == torch.uint32 else torch.int32)
    q = torch.randn(4, 8, 64, dtype=F16, device=d)
    got = _both(monkeypatch, _decode_call(c, c.block_tables, seq_lens.to(d), q, 40, d))
    _assert_agree(got)
    for o, lse in got:
        assert (o[[1, 3]] == 0).all() and torch.isneginf(lse[[1, 3]]).all()
        assert (o[0] != 0).any()


def test_batch_decode_length_past_capacity_is_the_capacity(kernel_device, monkeypatch):
    d = kernel_device
    c = make_paged_kv([20, 40], num_kv_heads=2, head_dim=64, page_size=PAGE, dtype=F16, device=d, pages_per_seq=3,
                      nan_fill=False)  # (the capacity reaches slots no token was written to)
    q = torch.randn(2, 8, 64, dtype=F16, device=d)
    over = torch.tensor([20, 1000], dtype=torch.int32, device=d)
    _assert_agree(_both(monkeypatch, _decode_call(c, c.block_tables, over, q, 48, d)))


def test_reference_length_past_capacity_is_the_capacity(monkeypatch):
    """The reference reads at most the table's capacity: a length past it is the capacity."""
    c = make_paged_kv([20, 48], num_kv_heads=2, head_dim=64, page_size=PAGE, dtype=F16, pages_per_seq=3)
    q = torch.randn(2, 8, 64, dtype=F16)
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    o_cap, lse_cap = _decode_call(c, c.block_tables, c.seq_lens, q, 48, "cpu")()
    over = torch.tensor([20, 2**31 - 1], dtype=torch.int32)
    o, lse = _decode_call(c, c.block_tables, over, q, 48, "cpu")()
    torch.testing.assert_close(o, o_cap, atol=0, rtol=0)
    torch.testing.assert_close(lse, lse_cap, atol=0, rtol=0)


def _prefill_call(c, tables, seq_lens, cum, q, device, page=PAGE, **kw):
    def call():
        out = torch.full(q.shape, float("nan"), dtype=F16, device=device)
        b = seq_lens.shape[0]
        return kvattn.trtllm_batch_context_with_kv_cache(
            q, c.kv_cache, ws(device), tables, seq_lens, 16, c.block_tables.shape[-1] * page, 0.125, 1.0, b, cum,
            cum, out=out, kv_layout="NHD", return_lse=True, **kw)
    return call


# Pages of 8 and 16 tokens: several pages a key tile on the GPU (the Triton kernel's masked
# tokens), one page a tile in the interpreter's 16-key tiles; pages of 64: one page a tile, the
# warp-specialised Gluon kernel on Hopper and, with KVATTN_GLUON=0, the Triton kernel's TMA tiles.
@pytest.mark.parametrize("gluon", ["default", "0"])
@pytest.mark.parametrize("page", [8, 16, 64], ids=lambda p: f"page{p}")
@pytest.mark.parametrize("window", [-1, 12], ids=lambda w: f"window{w}")
def test_prefill_reads_unusable_page_ids_as_zeros(window, page, gluon, kernel_device, monkeypatch):
    d = kernel_device
    if gluon != "default":
        if d == "cpu":
            pytest.skip("the switch chooses between GPU kernels")
        monkeypatch.setenv("KVATTN_GLUON", gluon)
    scale = page // 16 if page >= 16 else 1
    c, tables = _decode_case(d, lens=tuple(n * scale for n in (20, 40, 7, 33)), page=page)
    cum = torch.tensor([0, 5, 11, 14, 30], dtype=torch.int32, device=d)
    q = torch.randn(30, 8, 64, dtype=F16, device=d)
    _assert_agree(_both(monkeypatch, _prefill_call(c, tables, c.seq_lens, cum, q, d, page=page,
                                                   window_left=window)))


@pytest.mark.parametrize("window", [-1, 12])
def test_prefill_unusable_lengths(window, kernel_device, monkeypatch):
    """A negative length, an int32 one past the capacity, uint32 ones of 2^31 and more."""
    d = kernel_device
    c, _ = _decode_case(d, lens=(20, 40, 7, 33), nan_fill=False)
    cum = torch.tensor([0, 5, 11, 14, 30], dtype=torch.int32, device=d)
    q = torch.randn(30, 8, 64, dtype=F16, device=d)
    tables = c.block_tables.remainder(c.kv_cache.shape[0])  # every entry a page (lengths reach them all)
    cap = tables.shape[1] * PAGE
    lens = torch.tensor([-3, 2**31 - 1, 7, cap + 50], dtype=torch.int32, device=d)
    got = _both(monkeypatch, _prefill_call(c, tables, lens, cum, q, d, window_left=window))
    _assert_agree(got)
    for o, lse in got:
        assert (o[0:5] == 0).all() and torch.isneginf(lse[0:5]).all()
    # (2^31 itself, INT_MIN as int32, overflows the prefill kernel's position arithmetic: see
    # test_prefill_length_int_min)
    u32 = torch.tensor([20, 2**32 - 1, 7, 2**32 - 5], dtype=torch.int64).to(torch.uint32).to(d)
    got = _both(monkeypatch, _prefill_call(c, tables, u32, cum, q, d, window_left=window))
    _assert_agree(got)
    for o, lse in got:
        assert (o[5:11] == 0).all() and (o[14:] == 0).all() and torch.isneginf(lse[14:]).all()


def test_prefill_length_int_min(kernel_device, monkeypatch):
    d = kernel_device
    c = make_paged_kv([20, 40], num_kv_heads=2, head_dim=64, page_size=PAGE, dtype=F16, device=d, nan_fill=False)
    cum = torch.tensor([0, 5, 21], dtype=torch.int32, device=d)
    q = torch.randn(21, 8, 64, dtype=F16, device=d)
    u32 = torch.tensor([20, 2**31], dtype=torch.int64).to(torch.uint32).to(d)
    got = _both(monkeypatch, _prefill_call(c, c.block_tables, u32, cum, q, d))
    _assert_agree(got)
    assert all((o[5:] == 0).all() for o, _ in got)


@pytest.mark.parametrize("page", [16, 64], ids=lambda p: f"page{p}")
def test_prefill_split_tables_a_bad_v_id_reads_a_zero_value(page, kernel_device, monkeypatch):
    """With separate K and V page ids, a token whose V id alone is unusable keeps its key and reads
    a zero value."""
    d = kernel_device
    n = page // 16
    c = make_paged_kv([20 * n, 40 * n], num_kv_heads=2, head_dim=64, page_size=page, dtype=F16, device=d,
                      split_tables=True)
    tables = c.block_tables.clone()
    tables[1, 1, 1] = -7  # request 1's V page of tokens 16..31 (page 16)
    cum = torch.tensor([0, 4, 12], dtype=torch.int32, device=d)
    q = torch.randn(12, 8, 64, dtype=F16, device=d)
    _assert_agree(_both(monkeypatch, _prefill_call(c, tables, c.seq_lens, cum, q, d, page=page,
                                                   uses_shared_paged_kv_idx=False)))


def test_reference_prefill_reads_unusable_page_ids_as_zeros(monkeypatch):
    """Independently of the kernels: the call equals the one whose unusable ids name a page of
    zeros appended to the cache."""
    c, tables = _decode_case("cpu", lens=(20, 40, 7, 33))
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    cum = torch.tensor([0, 5, 11, 14, 30], dtype=torch.int32)
    q = torch.randn(30, 8, 64, dtype=F16)
    o, lse = _prefill_call(c, tables, c.seq_lens, cum, q, "cpu")()
    cache, zero_tables = _zero_page(c.kv_cache, tables)
    want_o, want_lse = _prefill_call(_Cache(cache, zero_tables), zero_tables, c.seq_lens, cum, q, "cpu")()
    torch.testing.assert_close(o, want_o, atol=1e-3, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=0)


def test_xqa_ids_past_k_pool_read_zeros_even_where_v_has_pages(kernel_device, monkeypatch):
    """xqa bounds both tables' ids by K's page count: a V pool larger than K's reads no further (an
    id past K's pool is a zero key and a zero value, V's page there notwithstanding)."""
    d = kernel_device
    pool = 4 * PAGE * 2
    k = torch.randn(pool, 64, dtype=F16, device=d)
    v = torch.randn(pool + PAGE * 2, 64, dtype=F16, device=d)  # one page more
    table = torch.tensor([[3, 4], [0, -1]], dtype=torch.int32, device=d)  # 4: V's page only; -1
    lens = torch.tensor([[30], [20]], dtype=torch.uint32, device=d)
    q = torch.randn(2, 1, 8, 64, dtype=F16, device=d)

    def call():
        out = torch.full(q.shape, float("nan"), dtype=F16, device=d)
        lse = kvattn.xqa(q, k, v, table, lens, out, ws(d), torch.zeros(1, dtype=torch.uint32, device=d), 2, PAGE,
                         return_lse=True)
        return out, lse

    got = _both(monkeypatch, call)
    _assert_agree(got)
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    zero = torch.zeros(PAGE * 2, 64, dtype=F16, device=d)  # a page (2 KV heads) of zeros after K's pool
    k2, v2 = torch.cat([k, zero]), torch.cat([v[:pool], zero])
    table2 = torch.tensor([[3, 4], [0, 4]], dtype=torch.int32, device=d)
    out2 = torch.empty_like(q)
    lse2 = kvattn.xqa(q, k2, v2, table2, lens, out2, ws(d), torch.zeros(1, dtype=torch.uint32, device=d), 2, PAGE,
                      return_lse=True)
    torch.testing.assert_close(got[0][0], out2.float(), atol=1e-3, rtol=0)
    torch.testing.assert_close(got[0][1], lse2, atol=1e-4, rtol=0)


def test_mla_reads_unusable_page_ids_as_zeros(kernel_device, monkeypatch):
    d = kernel_device  # fp8 in, float32 out (see test_mla_empty_batch)
    torch.manual_seed(0)
    cache = (torch.randn(5, 32, 576, device=d) * 0.5).to(FP8_DTYPE)
    q = (torch.randn(3, 1, 16, 576, device=d) * 0.5).to(FP8_DTYPE)
    table = torch.tensor([[0, -1], [1, 99], [INT_MIN, 2]], dtype=torch.int32, device=d)
    lens = torch.tensor([40, 64, -2], dtype=torch.int32, device=d)

    def call():
        out = torch.full((3, 16, 512), float("nan"), device=d)
        return kvattn.xqa_batch_decode_with_kv_cache_mla(q, cache, ws(d), 128, 512, 64, table, lens, 64, out=out,
                                                         bmm1_scale=0.05, return_lse=True)

    got = _both(monkeypatch, call)
    _assert_agree(got, atol=1e-3)
    assert (got[0][0][2] == 0).all() and torch.isneginf(got[0][1][2]).all()
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    cache, table = _zero_page(cache, table)
    want_o, want_lse = call()
    torch.testing.assert_close(got[0][0][:2], want_o[:2], atol=1e-4, rtol=0)
    torch.testing.assert_close(got[0][1][:2], want_lse[:2], atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------
# Triton's interpreter and bfloat16
# ---------------------------------------------------------------------------------------------
BF16 = torch.bfloat16


def _bf16_calls():
    c = make_paged_kv([5, 20], num_kv_heads=2, head_dim=64, page_size=16, dtype=BF16)
    cq = torch.tensor([0, 5, 15], dtype=torch.int32)
    pool = torch.randn(128, 64, dtype=BF16)
    return {
        "batch_decode": (lambda: kvattn.xqa_batch_decode_with_kv_cache(
            torch.randn(2, 8, 64, dtype=BF16), c.kv_cache, ws("cpu"), c.block_tables, c.seq_lens, 20), "kv_cache"),
        "xqa": (lambda: kvattn.xqa(
            torch.randn(2, 1, 8, 64, dtype=BF16), pool, pool, torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
            torch.tensor([[20], [32]], dtype=torch.uint32), torch.empty(2, 1, 8, 64, dtype=BF16), ws("cpu"),
            torch.zeros(1, dtype=torch.uint32), 2, 16), "k_cache"),
        "single_decode": (lambda: kvattn.single_decode_with_kv_cache(
            torch.randn(8, 64, dtype=BF16), torch.randn(9, 2, 64, dtype=BF16), torch.randn(9, 2, 64, dtype=BF16)), "k"),
        "mla": (lambda: kvattn.xqa_batch_decode_with_kv_cache_mla(
            torch.randn(1, 1, 16, 576, dtype=BF16), torch.randn(2, 32, 576, dtype=BF16), ws("cpu"), 128, 512, 64,
            torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([40], dtype=torch.int32), 64), "kv_cache"),
        "mla-fp8-query": (lambda: kvattn.xqa_batch_decode_with_kv_cache_mla(
            torch.randn(1, 1, 16, 576).to(FP8_DTYPE), torch.randn(2, 32, 576, dtype=BF16), ws("cpu"), 128, 512, 64,
            torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([40], dtype=torch.int32), 64), "kv_cache"),
        "prefill": (lambda: kvattn.trtllm_batch_context_with_kv_cache(
            torch.randn(15, 8, 64, dtype=BF16), c.kv_cache, ws("cpu"), c.block_tables, c.seq_lens, 10, 20, 0.1,
            1.0, 2, cq, cq, kv_layout="NHD"), "kv_cache"),
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter (the CPU tier)")
@pytest.mark.parametrize("which", list(_bf16_calls()))
def test_interpreter_rejects_bfloat16(which, triton_backend):
    """The interpreter has no bfloat16 arithmetic (results off by ~1e9): a clear error instead."""
    call, name = _bf16_calls()[which]
    with pytest.raises(TypeError, match=f"^{name}: expected a float16, fp8 or NVFP4 cache under Triton's interpreter.*got bfloat16; "
                                        "convert the inputs to float16, run the reference backend"):
        call()


@pytest.mark.parametrize("which", list(_bf16_calls()))
def test_reference_takes_bfloat16(which, reference_backend):
    call, _ = _bf16_calls()[which]
    call()


@pytest.mark.parametrize("kv_format", ["fp8", "nvfp4"])
def test_interpreter_takes_a_bfloat16_query_over_a_quantised_cache(kv_format, kernel_device, monkeypatch):
    """A bfloat16 query is converted to the float16 operands of an fp8 / NVFP4 cache (conversions are
    right in the interpreter), and a bfloat16 output is a store: the kernels agree with the reference."""
    d = kernel_device
    c = make_paged_kv([20, 40], num_kv_heads=2, head_dim=64, page_size=16, dtype=BF16, kv_format=kv_format,
                      device=d)
    q = torch.randn(2, 8, 64, dtype=BF16, device=d)
    got = _both(monkeypatch, lambda: (kvattn.xqa_batch_decode_with_kv_cache(
        q, c.kv_cache, ws(d), c.block_tables, c.seq_lens, 40, bmm1_scale=0.125, kv_cache_sf=c.kv_cache_sf),))
    assert got[1][0].dtype == torch.float32 and torch.isfinite(got[1][0]).all()
    torch.testing.assert_close(got[1][0], got[0][0], atol=2e-2, rtol=2e-2)
