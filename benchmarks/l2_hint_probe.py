"""Does an L2 eviction hint on streamed reads change what do_bench's L2 flush costs a short kernel?

do_bench zeroes a 256 MB buffer before each timed call, leaving the L2 full of dirty lines; a
read-only kernel that then streams through the cache evicts them and pays for their write-back.
This streams N bytes with plain (register) loads, with and without ``evict_first``, timed with the
flush and back to back without it.

Usage (on the device): ``PYTHONPATH=src python benchmarks/l2_hint_probe.py``
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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


def main() -> None:
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    programs = sms * 8
    out = torch.empty(programs, dtype=torch.int32, device=dev)
    for mb in (64, 134, 268, 1074):
        x = torch.randint(0, 100, (mb * (1 << 20) // 4,), dtype=torch.int32, device=dev)
        for evict in ("", "evict_first"):
            def fn():
                stream_sum_kernel[(programs,)](x, out, x.numel(), BLOCK=2048, EVICT=evict, num_warps=8)
            fn()
            flushed = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(50):
                fn()
            e.record()
            e.synchronize()
            back = s.elapsed_time(e) * 1e3 / 50
            gbs = lambda us: x.numel() * 4 / us / 1e3  # noqa: E731
            print(f"{mb:5d} MB evict={evict or 'normal':12s} flushed {flushed:7.1f} us {gbs(flushed):6.0f} GB/s"
                  f" | back-to-back {back:7.1f} us {gbs(back):6.0f} GB/s", flush=True)
        del x


if __name__ == "__main__":
    main()
