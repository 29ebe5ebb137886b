"""The public functions hand each value to the launcher keyword of its name.

The public modules call the ops' entries positionally (binding keywords costs host time on every
call the call cache does not replay), so this is the check of their order: each public function is
called with a distinct value for every argument the entry takes, the entry's launcher is swapped
for a recorder (nothing launches), and each value must arrive under its launcher keyword
(``tests/runtime/test_opdecl.py`` checks the entries themselves).
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import kvattn
from kvattn.formats import FP8_DTYPE
from kvattn.ops.decode import op as decode_op
from kvattn.ops.decode.plan import launch_decode
from kvattn.ops.mla import op as mla_op
from kvattn.ops.mla.plan import launch_mla
from kvattn.ops.prefill import op as prefill_op
from kvattn.ops.prefill.plan import launch_context
from kvattn.runtime import callcache as _callcache
from kvattn.testing import make_paged_kv

F16 = torch.float16
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # (conftest's kernel_device)


@pytest.fixture
def record(monkeypatch, triton_backend):
    """``record(declared, launcher)``: the launcher arguments, by name, of each call of the entry
    (tensors made on the tier's kernel device meanwhile)."""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    _callcache.clear()

    def start(declared, launcher) -> list:
        calls = []
        signature = inspect.signature(launcher)
        monkeypatch.setitem(declared.entry.__globals__, "_opdecl_launch",
                            lambda *a, **k: calls.append(dict(signature.bind(*a, **k).arguments)))
        return calls

    with torch.device(DEVICE):  # (every tensor the tests make)
        yield start


def _same(a, b) -> bool:
    """The same memory and geometry (a view the public function made of an argument)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def test_batch_decode(record):
    calls = record(decode_op.BATCH_DECODE, launch_decode)
    case = make_paged_kv([5, 20], num_kv_heads=2, head_dim=64, page_size=16, dtype=F16, device=DEVICE)
    q = torch.randn(4, 4, 64, dtype=F16)  # 2 requests x 2 drafts
    ws, out, lse = torch.zeros(1 << 20, dtype=torch.uint8), torch.empty_like(q), torch.empty(4, 4)
    sinks, mask = torch.randn(4), torch.ones(2, 2, 2, dtype=torch.uint16)
    kvattn.decode.xqa_batch_decode_with_kv_cache(
        q, case.kv_cache, ws, case.block_tables, case.seq_lens, 21, bmm1_scale=0.125, bmm2_scale=0.75, window_left=7,
        out=out, sinks=sinks, enable_pdl=True, q_len_per_req=2, o_scale=2.0, mask=mask, return_lse=True, lse=lse)
    (got,) = calls
    assert got["query"] is q and got["out"] is out and got["workspace"] is ws and got["lse"] is lse
    assert got["sinks"] is sinks and got["mask"] is mask and got["k_table"] is case.block_tables
    assert _same(got["k"], case.kv_cache[:, 0]) and _same(got["v"], case.kv_cache[:, 1])
    assert torch.equal(got["seq_lens"], case.seq_lens)
    assert (got["logit_factor"], got["out_factor"], got["logit_tensor"], got["out_tensor"]) == (0.125, 1.5, None, None)
    assert (got["q_len"], got["max_seq_len"], got["window_left"], got["enable_pdl"]) == (2, 21, 7, True)
    assert (got["max_programs"], got["kv_start"], got["paged"]) == (None, None, True)


def test_xqa(record):
    calls = record(decode_op.BATCH_DECODE, launch_decode)
    case = make_paged_kv([5, 20], num_kv_heads=2, head_dim=64, page_size=32, dtype=F16, device=DEVICE)
    q = torch.randn(2, 1, 4, 64, dtype=F16)
    k, v = (case.kv_cache[:, i].reshape(-1, 64) for i in (0, 1))
    ws, out, lse = torch.zeros(1 << 20, dtype=torch.uint8), torch.empty_like(q), torch.empty(2, 1, 4)
    sinks = torch.randn(2, 2)
    kvattn.xqa.xqa(q, k, v, case.block_tables, case.seq_lens.view(-1, 1).to(torch.uint32), out, ws,
                   torch.zeros(8, dtype=torch.uint32), 2, 32, sinks=sinks, q_scale=2.0, sliding_win_size=9, sm_count=3,
                   return_lse=True, lse=lse, enable_pdl=True)
    (got,) = calls
    assert _same(got["query"], q.view(2, 4, 64)) and _same(got["out"], out.view(2, 4, 64))
    assert _same(got["lse"], lse.view(2, 4)) and got["workspace"] is ws and got["k_table"] is case.block_tables
    assert torch.equal(got["sinks"], sinks.reshape(4)) and got["mask"] is None
    assert got["logit_factor"] == pytest.approx(2.0 / math.sqrt(64)) and got["out_factor"] == 1.0
    assert (got["q_len"], got["window_left"], got["max_programs"], got["enable_pdl"]) == (1, 8, 3, True)
    assert got["max_seq_len"] == case.block_tables.shape[1] * 32 and got["kv_start"] is None


@pytest.mark.parametrize("mode", ["ROPE_LLAMA", "ALIBI"])
def test_single_decode(record, mode):
    calls = record(decode_op.SINGLE_DECODE_INTO, launch_decode)
    q = torch.randn(4, 64, dtype=F16)
    k, v = (torch.randn(20, 2, 64, dtype=F16) for _ in range(2))
    out, lse = torch.empty_like(q), torch.empty(4)
    kvattn.decode.single_decode_with_kv_cache(
        q, k, v, pos_encoding_mode=mode, use_tensor_cores=True, q_scale=2.0, k_scale=3.0, v_scale=0.5, window_left=6,
        logits_soft_cap=30.0, sm_scale=0.25, rope_scale=4.0, rope_theta=5e5, return_lse=True, out=out, lse=lse)
    (got,) = calls
    assert got["query"] is q and got["k"] is k and got["v"] is v and got["out"] is out and got["lse"] is lse
    assert (got["logit_factor"], got["out_factor"], got["window_left"], got["soft_cap"]) == (1.5, 0.5, 6, 30.0)
    assert (got["rope"], got["alibi"]) == (mode == "ROPE_LLAMA", mode == "ALIBI")
    assert (got["rope_scale"], got["rope_theta"], got["use_tensor_cores"], got["paged"]) == (4.0, 5e5, True, False)


def test_mla(record):
    calls = record(mla_op.MLA_DECODE, launch_mla)
    case = make_paged_kv([5, 20], num_kv_heads=1, head_dim=576, page_size=16, kv_format="fp8", form="shared",
                         device=DEVICE)
    cache = case.kv_cache[:, 0, :, 0]
    q = torch.randn(2, 2, 16, 576).to(torch.bfloat16)
    ws, out, lse = torch.zeros(1 << 22, dtype=torch.uint8), torch.empty(2, 2, 16, 512, dtype=torch.bfloat16), \
        torch.empty(2, 2, 16)
    kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, case.block_tables, case.seq_lens, 21,
                                                  out=out, bmm1_scale=0.07, bmm2_scale=0.5, return_lse=True, lse=lse)
    (got,) = calls
    assert _same(got["query"], q.view(2, 32, 576)) and _same(got["out"], out.view(2, 32, 512))
    assert _same(got["lse"], lse.view(2, 32)) and got["workspace"] is ws and got["table"] is case.block_tables
    assert _same(got["kv"], cache.unsqueeze(2)) and torch.equal(got["seq_lens"], case.seq_lens)
    assert (got["logit_factor"], got["out_factor"], got["max_seq_len"], got["q_len"]) == (0.07, 0.5, 21, 2)


def test_prefill(record):
    calls = record(prefill_op.CONTEXT, launch_context)
    case = make_paged_kv([20, 40], num_kv_heads=2, head_dim=64, page_size=16, dtype=F16, layout="HND",
                         device=DEVICE)
    cum_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    cum_kv = torch.tensor([0, 20, 60], dtype=torch.int32)
    q = torch.randn(12, 4, 64, dtype=F16)
    ws, out, lse, sinks = torch.zeros(1 << 22, dtype=torch.uint8), torch.empty_like(q), torch.empty(12, 4), \
        torch.randn(4)
    kvattn.prefill.trtllm_batch_context_with_kv_cache(
        q, case.kv_cache, ws, case.block_tables, case.seq_lens, 7, 40, 0.125, 0.75, 2, cum_q, cum_kv, window_left=9,
        out=out, sinks=sinks, skip_softmax_threshold_scale_factor=0.25, return_lse=True, lse=lse, kv_layout="HND")
    (got,) = calls
    assert got["query"] is q and got["out"] is out and got["lse"] is lse and got["workspace"] is ws
    assert got["sinks"] is sinks and got["cum_seq_lens_q"] is cum_q and got["k_table"] is case.block_tables
    assert got["out_sf"] is None and got["sf_start"] == 0 and got["o_sf_scale"] == 1.0
    assert (got["logit_factor"], got["out_factor"], got["skip_factor"]) == (0.125, 0.75, 0.25)
    assert (got["max_q_len"], got["max_kv_len"], got["window_left"], got["causal"]) == (7, 40, 9, True)


def test_prefill_nvfp4_output(record):
    calls = record(prefill_op.CONTEXT, launch_context)
    case = make_paged_kv([20, 40], num_kv_heads=2, head_dim=64, page_size=16, kv_format="fp8", layout="HND",
                         device=DEVICE)
    cum = torch.tensor([0, 5, 12], dtype=torch.int32), torch.tensor([0, 20, 60], dtype=torch.int32)
    q = torch.randn(12, 4, 64, dtype=F16)
    out = kvattn.FP4Tensor.empty(12, 4, 64, DEVICE)
    kvattn.prefill.trtllm_batch_context_with_kv_cache(
        q, case.kv_cache, torch.zeros(1 << 22, dtype=torch.uint8), case.block_tables, case.seq_lens, 7, 40, 0.125,
        1.0, 2, *cum, out=out, out_dtype="nvfp4", o_sf_scale=3.0, kv_layout="HND", causal=False)
    (got,) = calls
    assert got["out"] is out.data and got["out_sf"] is out.scale and got["sf_start"] == out.scale_start_index
    assert (got["o_sf_scale"], got["causal"], got["lse"]) == (3.0, False, None)
    assert got["k"].dtype == FP8_DTYPE
