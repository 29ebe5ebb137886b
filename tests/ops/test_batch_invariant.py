"""Batch-invariant mode (``KVATTN_BATCH_INVARIANT=1`` / ``kvattn.set_batch_invariant``): a
request's output and LSE bitwise independent of its batch-mates, the batch size and the SM count.

Both tiers: the interpreter on small float16 shapes with short split spans (``invariant_span``
overridden, so a request has several splits), compiled on a GPU with the tables' spans. The
float32 LSE shows a different merge even where the float16 output rounds it away; a control test
shows that the default mode does change with the batch here, so the invariance tests can fail.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import kvattn
from kvattn.runtime import device as _device, env as _env
from kvattn import _inputs
from kvattn.ops.common import splits
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.mla import configs as mla_configs
from kvattn.ops.mla import op as mla_op
from kvattn.testing import make_paged_kv, poison_

from .oracle import ON_GPU

WS = 1 << 24
HKV, GROUP, D, PAGE = 2, 4, 64, 16
TARGET_LEN = 150 if not ON_GPU else 5000  # request 0's keys: several spans either way


@pytest.fixture
def short_spans():
    """Spans of 32 keys on the CPU (the interpreter), the tables' own on a GPU; and on the CPU
    the default mode's splits as short as on a GPU (min_chunk 16, several waves), so that mode's
    split count follows the batch here too."""
    if ON_GPU:
        yield
        return
    with decode_configs.override(invariant_span=32, min_chunk=16, waves=4), \
            mla_configs.override(invariant_span=32, min_chunk=16, waves=4):
        yield


def _sm_count(monkeypatch, n):
    real = _device.sm_count
    monkeypatch.setattr(_device, "sm_count", lambda device: n if n else real(device))


# ---------------------------------------------------------------------------------------------
# the switch
# ---------------------------------------------------------------------------------------------
def test_switch_follows_the_variable_and_the_python_call(monkeypatch):
    monkeypatch.delenv("KVATTN_BATCH_INVARIANT", raising=False)
    assert kvattn.is_batch_invariant() is False
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", "1")
    assert kvattn.is_batch_invariant() is True
    with kvattn.batch_invariant(False):
        assert kvattn.is_batch_invariant() is False
        kvattn.set_batch_invariant(True)
        assert kvattn.is_batch_invariant() is True
    assert kvattn.is_batch_invariant() is True  # the block restores what was before it (None: the variable)
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", "0")
    assert kvattn.is_batch_invariant() is False
    kvattn.set_batch_invariant(True)
    try:
        assert kvattn.is_batch_invariant() is True
    finally:
        kvattn.set_batch_invariant(None)
    assert kvattn.is_batch_invariant() is False


def test_switch_rejects_non_bools():
    with pytest.raises(TypeError, match="enabled: expected a bool or None, got int"):
        kvattn.set_batch_invariant(1)
    with pytest.raises(TypeError, match="enabled: expected a bool, got str"):
        with kvattn.batch_invariant("yes"):
            pass
    assert _env._BATCH_INVARIANT[0] is None


def test_invariant_split_counts_depend_on_the_length_only():
    cfg = decode_configs.DecodeConfig(64, 4, 2, invariant_span=1000)
    assert splits.invariant_span(cfg) == 1024  # whole tiles
    assert [splits.invariant_splits(cfg, n) for n in (1, 1024, 1025, 5000)] == [2, 2, 2, 5]


# ---------------------------------------------------------------------------------------------
# decode / xqa: one request among different batch-mates
# ---------------------------------------------------------------------------------------------
def _decode_target(mates, device, *, sinks=False, xqa=False, max_programs=None, seed=11):
    """Request 0 (TARGET_LEN keys, fixed values) decoded with ``mates`` (lengths of the others,
    random values): its ``(out, lse)``."""
    lens = [TARGET_LEN] + list(mates)
    case = make_paged_kv(lens, num_kv_heads=HKV, head_dim=D, page_size=PAGE, dtype=torch.float16, device=device,
                         seed=seed + len(lens))
    ref = make_paged_kv([TARGET_LEN], num_kv_heads=HKV, head_dim=D, page_size=PAGE, dtype=torch.float16,
                        device=device, seed=seed)
    kv = case.kv_cache.clone()
    # Request 0's pages take the reference request's values (its table row is its own).
    n0 = -(-TARGET_LEN // PAGE)
    kv[case.block_tables[0, :n0].long()] = ref.kv_cache[ref.block_tables[0, :n0].long()]
    g = torch.Generator().manual_seed(seed)
    q0 = torch.randn(1, HKV * GROUP, D, generator=g)
    q = torch.cat([q0, torch.randn(len(mates), HKV * GROUP, D, generator=g)]).to(device, torch.float16)
    ws = torch.zeros(WS, dtype=torch.uint8, device=device)
    sink_vals = torch.linspace(-1, 1, HKV * GROUP, device=device) if sinks else None
    if xqa:  # xqa (no LSE): its sm_count caps the grid (persistent programs)
        out = poison_(torch.empty_like(q)).unsqueeze(1)
        kvattn.xqa.xqa(q.unsqueeze(1), kv[:, 0], kv[:, 1], case.block_tables, case.seq_lens.view(-1, 1), out, ws,
                       torch.zeros(8, dtype=torch.uint32, device=device), HKV, PAGE, sm_count=max_programs,
                       kv_layout="NHD", sinks=None if sink_vals is None else sink_vals.view(HKV, GROUP))
        return out[0, 0].clone(), torch.zeros(1)
    out, lse = kvattn.decode.xqa_batch_decode_with_kv_cache(
        q, kv, ws, case.block_tables, case.seq_lens, max(lens), bmm1_scale=0.125, return_lse=True,
        sinks=sink_vals)
    return out[0].clone(), lse[0].clone()


MATES = [(), (3,), (400, 17, 90), (5,) * 9, (260, 1, 0, 333)]


def _bitwise_same(results):
    first = results[0]
    return all(torch.equal(o, first[0]) and torch.equal(l, first[1]) for o, l in results[1:])


@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "sinks"])
def test_decode_request_is_bitwise_the_same_whatever_its_batch(sinks, kernel_device, triton_backend, short_spans,
                                                              monkeypatch):
    with kvattn.batch_invariant():
        results = [_decode_target(m, kernel_device, sinks=sinks) for m in MATES]
        _sm_count(monkeypatch, 1)  # another GPU
        results.append(_decode_target(MATES[3], kernel_device, sinks=sinks))
    assert _bitwise_same(results)
    assert torch.isfinite(results[0][0].float()).all()


def test_xqa_persistent_grid_keeps_the_bits(kernel_device, triton_backend, short_spans, monkeypatch):
    """xqa's sm_count caps the grid (persistent programs): the schedule changes, the bits do not."""
    with kvattn.batch_invariant():
        results = [_decode_target(MATES[2], kernel_device, xqa=True, max_programs=p) for p in (None, 1, 5)]
        results.append(_decode_target(MATES[4], kernel_device, xqa=True, max_programs=2))
        results.append(_decode_target((), kernel_device, xqa=True))
    assert _bitwise_same(results)


def test_decode_default_mode_follows_the_batch(kernel_device, triton_backend, short_spans, monkeypatch):
    """The control: without the switch the split count follows the batch, and the bits change
    (this is what makes the tests above able to fail)."""
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", "0")
    results = [_decode_target(m, kernel_device) for m in MATES]
    _sm_count(monkeypatch, 1)  # few SMs for many items: fewer splits
    results.append(_decode_target(MATES[3], kernel_device))
    assert not _bitwise_same(results)


def test_decode_invariant_mode_stays_exact(kernel_device, triton_backend, short_spans, monkeypatch):
    """The invariant split still computes attention: against the reference backend."""
    from kvattn.testing import relative_error
    with kvattn.batch_invariant():
        out, lse = _decode_target(MATES[2], kernel_device)
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    ref_out, ref_lse = _decode_target(MATES[2], kernel_device)
    assert relative_error(out.float(), ref_out.float()) < 5e-3
    assert torch.allclose(lse.float(), ref_lse.float(), atol=1e-3)


def test_decode_workspace_too_small_for_the_spans_is_a_clear_error(kernel_device, triton_backend, short_spans):
    # A host bound of 10240 keys: 10 spans of the GPU tables' 1024 (320 of the CPU's 32), more than
    # the 16 KiB workspace holds partials for (2 KiB a split here).
    pages = 640
    case = make_paged_kv([TARGET_LEN], num_kv_heads=HKV, head_dim=D, page_size=PAGE, dtype=torch.float16,
                         device=kernel_device, pages_per_seq=pages)
    q = torch.randn(1, HKV * GROUP, D).to(kernel_device, torch.float16)
    ws = torch.zeros(16384 + 64, dtype=torch.uint8, device=kernel_device)
    with kvattn.batch_invariant(), pytest.raises(ValueError, match="workspace_buffer: batch-invariant mode needs"):
        kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, case.block_tables, case.seq_lens,
                                                     pages * PAGE, bmm1_scale=0.125)


# ---------------------------------------------------------------------------------------------
# single decode: the SM count
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rope", [False, True], ids=["plain", "rope"])
def test_single_decode_is_bitwise_the_same_on_any_gpu(rope, kernel_device, triton_backend, short_spans,
                                                      monkeypatch):
    g = torch.Generator().manual_seed(5)
    n = TARGET_LEN
    q = torch.randn(HKV * GROUP, D, generator=g).to(kernel_device, torch.float16)
    k = torch.randn(n, HKV, D, generator=g).to(kernel_device, torch.float16)
    v = torch.randn(n, HKV, D, generator=g).to(kernel_device, torch.float16)
    kw = dict(pos_encoding_mode="ROPE_LLAMA") if rope else {}
    results = []
    with kvattn.batch_invariant():
        for sms in (0, 1, 7, 500):
            _sm_count(monkeypatch, sms)
            out, lse = kvattn.decode.single_decode_with_kv_cache(q, k, v, return_lse=True, **kw)
            results.append((out, lse))
    assert _bitwise_same(results)


# ---------------------------------------------------------------------------------------------
# MLA (the ops entry on float16 on both tiers; the Gluon kernels through the GPU file)
# ---------------------------------------------------------------------------------------------
MLA_DIM, MLA_V = 576, 512


def _mla_target(mates, device, hq=16, seed=21, q_len=1):
    """Request 0's rows (``q_len`` tokens x ``hq`` heads, token-major) beside ``mates``."""
    lens = [TARGET_LEN] + list(mates)
    case = make_paged_kv(lens, num_kv_heads=1, head_dim=MLA_DIM, page_size=PAGE, dtype=torch.float16,
                         form="shared", device=device, seed=seed + len(lens))
    ref = make_paged_kv([TARGET_LEN], num_kv_heads=1, head_dim=MLA_DIM, page_size=PAGE, dtype=torch.float16,
                        form="shared", device=device, seed=seed)
    cache = case.kv_cache[:, 0, :, 0].clone()
    n0 = -(-TARGET_LEN // PAGE)
    cache[case.block_tables[0, :n0].long()] = ref.kv_cache[:, 0, :, 0][ref.block_tables[0, :n0].long()]
    g = torch.Generator().manual_seed(seed)
    rows = q_len * hq
    q = torch.randn(len(lens), rows, MLA_DIM, generator=g)
    q[0] = torch.randn(rows, MLA_DIM, generator=torch.Generator().manual_seed(seed + 1))
    q = q.to(device, torch.float16)
    pages = cache.unsqueeze(2)
    kv = _inputs.PagedKV(pages, pages, case.block_tables, case.block_tables, MLA_DIM, MLA_V)
    out = poison_(torch.empty(len(lens), rows, MLA_V, dtype=torch.float16, device=device))
    lse = torch.empty(len(lens), rows, dtype=torch.float32, device=device)
    ws = torch.zeros(WS, dtype=torch.uint8, device=device)
    mla_op.mla_decode(q, kv, case.seq_lens, out=out, workspace=ws, max_seq_len=max(lens),
                      logit_scale=_inputs.Scale(0.07), out_scale=_inputs.Scale(1.0), lse=lse, q_len=q_len)
    return out[0].clone(), lse[0].clone()


MLA_MATES = [(), (300, 2), (40,) * 5]


def test_mla_request_is_bitwise_the_same_whatever_its_batch(kernel_device, triton_backend, short_spans,
                                                           monkeypatch):
    with kvattn.batch_invariant():
        results = [_mla_target(m, kernel_device) for m in MLA_MATES]
        _sm_count(monkeypatch, 1)
        results.append(_mla_target(MLA_MATES[2], kernel_device))
    assert _bitwise_same(results)


def test_mla_mtp_request_is_bitwise_the_same_whatever_its_batch(kernel_device, triton_backend, short_spans,
                                                               monkeypatch):
    """Three tokens a request (multi-token prediction): the per-row key limits change no split."""
    with kvattn.batch_invariant():
        results = [_mla_target(m, kernel_device, hq=8, q_len=3) for m in MLA_MATES]
        _sm_count(monkeypatch, 1)
        results.append(_mla_target(MLA_MATES[2], kernel_device, hq=8, q_len=3))
    assert _bitwise_same(results)


def test_mla_default_mode_follows_the_batch(kernel_device, triton_backend, short_spans, monkeypatch):
    """The control: without the switch, request 0's splits follow its batch. On a GPU the MLA
    table's chunks are long enough that these small batches all split request 0 alike, so the
    control takes the CPU tier's short chunks there too."""
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", "0")
    chunks = mla_configs.override(min_chunk=16, waves=4) if ON_GPU else contextlib.nullcontext()
    with chunks:
        results = [_mla_target(m, kernel_device) for m in MLA_MATES]
        _sm_count(monkeypatch, 1)
        results.append(_mla_target(MLA_MATES[2], kernel_device))
    assert not _bitwise_same(results)


# ---------------------------------------------------------------------------------------------
# prefill: batch-invariant in either mode (no KV split; configs by shape only)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["0", "1"])
def test_prefill_request_is_bitwise_the_same_whatever_its_batch(mode, kernel_device, triton_backend, monkeypatch):
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", mode)
    q_len, kv_len = 20, 70
    g = torch.Generator().manual_seed(8)
    q0 = torch.randn(q_len, HKV * GROUP, D, generator=g)
    ref = make_paged_kv([kv_len], num_kv_heads=HKV, head_dim=D, page_size=PAGE, dtype=torch.float16,
                        device=kernel_device, seed=8)
    results = []
    for mates in [(), ((5, 40),), ((33, 33), (1, 90), (12, 12))]:
        lens = [kv_len] + [m[1] for m in mates]
        qs = [q_len] + [m[0] for m in mates]
        case = make_paged_kv(lens, num_kv_heads=HKV, head_dim=D, page_size=PAGE, dtype=torch.float16,
                             device=kernel_device, seed=30 + len(lens))
        kv = case.kv_cache.clone()
        n0 = -(-kv_len // PAGE)
        kv[case.block_tables[0, :n0].long()] = ref.kv_cache[ref.block_tables[0, :n0].long()]
        q = torch.cat([q0] + [torch.randn(n, HKV * GROUP, D, generator=g) for n in qs[1:]]).to(kernel_device,
                                                                                              torch.float16)
        cum_q = torch.tensor([0] + list(torch.tensor(qs).cumsum(0)), dtype=torch.int32, device=kernel_device)
        cum_kv = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=kernel_device)
        ws = torch.zeros(WS, dtype=torch.uint8, device=kernel_device)
        out, lse = kvattn.prefill.trtllm_batch_context_with_kv_cache(
            q, kv, ws, case.block_tables, case.seq_lens, max(qs), max(lens), 0.125, 1.0, len(lens), cum_q, cum_kv,
            kv_layout="NHD", return_lse=True)
        results.append((out[:q_len].clone(), lse[:q_len].clone()))
    assert _bitwise_same(results)
