"""How does the order of a single-decode launch's reads change what a bare read of its bytes costs?

Single decode reads K and V ``[L, H, D]`` (NHD): a program of the split kernel reads one head's
256-byte rows, 8 KB apart. This times bare reads (sum of the values, no attention) of the same
bytes in two orders, under the benchmark's measurement (CUDA-graph replay, L2 flushed, copy
bandwidth of the same run): per head (programs over (head, split), tiles of ``n`` rows of one
head, ``w`` warps) and token-major (programs over token chunks, all heads of ``rows`` tokens a
step: contiguous 8 KB rows), with and without the ``evict_first`` L2 hint; the per-head reads
also with consecutive programs on consecutive heads (``head-fast``) instead of one head's splits.
lab/notes/method.md ("Method: read floors", "Single decode: balancing the programs of 32768") has the H100
figures and what the decode tables took from them.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/read_patterns.py
"""

from __future__ import annotations

import sys

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.ceilings import copy_gbps  # noqa: E402
from kvattn.benchmarking.timing import Timer  # noqa: E402


@triton.jit
def per_head_kernel(k_ptr,  # [L, H, D] bfloat16
                    v_ptr,  # [L, H, D] bfloat16
                    out_ptr,  # [programs] float32
                    L, H: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                    EVICT: tl.constexpr, HEAD_FAST: tl.constexpr = False):
    pid = tl.program_id(0)
    if HEAD_FAST:  # consecutive programs: the same split of consecutive heads
        h = pid % H
        s = pid // H
    else:  # consecutive programs: the splits of one head (the split kernel's order)
        h = pid // SPLITS
        s = pid % SPLITS
    chunk = L // SPLITS
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for n0 in range(s * chunk, (s + 1) * chunk, BLOCK_N):
        off = (n0 + offs_n)[:, None].to(tl.int64) * (H * D) + h * D + offs_d[None, :]
        acc += tl.load(k_ptr + off, eviction_policy=EVICT).to(tl.float32)
        acc += tl.load(v_ptr + off, eviction_policy=EVICT).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


@triton.jit
def token_major_kernel(k_ptr,  # [L, H, D] bfloat16
                       v_ptr,  # [L, H, D] bfloat16
                       out_ptr,  # [programs] float32
                       L, H: tl.constexpr, D: tl.constexpr, PROGRAMS: tl.constexpr, ROWS: tl.constexpr,
                       EVICT: tl.constexpr):
    pid = tl.program_id(0)
    chunk = L // PROGRAMS
    offs_r = tl.arange(0, ROWS)
    offs_c = tl.arange(0, H * D)
    acc = tl.zeros([ROWS, H * D], dtype=tl.float32)
    for n0 in range(pid * chunk, (pid + 1) * chunk, ROWS):
        off = (n0 + offs_r)[:, None].to(tl.int64) * (H * D) + offs_c[None, :]
        acc += tl.load(k_ptr + off, eviction_policy=EVICT).to(tl.float32)
        acc += tl.load(v_ptr + off, eviction_policy=EVICT).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def main() -> int:
    dev = torch.device("cuda")
    timer = Timer(dev)
    bw = copy_gbps(timer)
    print(f"copy {bw:.0f} GB/s", flush=True)
    heads, d = 32, 128
    out = torch.empty(8192, device=dev)
    for length in (4096, 32768):
        sets = [(torch.randn(length, heads, d, device=dev, dtype=torch.bfloat16),
                 torch.randn(length, heads, d, device=dev, dtype=torch.bfloat16)) for _ in range(3)]
        nbytes = 2 * length * heads * d * 2

        def report(name, fns):
            t = timer.graph(fns)
            print(f"L={length} {name:40s} {t:7.1f} us  {nbytes / t / 1e3 / bw:.3f}", flush=True)

        for ev in ("evict_first", ""):
            for splits, bn, w in [(8, 128, 8), (8, 64, 4), (16, 64, 4), (8, 32, 4), (4, 128, 8), (16, 32, 4)]:
                sp = splits * (length // 4096)
                for hf in (False, True):
                    report(f"per-head{' head-fast' if hf else ''} s{sp} n{bn} w{w} {ev}",
                           [lambda s=s, sp=sp, bn=bn, w=w, ev=ev, hf=hf: per_head_kernel[(heads * sp,)](
                               s[0], s[1], out, length, heads, d, sp, bn, ev, hf, num_warps=w) for s in sets])
            for progs, rows, w in [(256, 2, 8), (256, 1, 4), (512, 1, 4), (128, 4, 8)]:
                report(f"token-major p{progs} rows{rows} w{w} {ev}",
                       [lambda s=s, progs=progs, rows=rows, w=w, ev=ev: token_major_kernel[(progs,)](
                           s[0], s[1], out, length, heads, d, progs, rows, ev, num_warps=w) for s in sets])
    return 0


if __name__ == "__main__":
    sys.exit(main())
