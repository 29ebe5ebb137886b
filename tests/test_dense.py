"""The dense float64 oracle itself, on cases whose answers are computed by hand."""

import math

import pytest
import torch

from kvattn import dense


def _one_request_cache(k_tokens, v_tokens, page=16):
    """Stacked NHD cache [pages, 2, page, Hkv, D] holding the tokens in order, pages reversed."""
    length, hkv, d = k_tokens.shape
    pages = (length + page - 1) // page
    cache = torch.full((pages, 2, page, hkv, d), float("nan"))
    table = torch.arange(pages - 1, -1, -1, dtype=torch.int32).view(1, -1)
    for t in range(length):
        cache[pages - 1 - t // page, 0, t % page] = k_tokens[t]
        cache[pages - 1 - t // page, 1, t % page] = v_tokens[t]
    return cache, table, torch.tensor([length], dtype=torch.int32)


def test_single_key_returns_its_value_and_its_logit_as_lse():
    q = torch.zeros(2, 64)
    q[:, 0] = 2.0
    k = torch.zeros(1, 1, 64)
    k[0, 0, 0] = 3.0
    v = torch.arange(64.0).view(1, 1, 64)
    o, lse = dense.single_decode(q, k, v, sm_scale=0.5)
    assert torch.equal(o, v[0].double().expand(2, 64))
    torch.testing.assert_close(lse, torch.full((2,), 3.0 / math.log(2), dtype=torch.float64))


def test_two_keys_softmax_and_sink_by_hand():
    k = torch.zeros(2, 1, 64)
    k[0, 0, 0] = 1.0  # logit a for key 0, 0 for key 1
    v = torch.zeros(2, 1, 64)
    v[0, 0, 1], v[1, 0, 2] = 1.0, 1.0
    q = torch.zeros(1, 1, 64)
    q[0, 0, 0] = 1.0
    a, sink = 1.5, 0.7
    cache, table, lens = _one_request_cache(k, v)
    o = dense.batch_decode(q, cache, table, lens, bmm1_scale=a, sinks=torch.tensor([sink]))
    den = math.exp(a) + 1 + math.exp(sink)
    torch.testing.assert_close(o[0, 0, 1].item(), math.exp(a) / den)
    torch.testing.assert_close(o[0, 0, 2].item(), 1 / den)
    assert o[0, 0, 0].item() == 0


def test_spec_decode_mask_bits():
    # Q = 3, row 0 sees drafts {2}, row 1 sees {0, 1}, row 2 none (mask words: bit c of word 0).
    mask = torch.tensor([[[0b100, 0], [0b011, 0], [0, 0]]], dtype=torch.int32).to(torch.uint16)
    bits = dense._draft_bits(mask, 1, 3, "cpu")
    assert bits.tolist() == [[[False, False, True], [True, True, False], [False, False, False]]]
    causal = dense._draft_bits(None, 1, 3, "cpu")
    assert causal.tolist() == [[[True, False, False], [True, True, False], [True, True, True]]]


def test_alibi_slopes_by_hand():
    assert dense.alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    twelve = dense.alibi_slopes(12).tolist()
    assert twelve[:8] == [2.0**-i for i in range(1, 9)]
    torch.testing.assert_close(torch.tensor(twelve[8:], dtype=torch.float64),
                               torch.tensor([2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5], dtype=torch.float64))


def test_rope_rotates_pairs_by_position():
    x = torch.zeros(1, 1, 4, dtype=torch.float64)
    x[0, 0, 0] = 1.0  # pair (x[0], x[2]) at frequency theta^0 = 1
    y = dense.rope_rotate(x, torch.tensor([2]), 1.0, 1e4)
    torch.testing.assert_close(y[0, 0], torch.tensor([math.cos(2), 0, math.sin(2), 0], dtype=torch.float64))
    x2 = torch.zeros(1, 1, 4, dtype=torch.float64)
    x2[0, 0, 1] = 1.0  # pair (x[1], x[3]) at frequency 100^-1, halved by rope_scale 2
    y2 = dense.rope_rotate(x2, torch.tensor([3]), 2.0, 100.0)
    ang = 3 * 0.1 / 2
    torch.testing.assert_close(y2[0, 0], torch.tensor([0, math.cos(ang), 0, math.sin(ang)], dtype=torch.float64))


def test_decode_nvfp4_by_hand():
    packed = torch.zeros(1, 8, dtype=torch.uint8)
    packed[0, 0] = 0xD7  # low nibble 7 (+6), high nibble 13 (-3)
    packed[0, 1] = 0x21  # +0.5, +1
    scale = torch.tensor([[2.0]]).to(torch.float8_e4m3fn)
    vals = dense.decode_nvfp4(packed, scale)
    assert vals[0, :4].tolist() == [12.0, -6.0, 1.0, 2.0]
    assert (vals[0, 4:] == 0).all()


def test_empty_request_row_is_zero_and_window_zero_is_own_value():
    k = torch.randn(5, 1, 64)
    v = torch.randn(5, 1, 64)
    cache, table, _ = _one_request_cache(k, v)
    q = torch.randn(2, 1, 64)
    table2 = torch.cat([table, table])
    o = dense.batch_decode(q, cache, table2, torch.tensor([0, 5], dtype=torch.int32), window_left=0)
    assert (o[0] == 0).all()
    torch.testing.assert_close(o[1], v[4].double())


def test_bidirectional_context_by_hand():
    """causal=False: every query row of a request sees all its keys, whatever its position: here a
    request of 3 keys and 2 rows, each row's output the softmax over all 3 keys by hand (the first
    row would see 2 of them causally), and an empty request's row is zero."""
    k, v = torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    cache, table, _ = _one_request_cache(k, v)
    q = torch.randn(3, 1, 8)
    tables = torch.cat([table, table])
    lens = torch.tensor([3, 0], dtype=torch.int32)
    cum = torch.tensor([0, 2, 3], dtype=torch.int32)
    o, lse = dense.context(q, cache, tables, lens, cum, 0.5, 1.0, kv_layout="NHD", causal=False, return_lse=True)
    for row in range(2):
        logits = 0.5 * (k[:, 0].double() @ q[row, 0].double())
        torch.testing.assert_close(o[row, 0], torch.softmax(logits, 0) @ v[:, 0].double())
        torch.testing.assert_close(lse[row, 0], torch.logsumexp(logits, 0) / math.log(2))  # (base 2)
    assert (o[2] == 0).all()
    causal = dense.context(q, cache, tables, lens, cum, 0.5, 1.0, kv_layout="NHD")
    assert not torch.allclose(causal[0], o[0])  # (the causal first row sees two keys)
    torch.testing.assert_close(causal[1], o[1])  # (the last row sees all three either way)


def test_bidirectional_context_takes_no_window():
    k = v = torch.randn(3, 1, 8)
    cache, table, lens = _one_request_cache(k, v)
    q = torch.randn(1, 1, 8)
    with pytest.raises(ValueError, match="window_left"):
        dense.context(q, cache, table, lens, torch.tensor([0, 1], dtype=torch.int32), kv_layout="NHD",
                      window_left=1, causal=False)
