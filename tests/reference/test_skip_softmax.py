"""Skip-softmax context attention: the reference against a re-derivation of SPEC's tile rule.

SPEC: with ``lambda = f / L``, a KV tile other than the first processed is skipped (no exp, no
denominator term, no running-max update) when ``exp(tile_max - running_max) < lambda`` for every row
of the query tile. kvattn's tiles: 128 query rows (aligned at each request's first query row) x 128
keys (aligned at key 0); one decision per (query tile, head). :func:`kvattn.dense.skip_softmax_kept_tiles`
re-derives the kept (row, key) set; the result must be exact attention over that set.
"""

import math

import pytest
import torch
from .refcheck import assert_close, paged_case, randq, workspace

from kvattn import dense, reference
from kvattn.prefill import trtllm_batch_context_with_kv_cache

pytestmark = pytest.mark.usefixtures("reference_backend")  # the plain-PyTorch backend, explicitly

LENS, LQ = [300, 260], [300, 20]  # three query tiles; one short query tile deep in the keys
HQ, D, SCALE = 2, 64, 0.125


def make_case(seed=0):
    """First-tile keys share a direction with every query, so later tiles score far lower."""
    case = paged_case(LENS, hkv=1, d=D, page=32, seed=seed)
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(D, generator=g)
    u = u / u.norm()
    for b, length in enumerate(LENS):
        for t in range(min(length, 128)):
            page = int(case.block_tables[b, t // 32])
            case.kv_cache[page, 0, t % 32] += (10.0 * u).to(case.kv_cache.dtype)
            case.k_tokens[b][t] = case.kv_cache[page, 0, t % 32].float()
    q = randq(sum(LQ), HQ, D, seed=seed, scale=0.5) + (10.0 * u).to(torch.bfloat16)
    return case, q


def call(case, q, f, window_left=-1, sinks=None):
    cq = torch.tensor([0, LQ[0], sum(LQ)], dtype=torch.int32)
    out = trtllm_batch_context_with_kv_cache(
        q, case.kv_cache, workspace(), case.block_tables, case.seq_lens, max(LQ), max(LENS), SCALE, 1.0, 2, cq,
        torch.tensor([0, LENS[0], sum(LENS)], dtype=torch.int32), window_left=window_left, kv_layout="NHD", sinks=sinks, skip_softmax_threshold_scale_factor=f)
    return out, cq


def dense_ctx(case, q, cq, f=None, window_left=-1, sinks=None):
    return dense.context(q, case.kv_cache, case.block_tables, case.seq_lens, cq, SCALE, 1.0, kv_layout="NHD",
                         window_left=window_left, sinks=sinks, skip_softmax_threshold_scale_factor=f)


def count_skipped(case, q, cq, f, window_left=-1):
    total = 0
    for b, (length, n) in enumerate(zip(LENS, LQ)):
        qb = q[int(cq[b]) : int(cq[b]) + n].double()
        k = case.k_tokens[b].double().repeat_interleave(HQ, dim=1)
        logits = torch.einsum("qhd,lhd->hql", qb, k) * SCALE
        p = torch.arange(length - n, length).view(-1, 1)
        j = torch.arange(length).view(1, -1)
        vis = (j <= p) & ((p - j <= window_left) if window_left >= 0 else True)
        _, skipped = dense.skip_softmax_kept_tiles(logits, vis, f / length)
        total += skipped
    return total


def test_tile_size_is_documented():
    assert (reference.SKIP_SOFTMAX_TILE_M, reference.SKIP_SOFTMAX_TILE_N) == (128, 128)


@pytest.mark.parametrize("f", [None, 0, 0.0, 1e-30], ids=["None", "int0", "float0", "tiny"])
def test_exact_when_off_or_tiny(f):
    case, q = make_case(1)
    out, cq = call(case, q, f)
    exact = dense_ctx(case, q, cq)
    assert_close(out, exact)
    if f:
        assert count_skipped(case, q, cq, f) == 0


@pytest.mark.parametrize(
    "f, window_left",
    [(1e-3, -1), (3e-3, -1), (1e-2, -1), (3e-3, 200), (100.0, 100)],
    ids=["f1e-3-causal", "f3e-3-causal", "f1e-2-causal", "f3e-3-window200", "f100-window100-first-tile-1"],
)
def test_matches_tile_rule(f, window_left):
    case, q = make_case(2)
    out, cq = call(case, q, f, window_left=window_left)
    ref = dense_ctx(case, q, cq, f=f, window_left=window_left)
    assert_close(out, ref)
    skipped = count_skipped(case, q, cq, f, window_left)
    assert skipped > 0, "the case must skip some tiles"
    exact = dense_ctx(case, q, cq, window_left=window_left)
    assert not torch.allclose(ref, exact, rtol=0, atol=1e-12)


def test_matches_tile_rule_with_sinks():
    case, q = make_case(3)
    sinks = torch.tensor([1.0, -2.0])
    out, cq = call(case, q, 3e-3, sinks=sinks)
    assert count_skipped(case, q, cq, 3e-3) > 0
    assert_close(out, dense_ctx(case, q, cq, f=3e-3, sinks=sinks))


def test_huge_factor_keeps_only_the_first_tile():
    """lambda >> 1: every tile after the first is skipped, so each row attends to keys j < 128 only."""
    case, q = make_case(4)
    out, cq = call(case, q, 1e30)
    rows = []
    for b, (length, n) in enumerate(zip(LENS, LQ)):
        qb = q[int(cq[b]) : int(cq[b]) + n].double()
        k = case.k_tokens[b].double().repeat_interleave(HQ, dim=1)
        v = case.v_tokens[b].double().repeat_interleave(HQ, dim=1)
        s = torch.einsum("qhd,lhd->qhl", qb, k) * SCALE
        p = torch.arange(length - n, length).view(-1, 1, 1)
        j = torch.arange(length).view(1, 1, -1)
        s = s.masked_fill(~((j <= p) & (j < 128)), -math.inf)
        rows.append(torch.einsum("qhl,lhd->qhd", torch.softmax(s, dim=-1), v))
    assert_close(out, torch.cat(rows))
