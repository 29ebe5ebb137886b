"""Copy floor of the MLA seesaw's head-block pair, with and without TMA multicast (Triton 3.7.1, H100).

Not the MLA kernel: a copy-only stand-in with the seesaw's copy pattern (576-column bf16 latent
rows in 64-row tiles, 64-column TMA boxes, two tile buffers of 72 KB, 1 CTA an SM), to measure
what the multicast could buy before anyone rewrites the kernel for it
(lab/notes/mla.md "MLA: TMA multicast across the head-block pair"):

* ``pair``: two programs per (request, split) each copy every row (the current kernel's L2 traffic);
* ``multicast``: the two as one 2-CTA cluster, each tile copied once by CTA 0 and multicast into
  both, a buffer refilled after a cluster barrier (the only cross-CTA release Gluon 3.7.1 has).

Checks: each CTA's checksum of the first 64 columns of its rows against torch (fresh random data,
outputs poisoned with NaN). Times: do_bench medians of CUDA-graph replays, L2 flushed by do_bench.
Usage: python3 benchmarks/mla_multicast_copy.py  (needs Triton >= 3.7 and an sm_90 GPU; ~1 min).
"""

from __future__ import annotations

import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# 3.7's name of the TMA copy; 3.9 renamed it (the kernel compiles under both, the GPU run is 3.7's).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

ROWS = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
ROWS_MC = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2,
                                            cga_layout=[[0, 0]]))
BAR = gl.constexpr(mbarrier.MBarrierLayout())
BAR_MC = gl.constexpr(mbarrier.MBarrierLayout([[1]]))
RED = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
RED_MC = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[0, 0]]))
OUT_MC = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0], cga_layout=[[1]]))


@gluon.jit
def _bufs(layout: gl.constexpr):
    """One 64-row tile of 576 columns as nine [64, 64] allocations (a multi-CTA buffer cannot be
    sliced in Gluon 3.7.1)."""
    return (gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout),
            gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout),
            gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout),
            gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout),
            gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout),
            gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout),
            gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout),
            gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout),
            gl.allocate_shared_memory(gl.bfloat16, [64, 64], layout))


@gluon.jit
def _issue(desc, bufs, bar, row, MC: gl.constexpr):
    mbarrier.expect(bar, 64 * 576 * 2)
    for c in gl.static_range(9):
        _tma_load(desc, [row, c * 64], bar, bufs[c], multicast=MC)


@gluon.jit
def _sync(MC: gl.constexpr):
    """Every reader of a buffer is done with it (both CTAs with MC) before it is refilled."""
    fence_async_shared()
    gl.barrier(cluster=MC)


@gluon.jit
def copy_pair_kernel(
    desc,  # TMA descriptor of the [rows, 576] bf16 cache, box [64, 64]
    out_ptr,  # [items * 2] float32 checksums (one a program / CTA of a pair)
    rows_per_item, n_tiles,  # n_tiles even, >= 2
    MC: gl.constexpr,
):
    pid = gl.program_id(0)  # MC: the cluster (one item); else two programs an item
    if MC:
        item = pid
        row_l: gl.constexpr = ROWS_MC
        bar_l: gl.constexpr = BAR_MC
        red_l: gl.constexpr = RED_MC
        nb: gl.constexpr = 2
    else:
        item = pid // 2
        row_l: gl.constexpr = ROWS
        bar_l: gl.constexpr = BAR
        red_l: gl.constexpr = RED
        nb: gl.constexpr = 1
    base = item * rows_per_item
    b0 = _bufs(row_l)
    b1 = _bufs(row_l)
    f0 = gl.allocate_shared_memory(gl.int64, [nb], bar_l)
    f1 = gl.allocate_shared_memory(gl.int64, [nb], bar_l)
    mbarrier.init(f0, count=1)
    mbarrier.init(f1, count=1)
    # Both CTAs' barriers initialised (cluster scope) before a multicast copy can signal them.
    gl.barrier(cluster=MC)
    _issue(desc, b0, f0, base, MC)
    _issue(desc, b1, f1, base + 64, MC)
    acc = gl.zeros([64, 64], gl.float32, red_l)
    for p in range(n_tiles // 2):
        ph = p & 1
        mbarrier.wait(f0, ph)
        acc += b0[0].load(red_l).to(gl.float32)
        _sync(MC)
        if 2 * p + 2 < n_tiles:
            _issue(desc, b0, f0, base + (2 * p + 2) * 64, MC)
        mbarrier.wait(f1, ph)
        acc += b1[0].load(red_l).to(gl.float32)
        _sync(MC)
        if 2 * p + 3 < n_tiles:
            _issue(desc, b1, f1, base + (2 * p + 3) * 64, MC)
    total = gl.sum(gl.sum(acc, axis=1), axis=0)
    if MC:
        # Each CTA stores its own checksum (a tensor copied in every CTA is stored by CTA 0 only).
        gl.store(out_ptr + pid * 2 + gl.arange(0, 2, OUT_MC), gl.zeros([2], gl.float32, OUT_MC) + total)
    else:
        gl.store(out_ptr + pid, total)


def main() -> int:
    if triton.__version__.startswith("3.6"):
        print(f"Triton {triton.__version__}: Gluon has no TMA multicast (needs 3.7); stage the 3.7.1 wheel")
        return 2
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        print("needs an sm_90 GPU")
        return 2
    torch.manual_seed(0)
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    rows_l, rows_mc = ROWS.value, ROWS_MC.value
    results = []
    for batch, length, splits in ((64, 4096, 1), (128, 8192, 1), (32, 16384, 2), (3, 640, 1)):
        items = batch * splits
        rows_per_item = length // splits
        n_tiles = rows_per_item // 64
        assert n_tiles % 2 == 0 and n_tiles >= 2
        cache = (torch.randn(items * rows_per_item, 576, device=dev) * 0.5).to(torch.bfloat16)
        want = cache[:, :64].float().view(items, rows_per_item, 64).sum(dim=(1, 2))
        unique = cache.numel() * 2
        row = {}
        for name, mc in (("pair", False), ("multicast", True)):
            desc = TensorDescriptor.from_tensor(cache, [64, 64], rows_mc if mc else rows_l)
            out = torch.full((items * 2,), float("nan"), device=dev)
            grid = (items,) if mc else (items * 2,)
            opts = dict(num_warps=4, num_ctas=2 if mc else 1)

            def launch():
                copy_pair_kernel[grid](desc, out, rows_per_item, n_tiles, MC=mc, **opts)

            launch()
            torch.cuda.synchronize()
            got = out.view(items, 2)
            err = ((got - want[:, None]).abs() / want.abs().clamp_min(1.0)[:, None]).max().item()
            ok = bool(torch.isfinite(got).all()) and err < 1e-3
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                launch()
            ms = triton.testing.do_bench(g.replay, warmup=50, rep=300, return_mode="median")
            row[name] = (ms * 1e3, ok, err)
        results.append((batch, length, splits, unique, row))
    print(f"{'shape':>14} {'splits':>6} | {'pair us':>8} {'GB/s uniq':>9} {'ok':>3} | {'mcast us':>8} {'GB/s uniq':>9} {'ok':>3} | speedup")
    bad = 0
    for batch, length, splits, unique, row in results:
        (tp, okp, _), (tm, okm, _) = row["pair"], row["multicast"]
        bad += (not okp) + (not okm)
        print(f"{batch:>5}x{length:<8} {splits:>6} | {tp:8.1f} {unique / tp / 1e3:9.0f} {str(okp)[0]:>3} | "
              f"{tm:8.1f} {unique / tm / 1e3:9.0f} {str(okm)[0]:>3} | {tp / tm:.2f}x")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
