"""kvattn must not change how other code's Triton kernels compile or run.

kvattn rewrites the PTX of its own marked kernels (``kvattn.runtime.ptx_hints``) through Triton's
process-wide stages hook, set only while it launches them. After kvattn has been imported and has
launched its kernels (on a GPU: the single-decode RoPE launch that a CUDA-graph capture reads by
TMA with the L2 hint, the marked kernel), a kernel that is not kvattn's and a ``torch.compile``'d
function must compile and run as they would without kvattn: no hook left set, no cache policy in
the foreign kernel's PTX, results equal to eager PyTorch.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kvattn

ON_GPU = torch.cuda.is_available()


@triton.jit
def _foreign_axpy(x_ptr,  # [n] float32
                  y_ptr,  # [n] float32
                  out_ptr,  # [n] float32
                  n, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


def _run_kvattn_kernels(device: torch.device) -> None:
    """Launch kvattn's kernels, the marked one included where the GPU has it."""
    if ON_GPU:
        # Single decode, RoPE, 32 heads of 128, 4096 keys: eager, then inside a CUDA-graph capture
        # (where its K/V tiles are read by TMA with the hinted copies on Hopper).
        q = torch.randn(32, 128, device=device, dtype=torch.bfloat16)
        k = torch.randn(4096, 32, 128, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        call = lambda: kvattn.decode.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA")  # noqa: E731
        eager = call()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = call()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, eager, atol=2e-2, rtol=2e-2)
    else:
        q = torch.randn(2, 4, 64, dtype=torch.float16)
        kv = torch.randn(4, 2, 16, 2, 64, dtype=torch.float16)
        tables = torch.randperm(4, dtype=torch.int32).view(2, 2)
        lens = torch.tensor([17, 32], dtype=torch.int32)
        ws = torch.zeros(8 << 20, dtype=torch.uint8)
        kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, tables, lens, max_seq_len=32, bmm1_scale=0.125)


@pytest.mark.usefixtures("triton_backend")
def test_foreign_triton_kernel_is_untouched(kernel_device):
    _run_kvattn_kernels(kernel_device)
    assert triton.knobs.runtime.add_stages_inspection_hook is None
    n = 1000
    x = torch.randn(n, device=kernel_device)
    y = torch.randn(n, device=kernel_device)
    out = torch.full_like(x, float("nan"))
    compiled = _foreign_axpy[(triton.cdiv(n, 256),)](x, y, out, n, 0.5, BLOCK=256)
    torch.testing.assert_close(out, 0.5 * x + y)
    if ON_GPU:
        ptx = compiled.asm["ptx"]
        assert "kvattn" not in ptx and "cache_hint" not in ptx and "createpolicy" not in ptx


@pytest.mark.usefixtures("triton_backend")
def test_torch_compile_after_kvattn(kernel_device):
    _run_kvattn_kernels(kernel_device)

    def f(a, b):
        return torch.softmax(a @ b.T, dim=-1) * 2 + a.sum()

    a = torch.randn(64, 32, device=kernel_device)
    b = torch.randn(48, 32, device=kernel_device)
    torch._dynamo.reset()
    got = torch.compile(f, backend="inductor" if ON_GPU else "aot_eager")(a, b)
    torch.testing.assert_close(got, f(a, b), atol=1e-4, rtol=1e-4)
    assert triton.knobs.runtime.add_stages_inspection_hook is None
