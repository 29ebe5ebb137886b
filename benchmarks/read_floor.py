"""What does reading a decode shape's bytes once cost, under the benchmark's own timing?

A decode kernel cannot beat a kernel that only streams the same number of bytes. This times bare
streaming reads of exactly the bytes each memory-bound target shape moves (``metrics.work``), in
the benchmark's measurement (``do_bench`` median of a CUDA-graph replay, L2 flushed before each
call, copy bandwidth measured in the same run), and keeps the best of several read kernels:
grid-stride register loads with 4-16 programs an SM, 4-16 KB a load, with and without an
``evict_first`` L2 hint, and ``torch.sum``. For the paged bfloat16 shapes, reads of the real
pools through a random page table in the decode kernel's pattern (one program a request, KV head
and split) show what that pattern costs on top. The same reads back to back (no flush) show what the
flush's dirty lines cost. A target fraction above the best read's is out of reach for any kernel
in this measurement. The best read without the hint is the floor for kernels whose loads cannot
carry it (Triton 3.6's pipelined cp.async loads).

Usage (on the device): ``PYTHONPATH=src python benchmarks/read_floor.py --out $OUT/read_floor.json``
"""

from __future__ import annotations

import argparse
import json
import sys

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks import metrics  # noqa: E402
from benchmarks.ceilings import copy_gbps  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402
from kvattn.benchmarking.timing import Timer, back_to_back_us  # noqa: E402

# The memory-bound targets whose fractions are in question, and one that is met, for scale.
SHAPES = [
    Shape("decode", 1, 32768),
    Shape("decode", 16, 4096),
    Shape("decode", 64, 8192, kv_dtype="fp8"),
    Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32),
    Shape("single_decode", 1, 32768, num_qo_heads=32, num_kv_heads=32),
    Shape("decode", 64, 8192),
]


@triton.jit
def stream_sum_kernel(x_ptr,  # [n] int32
                      out_ptr,  # [programs] int32
                      n, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0, eviction_policy=EVICT)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


@triton.jit
def paged_sum_kernel(k_ptr,  # [num_pages, PAGE_SIZE, Hkv, D] bfloat16 (NHD pages)
                     v_ptr,  # same shape as k_ptr
                     table_ptr,  # [B, pages_per_seq] int32 page ids
                     out_ptr,  # [programs] float32
                     seq_len, num_splits, stride_t, stride_p, stride_s, stride_h,
                     HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                     BLOCK_N: tl.constexpr, HEADS: tl.constexpr, EVICT: tl.constexpr):
    """Sum of the K and V rows of one (request, group of HEADS adjacent KV heads, split),
    gathered through the page table as the decode kernel gathers them (HEADS = 1): the decode
    read pattern without the attention."""
    pid = tl.program_id(0)
    split = pid % num_splits
    bh = pid // num_splits
    b = bh // (NUM_KV_HEADS // HEADS)
    h = bh % (NUM_KV_HEADS // HEADS) * HEADS
    chunk = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, seq_len)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_h = tl.arange(0, HEADS)
    acc = tl.zeros([BLOCK_N, HEADS, HEAD_DIM], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        ok = offs_n < end
        page = tl.load(table_ptr + b.to(tl.int64) * stride_t + offs_n // PAGE_SIZE, mask=ok, other=0)
        row = page.to(tl.int64) * stride_p + (offs_n % PAGE_SIZE) * stride_s + h * stride_h
        off = row[:, None, None] + offs_h[None, :, None] * stride_h + offs_d[None, None, :]
        k = tl.load(k_ptr + off, mask=ok[:, None, None], other=0.0, eviction_policy=EVICT)
        v = tl.load(v_ptr + off, mask=ok[:, None, None], other=0.0, eviction_policy=EVICT)
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(tl.sum(acc, 2), 1), 0))


# (KV heads a program, splits, keys a tile, warps, pipeline stages, L2 hint); one head a program
# is the decode kernel's pattern, more show what reading longer runs of each page would give.
PAGED_READERS = [(1, 1, 128, 8, 3, ""), (1, 1, 64, 4, 3, ""), (1, 1, 128, 8, 1, ""), (1, 2, 128, 8, 1, ""),
                 (1, 2, 128, 8, 1, "evict_first"), (1, 4, 64, 4, 1, ""), (1, 4, 64, 4, 1, "evict_first"),
                 (1, 8, 64, 4, 1, ""), (1, 8, 32, 4, 1, ""), (1, 16, 32, 4, 1, ""),
                 (2, 2, 64, 8, 3, ""), (2, 4, 64, 4, 1, ""), (2, 16, 32, 4, 1, ""),
                 (4, 4, 32, 8, 3, ""), (4, 8, 32, 4, 1, ""), (4, 32, 16, 4, 1, ""),
                 (8, 8, 16, 8, 3, ""), (8, 16, 16, 4, 1, ""), (8, 64, 16, 4, 1, "")]


def paged_readers(shape: Shape, dev: torch.device):
    """(name, callable) for each paged read of ``shape``'s pools (NHD, equal lengths)."""
    from kvattn.benchmarking import inputs

    lens = shape.seq_lens()
    pools = inputs.make_pools(lens, num_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                              page_size=shape.page_size, layout=shape.layout, dtype=torch.bfloat16, device=dev,
                              gen=inputs.generator(dev, 0))
    out = torch.empty(shape.batch * shape.num_kv_heads * 64, dtype=torch.float32, device=dev)
    fns = []
    for heads, splits, bn, warps, stages, evict in PAGED_READERS:
        if shape.num_kv_heads % heads:
            continue

        def fn(hd=heads, s=splits, bn=bn, w=warps, st=stages, e=evict):
            paged_sum_kernel[(shape.batch * shape.num_kv_heads // hd * s,)](
                pools.k, pools.v, pools.tables, out, lens[0], s, pools.tables.stride(0), *pools.k.stride()[:3],
                HEAD_DIM=shape.head_dim, PAGE_SIZE=shape.page_size, NUM_KV_HEADS=shape.num_kv_heads,
                BLOCK_N=bn, HEADS=hd, EVICT=e, num_warps=w, num_stages=st)
        fns.append((f"paged h{heads} s{splits} n{bn} w{warps} st{stages}{' ' + evict if evict else ''}", fn))
    return fns


def readers(x: torch.Tensor, sms: int):
    """(name, callable) for every read kernel tried on ``x``."""
    out = torch.empty(16 * sms, dtype=torch.int32, device=x.device)
    fns = [("torch.sum", lambda: torch.sum(x, dtype=torch.int64))]
    for per_sm in (4, 8, 16):
        for block, warps in ((1024, 4), (2048, 8), (4096, 8)):
            for evict in ("", "evict_first"):
                def fn(p=per_sm * sms, b=block, w=warps, e=evict):
                    stream_sum_kernel[(p,)](x, out, x.numel(), BLOCK=b, EVICT=e, num_warps=w)
                fns.append((f"stream p{per_sm}/SM b{block * 4 // 1024}K w{warps}{' ' + evict if evict else ''}", fn))
    return fns


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--filter", default="", help="only shapes whose id contains this")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    timer = Timer(dev, warmup_ms=25, rep_ms=args.rep)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy = copy_gbps(timer)
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy {copy:.0f} GB/s", flush=True)
    rows = []
    for shape in [s for s in SHAPES if args.filter in s.id]:
        nbytes = int(metrics.work(shape).bytes)
        x = torch.randint(0, 100, (nbytes // 4,), dtype=torch.int32, device=dev)
        times = {name: timer.graph([fn]) for name, fn in readers(x, sms)}
        paged = {}
        if shape.suite == "decode" and shape.layout == "NHD" and shape.kv_dtype == "bfloat16" and not shape.ragged:
            paged = {name: timer.graph([fn]) for name, fn in paged_readers(shape, dev)}
        frac = lambda us: nbytes / (us * 1e-6) / 1e9 / copy  # noqa: E731
        # Best of all, and best without the L2 hint: Triton 3.6 drops the hint on the pipelined
        # (cp.async) loads a decode kernel's K/V tiles take, so that one is the floor they can reach.
        best = min(times, key=times.get)
        plain = min((n for n in times if "evict_first" not in n), key=times.get)
        b2b = back_to_back_us([dict(readers(x, sms))[best]])
        row = {"shape": shape.id, "bytes": nbytes, "readers_us": times,
               "best_reader": best, "flushed_us": times[best], "flushed_fraction": frac(times[best]),
               "best_plain_reader": plain, "plain_flushed_us": times[plain], "plain_fraction": frac(times[plain]),
               "back_to_back_us": b2b, "back_to_back_fraction": frac(b2b), "paged_readers_us": paged}
        rows.append(row)
        print(f"{shape.id:40s} {nbytes / 1e6:7.1f} MB  best {times[best]:7.1f} us ({frac(times[best]):.3f}, {best})"
              f"  no hint {times[plain]:7.1f} us ({frac(times[plain]):.3f}, {plain})"
              f"  back to back {b2b:7.1f} us ({frac(b2b):.3f})", flush=True)
        for name, us in paged.items():
            print(f"    {name:36s} {us:7.1f} us ({frac(us):.3f})", flush=True)
        del x
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                       "triton": triton.__version__, "copy_gbps": copy, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
