"""kvattn.warmup: after it, calls at the warmed sizes compile nothing (over the faked GPU of
test_fast_launch), and on a GPU a CUDA-graph capture of such a call compiles and loads nothing."""

from __future__ import annotations

import pytest
import torch
from triton.compiler.compiler import CompiledKernel
from triton.runtime.jit import JITFunction

import kvattn
from kvattn import _warmup
from kvattn.testing import make_paged_kv

from runtime.test_fast_launch import FAST_PATH_TRITON, GPU_ONLY, FakeGPU

CPU = torch.device("cpu")
CONFIG = dict(dtype=torch.float16, num_qo_heads=16, num_kv_heads=2, head_dim=128, page_size=16, batch_sizes=[1, 3],
              seq_lens=[40, 700], num_pages=205, workspace_bytes=1 << 22)


def server_calls(device, ws_bytes=1 << 22):
    """Calls a server of CONFIG makes, on its own inputs (a 205-page cache, fresh tensors)."""
    lens = [700, 40, 650]
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=128, page_size=16, dtype=torch.float16, device=device,
                         pages_per_seq=44, extra_pages=205 - sum(-(-n // 16) for n in lens), nan_fill=False)
    assert case.kv_cache.shape[0] == 205
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)
    q = torch.randn(3, 16, 128, device=device).half()
    out = torch.empty_like(q)
    q1, k1, v1 = (torch.randn(*s, device=device).half() for s in ((16, 128), (700, 2, 128), (700, 2, 128)))
    out1 = torch.empty_like(q1)

    def decode():
        kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, case.block_tables, case.seq_lens, 700,
                                                     bmm1_scale=0.088, out=out)

    def single():
        kvattn.decode.single_decode_with_kv_cache(q1, k1, v1, out=out1)

    return {"decode": decode, "single_decode": single}


@FAST_PATH_TRITON
@pytest.mark.parametrize("warm", [True, False], ids=["after-warmup", "cold"])
def test_calls_at_warmed_sizes_compile_nothing(warm, monkeypatch, capsys):
    fake = FakeGPU(monkeypatch)
    monkeypatch.setenv("KVATTN_CALL_CACHE", "1")
    calls = server_calls(CPU)
    if warm:
        report = kvattn.warmup(["decode", "xqa", "single_decode", "mla"], device=CPU, progress=False, **CONFIG)
        assert report["decode"]["calls"] == 4 and report["single_decode"]["calls"] == 2
        assert report["total_seconds"] > 0
        assert capsys.readouterr().err == ""  # progress=False: no bar, no summary line
    compiled = len(fake.compiled)
    for call in calls.values():
        call()
    assert (len(fake.compiled) == compiled) is warm


@FAST_PATH_TRITON
def test_warmup_reports_progress_and_time(monkeypatch, capsys):
    FakeGPU(monkeypatch)
    kvattn.warmup(["xqa"], device=CPU, **dict(CONFIG, batch_sizes=[2], seq_lens=[64]))
    err = capsys.readouterr().err
    assert "kvattn warmup" in err and "xqa B2 L64" in err and "xqa " in err.splitlines()[-1]


@pytest.mark.parametrize("kw, message", [
    (dict(functions=["decode", "bogus"]), "^functions:"),
    (dict(batch_sizes=[0]), "^batch_sizes:"),
    (dict(seq_lens=[]), "^seq_lens:"),
    (dict(q_lens=[1.5]), "^q_lens:"),
])
def test_warmup_rejects_bad_arguments(kw, message):
    with pytest.raises(ValueError, match=message):
        kvattn.warmup(device=CPU, progress=False, **kw)


@pytest.mark.parametrize("pages, like", [(1, 1), (16, 16), (4096, 16), (205, 17), (17, 17)])
def test_page_counts_keep_their_kind(pages, like):
    assert _warmup._pages_like(pages) == like


@FAST_PATH_TRITON
@GPU_ONLY
def test_capture_after_warmup_loads_nothing(monkeypatch):
    """The GPU test of the promise: warm up, then capture one call of each function at a warmed
    size in a CUDA graph while spying on Triton's compile and module load: neither runs."""
    device = torch.device("cuda")
    config = dict(dtype=torch.bfloat16, num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
                  batch_sizes=[4], seq_lens=[4096], q_lens=[128], num_pages=1000, pages_per_seq=256,
                  workspace_bytes=64 << 20)
    kvattn.warmup(device=device, progress=False, pos_encoding_modes=("NONE", "ROPE_LLAMA"), **config)
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device=device)
    kv = torch.randn(1000, 2, 16, 8, 128, device=device, dtype=torch.bfloat16)
    tables = torch.randint(0, 1000, (4, 256), dtype=torch.int32, device=device)
    lens = torch.full((4,), 4000, dtype=torch.int32, device=device)
    q = torch.randn(4, 32, 128, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    q1, k1, v1 = (torch.randn(*s, device=device, dtype=torch.bfloat16) for s in ((32, 128), (4096, 8, 128),
                                                                                 (4096, 8, 128)))
    out1 = torch.empty_like(q1)
    mq = torch.randn(4, 1, 32, 576, device=device, dtype=torch.bfloat16)
    mcache = torch.randn(1000, 16, 576, device=device, dtype=torch.bfloat16)
    mout = torch.empty(4, 32, 512, device=device, dtype=torch.bfloat16)
    pq = torch.randn(4 * 128, 32, 128, device=device, dtype=torch.bfloat16)
    pout = torch.empty_like(pq)
    cum_q = torch.arange(0, 4 * 128 + 1, 128, dtype=torch.int32, device=device)
    cum_kv = torch.arange(0, 4 * 4096 + 1, 4096, dtype=torch.int32, device=device)
    calls = {
        "decode": lambda: kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 4096,
                                                                       bmm1_scale=0.088, out=out),
        "single_decode": lambda: kvattn.decode.single_decode_with_kv_cache(q1, k1, v1, out=out1),
        "single_decode rope": lambda: kvattn.decode.single_decode_with_kv_cache(
            q1, k1, v1, out=out1, pos_encoding_mode="ROPE_LLAMA"),
        "mla": lambda: kvattn.mla.xqa_batch_decode_with_kv_cache_mla(mq, mcache, ws, 128, 512, 64, tables, lens,
                                                                     4096, out=mout, bmm1_scale=0.07),
        "prefill": lambda: kvattn.prefill.trtllm_batch_context_with_kv_cache(
            pq, kv, ws, tables, lens, 128, 4096, 0.088, 1.0, 4, cum_q, cum_kv, out=pout, kv_layout="NHD"),
    }
    torch.cuda.synchronize()
    compiles, loads = [], []
    real_compile, real_load = JITFunction._do_compile, CompiledKernel._init_handles
    monkeypatch.setattr(JITFunction, "_do_compile", lambda self, *a: compiles.append(self) or real_compile(self, *a))
    monkeypatch.setattr(CompiledKernel, "_init_handles",
                        lambda self: (loads.append(self) if self.module is None else None, real_load(self))[1])
    for name, call in calls.items():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        torch.cuda.synchronize()
        assert compiles == [] and loads == [], f"{name}: the capture compiled or loaded a kernel"
