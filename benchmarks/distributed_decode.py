"""Context-parallel decode on 2 GPUs against one GPU holding the whole cache (kvattn.distributed).

Spawns one process per GPU (no torchrun) over NCCL, NVLink multicast off. Problems (bf16, D 128):

* single decode of 1M tokens, 32 query / 32 KV heads: 17.2 GB of K and V (8.6 GB a GPU on 2);
* batch decode of 8 requests x 256k tokens, 32 / 8 heads, 64-token pages, NHD: 8.6 GB.

Each is timed as CUDA-graph replays (median; L2 flushed before each replay; the ranks aligned by
a one-element all-reduce before each timed replay, so a rank never times its peer's flush): the
1-GPU call on rank 0 over the whole cache, then on every rank the context-parallel call and its
parts alone (the local decode, the all-gather, the merge). Ceilings of each GPU are measured in
the same run (a 1 GiB device copy, a bf16 8192^3 matmul). Rank 0 checks the 2-GPU output against
the 1-GPU one and writes JSON.

Usage: ``python benchmarks/distributed_decode.py --out results.json`` (``--smoke``: tiny shapes, 2
gloo processes on the CPU, reference backend: checks the script, times nothing meaningful).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import kvattn  # noqa: E402
from kvattn import decode as kdecode  # noqa: E402
from kvattn import distributed as kd  # noqa: E402

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CHUNK = 1 << 16  # tokens drawn per generator seed (each rank draws only the chunks it holds)


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------
class Clock:
    def __init__(self, device, reps: int, warmup: int, distributed: bool):
        self.device, self.reps, self.warmup, self.distributed = device, reps, warmup, distributed
        self.cuda = device.type == "cuda"
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if self.cuda else None
        self.tick = torch.zeros(1, device=device)
        self.eager_fallbacks: list = []

    def capture(self, fn):
        """A CUDA graph's replay of one call of ``fn`` (after two warm-up calls); ``fn`` itself, timed
        eagerly and recorded as such, if the capture fails."""
        if not self.cuda:
            return fn
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
        except Exception as exc:  # noqa: BLE001 (recorded, then timed eagerly)
            print(f"capture failed, timing eager calls: {type(exc).__name__}: {exc}", flush=True)
            self.eager_fallbacks.append(f"{type(exc).__name__}: {exc}"[:300])
            torch.cuda.synchronize()
            return fn
        torch.cuda.synchronize()
        return graph.replay

    def time_us(self, fn, aligned: bool) -> float:
        """Median microseconds of ``fn`` (a graph replay); ``aligned``: every rank runs it (the same
        number of times) and they start each run together."""
        if not self.cuda:
            times = []
            for _ in range(3):
                t = time.perf_counter()
                fn()
                times.append(1e6 * (time.perf_counter() - t))
            return statistics.median(times)
        events = []
        for i in range(self.warmup + self.reps):
            self.flush.zero_()
            if aligned:
                dist.all_reduce(self.tick)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            if i >= self.warmup:
                events.append((start, end))
        torch.cuda.synchronize()
        return statistics.median(1e3 * s.elapsed_time(e) for s, e in events)


def ceilings(device) -> dict:
    if device.type != "cuda":
        return {}
    from triton.testing import do_bench

    src = torch.randn(1 << 28, device=device, dtype=torch.float32)  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=100, return_mode="median")
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    mm_ms = do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    del src, dst, a, b
    return {"copy_GBps": 2 * (1 << 30) / copy_ms / 1e6, "bf16_matmul_TFLOPs": 2 * 8192**3 / mm_ms / 1e9}


# ---------------------------------------------------------------------------------------------
# inputs: each chunk of tokens drawn from its own seed, so every rank draws only what it holds
# ---------------------------------------------------------------------------------------------
def draw(shape, seed: int, device, dtype) -> torch.Tensor:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def single_kv(start: int, stop: int, heads: int, dim: int, device, dtype, which: int) -> torch.Tensor:
    """Tokens ``start .. stop - 1`` of K (which 0) or V (1) ``[n, H, D]``, chunk by chunk."""
    out = torch.empty(stop - start, heads, dim, device=device, dtype=dtype)
    for c0 in range(start - start % CHUNK, stop, CHUNK):
        lo, hi = max(c0, start), min(c0 + CHUNK, stop)
        out[lo - start : hi - start] = draw((CHUNK, heads, dim), 1000 * which + c0 // CHUNK, device, dtype)[
            lo - c0 : hi - c0]
    return out


# ---------------------------------------------------------------------------------------------
# problems
# ---------------------------------------------------------------------------------------------
def single_decode_problem(rank, world, device, dtype, clock, length, heads, dim, report):
    q = draw((heads, dim), 7, device, dtype)
    start, stop = kd.shard_range(length, world, rank)
    result = {"problem": f"single decode L{length} h{heads}/{heads} D{dim} {str(dtype)[6:]}",
              "kv_bytes": 2 * length * heads * dim * torch.finfo(dtype).bits // 8}
    ref = None
    if rank == 0:  # one GPU, the whole cache
        k, v = (single_kv(0, length, heads, dim, device, dtype, w) for w in (0, 1))
        out1 = torch.empty(heads, dim, device=device, dtype=dtype)

        def one():
            kvattn.single_decode_with_kv_cache(q, k, v)

        result["one_gpu_us"] = clock.time_us(clock.capture(one), aligned=False)
        print(f"{result['problem']}: one_gpu_us {result['one_gpu_us']:.1f}", flush=True)
        ref = kvattn.single_decode_with_kv_cache(q, k, v)
        out1.copy_(ref)
        del k, v
        torch.cuda.empty_cache() if clock.cuda else None
    dist.barrier()
    k, v = (single_kv(start, stop, heads, dim, device, dtype, w) for w in (0, 1))
    ws = torch.zeros(8 << 20, dtype=torch.uint8, device=device)
    out = torch.empty(heads, dim, device=device, dtype=dtype)

    def full():
        kd.single_decode(q, k, v, kv_offset=start, total_len=length, out=out, workspace_buffer=ws)

    part_o = torch.empty(heads, dim, device=device)
    part_lse = torch.empty(heads, device=device)

    def local():
        kvattn.single_decode_with_kv_cache(q, k, v, return_lse=True, out=part_o, lse=part_lse)

    parts = _exchange_parts(world, 1, heads, dim, device, clock)
    result.update(_time_parts(clock, full, local, parts))
    full()
    if clock.cuda:
        torch.cuda.synchronize()
    if rank == 0:
        result["rel_err_vs_one_gpu"] = _rel(out, ref)
    report.append(result)


def batch_decode_problem(rank, world, device, dtype, clock, batch, length, hq, hkv, dim, page, report):
    """Round-robin pages: logical page p of request b on rank p % R. Rank r's pages of request b are
    one block drawn from seed (b, r); the 1-GPU pool is every block, indexed by a global table."""
    sh = kd.PageSharding(world, page)
    pages = length // page
    local_pages = [len(sh.local_columns(r, pages)) for r in range(world)]
    q = draw((batch, hq, dim), 11, device, dtype)
    lens = torch.full((batch,), length, dtype=torch.int32, device=device)
    result = {"problem": f"batch decode {batch}x{length} h{hq}/{hkv} D{dim} p{page} {str(dtype)[6:]} round_robin",
              "kv_bytes": 2 * batch * length * hkv * dim * torch.finfo(dtype).bits // 8}

    def block(b, r):  # [n_local_pages, page, 2, ...] -> stacked K/V NHD pages [n, 2, page, Hkv, D]
        return draw((local_pages[r], 2, page, hkv, dim), 100 * b + r, device, dtype)

    ref = None
    ws1 = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
    if rank == 0:
        pool = torch.cat([block(b, r) for b in range(batch) for r in range(world)])
        base = {}
        offset = 0
        for b in range(batch):
            for r in range(world):
                base[b, r] = offset
                offset += local_pages[r]
        table = torch.tensor([[base[b, p % world] + p // world for p in range(pages)] for b in range(batch)],
                             dtype=torch.int32, device=device)

        def one():
            kvattn.xqa_batch_decode_with_kv_cache(q, pool, ws1, table, lens, length, bmm1_scale=dim**-0.5)

        result["one_gpu_us"] = clock.time_us(clock.capture(one), aligned=False)
        print(f"{result['problem']}: one_gpu_us {result['one_gpu_us']:.1f}", flush=True)
        ref = kvattn.xqa_batch_decode_with_kv_cache(q, pool, ws1, table, lens, length, bmm1_scale=dim**-0.5)
        del pool
        torch.cuda.empty_cache() if clock.cuda else None
    dist.barrier()
    pool = torch.cat([block(b, rank) for b in range(batch)])
    table = torch.arange(batch * local_pages[rank], dtype=torch.int32, device=device).view(batch, -1)
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device=device)
    out = torch.empty(batch, hq, dim, device=device, dtype=dtype)

    def full():
        kd.batch_decode(q, pool, ws, table, lens, length, sharding=sh, bmm1_scale=dim**-0.5, out=out)

    local_lens = sh.local_seq_lens(lens, rank)
    local_max = sh.local_max_seq_len(length, rank)
    part_o = torch.empty(batch, hq, dim, device=device)
    part_lse = torch.empty(batch, hq, device=device)
    lens_buf = torch.empty_like(lens)

    def local():  # the local lengths and the local decode, as the full call runs them
        kd._local_lengths(sh, lens, rank, lens_buf, None, -1)
        kdecode._batch_decode(q, pool, ws1, table, lens_buf, local_max, dim**-0.5, out=part_o, return_lse=True,
                              lse=part_lse)

    parts = _exchange_parts(world, batch, hq, dim, device, clock)
    result.update(_time_parts(clock, full, local, parts))
    full()
    if clock.cuda:
        torch.cuda.synchronize()
    if rank == 0:
        result["rel_err_vs_one_gpu"] = _rel(out, ref)
        result["local_tokens"] = int(local_lens.sum())
    report.append(result)


def _exchange_parts(world, rows, heads, dim, device, clock):
    """The all-gather and the merge of the context-parallel call, alone, on buffers of its sizes."""
    n = rows * heads * (dim + 1)
    send = torch.randn(n, device=device)
    send[rows * heads * dim :] = torch.randn(rows * heads, device=device) * 4  # LSEs
    recv = torch.empty(world * n, device=device)
    out = torch.empty(rows, heads, dim, device=device, dtype=torch.bfloat16)
    o_all = recv.as_strided((world, rows, heads, dim), (n, heads * dim, dim, 1))
    lse_all = recv.as_strided((world, rows, heads), (n, heads, 1), rows * heads * dim)
    kd._ALL_GATHER(recv, send)

    def gather():
        kd._ALL_GATHER(recv, send)

    def merge():
        kvattn.merge_states(o_all, lse_all, out=out)

    return gather, merge


def _time_parts(clock, full, local, parts) -> dict:
    gather, merge = parts
    timings = {}
    for name, fn in (("two_gpu_us", full), ("local_us", local), ("all_gather_us", gather), ("merge_us", merge)):
        timings[name] = clock.time_us(clock.capture(fn), aligned=True)
        if dist.get_rank() == 0:
            print(f"  {name} {timings[name]:.1f}", flush=True)
    timings["eager_fallbacks"] = list(clock.eager_fallbacks)
    return timings


def _rel(out, ref) -> float:
    o, r = out.double(), ref.double()
    return float((o - r).norm() / r.norm())


# ---------------------------------------------------------------------------------------------
# the ranks
# ---------------------------------------------------------------------------------------------
def worker(rank, world, port, args):
    os.environ.update(NO_MULTICAST)
    if args.smoke:
        device, backend = torch.device("cpu"), "gloo"
        os.environ["KVATTN_BACKEND"] = "reference"
        torch.set_num_threads(1)
    else:
        device, backend = torch.device(f"cuda:{rank}"), "nccl"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            **({"device_id": device} if backend == "nccl" else {}))
    dist.all_reduce(torch.zeros(1, device=device))  # (creates the communicator before any capture)
    clock = Clock(device, args.reps, args.warmup, True)
    report = []
    dtype = torch.bfloat16
    ceil = ceilings(device)
    if rank == 0:
        print(f"ceilings rank 0: {ceil}", flush=True)
    if args.smoke:
        single_decode_problem(rank, world, device, dtype, clock, 3000, 4, 64, report)
        batch_decode_problem(rank, world, device, dtype, clock, 2, 1024, 8, 2, 64, 16, report)
    else:
        single_decode_problem(rank, world, device, dtype, clock, args.single_len, 32, 128, report)
        batch_decode_problem(rank, world, device, dtype, clock, 8, args.batch_len, 32, 8, 128, 64, report)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "ceilings": ceil, "results": report})
    if rank == 0:
        summary = _summarise(gathered, world)
        out = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
               "date": time.strftime("%Y-%m-%d"), "world": world, "torch": torch.__version__,
               "triton": __import__("triton").__version__, "ranks": gathered, "summary": summary}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
        _print(summary)
    dist.barrier()
    dist.destroy_process_group()


def _summarise(gathered, world) -> list:
    rows = []
    for i, r0 in enumerate(gathered[0]["results"]):
        per_rank = [g["results"][i] for g in gathered]
        two = max(r["two_gpu_us"] for r in per_rank)
        local = max(r["local_us"] for r in per_rank)
        gather = max(r["all_gather_us"] for r in per_rank)
        merge = max(r["merge_us"] for r in per_rank)
        one = r0.get("one_gpu_us")
        rows.append({
            "problem": r0["problem"], "one_gpu_us": one, "two_gpu_us": two, "speedup": one / two if one else None,
            "local_us": local, "all_gather_us": gather, "merge_us": merge,
            "exchange_share": (gather + merge) / two, "beyond_local_share": (two - local) / two,
            "one_gpu_GBps": r0["kv_bytes"] / one / 1e3 if one else None,
            "two_gpu_GBps_per_gpu": r0["kv_bytes"] / world / two / 1e3,
            "rel_err_vs_one_gpu": r0.get("rel_err_vs_one_gpu"),
        })
    return rows


def _print(summary):
    print(f"{'problem':58s} {'1 GPU us':>9s} {'2 GPU us':>9s} {'speedup':>7s} {'local':>8s} {'gather':>7s} "
          f"{'merge':>6s} {'exch %':>6s} {'rel err':>8s}")
    for r in summary:
        print(f"{r['problem']:58s} {r['one_gpu_us'] or 0:9.1f} {r['two_gpu_us']:9.1f} {r['speedup'] or 0:7.3f} "
              f"{r['local_us']:8.1f} {r['all_gather_us']:7.1f} {r['merge_us']:6.1f} "
              f"{100 * r['exchange_share']:6.2f} {r['rel_err_vs_one_gpu']:8.2e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON file (rank 0 writes it)")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--single-len", type=int, default=1 << 20)
    parser.add_argument("--batch-len", type=int, default=1 << 18)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, gloo on the CPU (checks the script)")
    args = parser.parse_args()
    os.environ.update(NO_MULTICAST)
    if not args.smoke and torch.cuda.device_count() < args.world:
        raise SystemExit(f"needs {args.world} GPUs, found {torch.cuda.device_count()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
