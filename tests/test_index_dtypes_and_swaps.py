"""Index tensors follow one rule (docs/semantics.md, "Index tensors"): page tables and lengths are
int32 (lengths also uint32), and an int64 one is refused the same way in every function, with the
reason; row offsets take int32 or int64. An argument that got what another one expects, while
that one got what it expects, is reported with a hint that the two are swapped."""

from __future__ import annotations

import pytest
import torch

import kvattn

BF16 = torch.bfloat16


def ws():
    return torch.zeros(1 << 15, dtype=torch.uint8)


def decode_args():
    torch.manual_seed(0)
    return dict(query=torch.randn(2, 8, 64, dtype=BF16), kv_cache=torch.randn(4, 2, 16, 2, 64, dtype=BF16),
                workspace_buffer=ws(), block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                seq_lens=torch.tensor([20, 32], dtype=torch.int32), max_seq_len=32)


def prefill_args():
    torch.manual_seed(0)
    return dict(query=torch.randn(9, 8, 64, dtype=BF16), kv_cache=torch.randn(4, 2, 2, 16, 64, dtype=BF16),
                workspace_buffer=ws(), block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
                seq_lens=torch.tensor([20, 32], dtype=torch.int32), max_q_len=5, max_kv_len=32, bmm1_scale=0.125,
                bmm2_scale=1.0, batch_size=2, cum_seq_lens_q=torch.tensor([0, 4, 9], dtype=torch.int32),
                cum_seq_lens_kv=torch.tensor([0, 20, 52], dtype=torch.int32))


def mla_args():
    torch.manual_seed(0)
    return dict(query=torch.randn(2, 1, 16, 576, dtype=BF16), kv_cache=torch.randn(4, 32, 576, dtype=BF16),
                workspace_buffer=ws(), qk_nope_head_dim=128, kv_lora_rank=512, qk_rope_head_dim=64,
                block_tables=torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
                seq_lens=torch.tensor([40, 64], dtype=torch.int32), max_seq_len=64)


def xqa_args():
    torch.manual_seed(0)
    pool = 4 * 16 * 2
    return dict(q=torch.randn(2, 1, 8, 64, dtype=BF16), k_cache=torch.randn(pool, 64, dtype=BF16),
                v_cache=torch.randn(pool, 64, dtype=BF16), page_table=torch.tensor([[3, 1], [0, 2]], dtype=torch.int32),
                seq_lens=torch.tensor([[20], [32]], dtype=torch.uint32), output=torch.empty(2, 1, 8, 64, dtype=BF16),
                workspace_buffer=ws(), semaphores=torch.zeros(1, dtype=torch.uint32), num_kv_heads=2, page_size=16)


FUNCS = {"decode": (kvattn.xqa_batch_decode_with_kv_cache, decode_args),
         "prefill": (kvattn.trtllm_batch_context_with_kv_cache, prefill_args),
         "mla": (kvattn.xqa_batch_decode_with_kv_cache_mla, mla_args), "xqa": (kvattn.xqa, xqa_args)}
INT32_ONLY = [("decode", "block_tables"), ("decode", "seq_lens"), ("prefill", "block_tables"),
              ("prefill", "seq_lens"), ("mla", "block_tables"), ("mla", "seq_lens"), ("xqa", "page_table"),
              ("xqa", "seq_lens")]


@pytest.mark.parametrize("func, name", INT32_ONLY, ids=[f"{f}-{n}" for f, n in INT32_ONLY])
def test_int64_page_tables_and_lengths_are_refused_the_same_way(func, name):
    fn, args = FUNCS[func]
    kw = args()
    kw[name] = kw[name].to(torch.int64)
    with pytest.raises(TypeError, match=rf"^{name}: expected dtype in \(.*int32.*\), got int64 \(page tables and "
                                        r"lengths are read as 32-bit values: convert them once .*\.to\(torch\.int32\)"):
        fn(**kw)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_row_offsets_take_int32_and_int64_alike(dtype):
    kw = prefill_args()
    want = kvattn.trtllm_batch_context_with_kv_cache(**kw)
    kw.update(cum_seq_lens_q=kw["cum_seq_lens_q"].to(dtype), cum_seq_lens_kv=kw["cum_seq_lens_kv"].to(dtype))
    assert torch.equal(kvattn.trtllm_batch_context_with_kv_cache(**kw), want)


SWAPS = [("decode", "block_tables", "seq_lens"), ("decode", "query", "kv_cache"),
         ("prefill", "block_tables", "seq_lens"), ("prefill", "query", "kv_cache"),
         ("mla", "block_tables", "seq_lens"), ("xqa", "page_table", "seq_lens"),
         ("decode", "workspace_buffer", "seq_lens")]


@pytest.mark.parametrize("func, a, b", SWAPS, ids=[f"{f}-{a}-{b}" for f, a, b in SWAPS])
def test_swapped_arguments_get_a_hint(func, a, b):
    fn, args = FUNCS[func]
    kw = args()
    kw[a], kw[b] = kw[b], kw[a]
    with pytest.raises((TypeError, ValueError)) as info:
        fn(**kw)
    message = str(info.value)
    first = message.split(":", 1)[0]
    other = b if first == a else a
    assert first in (a, b), message
    assert message.endswith(f"({first} got what looks like {other}, and {other} what looks like {first}: "
                            "are they swapped?)"), message


def test_no_hint_when_only_one_argument_is_wrong():
    kw = decode_args()
    kw["block_tables"] = kw["seq_lens"].clone()  # wrong, but seq_lens is not a table
    with pytest.raises(ValueError) as info:
        kvattn.xqa_batch_decode_with_kv_cache(**kw)
    assert "swapped" not in str(info.value)
