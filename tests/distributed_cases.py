"""Context-parallel cases run by every rank of a process group (``tests/test_distributed.py``).

Every rank builds the same global inputs from a seed, computes the single-process result, cuts
its own slice (its own page pool and table, :func:`kvattn.distributed.shard_kv_cache`), runs the
distributed call and checks it against the single-process result; a failing check raises in the
rank, which fails the spawning test.

Float32 outputs are compared: the merged result must equal one call over all the keys within
float32 rounding (the merge's), and the stored 16-bit outputs within one rounding step.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback

import torch
import torch.distributed as dist

import kvattn
from kvattn import dense
from kvattn import distributed as kd
from kvattn.testing import make_paged_kv

# Tolerances: float32 partials merged in float32 against one float32 call. The float32 results
# differ by the order of the sums (the merge's rounding and the local kernels' own split points).
F32_RTOL, F32_ATOL = 2e-5, 2e-6
LSE_ATOL = 1e-5


def _close(name, got, want, rtol=F32_RTOL, atol=F32_ATOL):
    got, want = got.float().cpu(), want.float().cpu()
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)), f"{name}: -inf pattern differs"
    fin = torch.isfinite(want)
    assert torch.isfinite(got[fin]).all(), f"{name}: non-finite values"
    err = (got[fin] - want[fin]).abs()
    bound = atol + rtol * want[fin].abs()
    worst = float((err / bound).max()) if err.numel() else 0.0
    assert worst <= 1.0, f"{name}: max error {float(err.max()):.3g} ({worst:.2f}x the tolerance)"


def _stored_close(name, got, want_f32):
    """A 16-bit output vs the float32 result: within one rounding step of the dtype."""
    eps = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[got.dtype]
    _close(name, got, want_f32, rtol=eps, atol=eps * 1e-2)


def _kernels() -> bool:
    return os.environ.get("KVATTN_BACKEND") == "triton"


# What the kernels may add beyond twice the single-call error: their P operand of the P.V product
# is rounded to the 16-bit type relative to each split's own running max, so the slices' roundings
# differ from one call's (flash-attention practice; tests/ops/test_decode.py uses the same bound).
EXTRA = {torch.float16: 5e-4, torch.bfloat16: 4e-3}


def _as_close_to_exact(name, got, single, exact, dtype):
    """Kernels: ``got`` (distributed) as close to the float64 ``exact`` as ``single`` (one call over
    all the keys) is, within 2x plus the operand rounding, in norm and element-wise."""
    got, single, exact = got.double().cpu(), single.double().cpu(), exact.double().cpu()
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    rel = lambda x: float((x - exact).norm() / exact.norm().clamp_min(1e-30))  # noqa: E731
    assert rel(got) <= 2 * rel(single) + EXTRA[dtype], f"{name}: relative error {rel(got):.3g} vs {rel(single):.3g}"
    amax = float(exact.abs().max())
    worst, single_worst = float((got - exact).abs().max()), float((single - exact).abs().max())
    assert worst <= 2 * single_worst + 4 * EXTRA[dtype] * amax + 1e-6, f"{name}: max error {worst:.3g}"


def check_results(name, dtype, o32, o16, lse, ref_o32, ref_o16, ref_lse, exact_o):
    """The distributed float32 / stored outputs and LSE against the single-process call: float32
    rounding on the reference backend; on the kernels, as close to float64 as the single call."""
    if _kernels():
        _as_close_to_exact(f"{name} out", o32, ref_o32, exact_o(), dtype)
        _as_close_to_exact(f"{name} stored out", o16, ref_o16, exact_o(), dtype)
        _close(f"{name} lse", lse, ref_lse, rtol=1e-5, atol=1e-4)
    else:
        _close(f"{name} out", o32, ref_o32)
        _stored_close(f"{name} stored out", o16, ref_o32)
        _close(f"{name} lse", lse, ref_lse, rtol=0, atol=LSE_ATOL)
    assert o16.dtype == dtype


def _rank_slice(global_case, sharding, rank, device, seed):
    kv, tables = kd.shard_kv_cache(global_case.kv_cache, global_case.block_tables, global_case.seq_lens, sharding,
                                   rank, extra_pages=2)
    return kv, tables


# ---------------------------------------------------------------------------------------------
# batch decode
# ---------------------------------------------------------------------------------------------
def batch_decode_case(rank, world, device, dtype, *, lens, scheme="round_robin", span=None, page=16, hkv=2,
                      group=4, d=64, sinks=False, window=-1, q_len=1, mask=False, scatter=False, seed=0,
                      layout="NHD", drafts=None):
    """``drafts``: ragged drafts (q_cu_seq_lens), request b's count, at most ``q_len``."""
    sharding = kd.PageSharding(world, page, scheme, span)
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=dtype, layout=layout,
                         device=device, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    hq = hkv * group
    rows = len(lens) * q_len if drafts is None else sum(drafts)
    q = torch.randn(rows, hq, d, generator=g).to(device=device, dtype=dtype)
    snk = (torch.randn(hq, generator=g) * 2).to(device) if sinks else None
    mk = None
    if mask:
        words = 2 * ((q_len + 31) // 32)
        bits = torch.randint(0, 2, (len(lens), q_len, q_len), generator=g, dtype=torch.int32)
        bits = bits | torch.eye(q_len, dtype=torch.int32)  # (a row always sees its own token)
        packed = torch.zeros(len(lens), q_len, words, dtype=torch.int32)
        for c in range(q_len):
            packed[:, :, c // 16] |= bits[:, :, c] << (c % 16)
        mk = packed.to(torch.int16).view(torch.uint16).to(device)
        if drafts is not None:  # request b's rows: the first drafts[b] rows of its [q_len, words] block
            mk = torch.cat([mk[b, :n] for b, n in enumerate(drafts)])
    args = dict(bmm1_scale=d**-0.5, bmm2_scale=0.75, window_left=window, sinks=snk, kv_layout=layout,
                q_len_per_req=q_len, mask=mk)
    if drafts is not None:
        cu = [0]
        for n in drafts:
            cu.append(cu[-1] + n)
        args["q_cu_seq_lens"] = torch.tensor(cu, dtype=torch.int32, device=device)
    max_len = max(max(lens), 1)
    ws = torch.zeros(2 << 20, dtype=torch.uint8, device=device)
    ref_o, ref_lse = kvattn.xqa_batch_decode_with_kv_cache(
        q, case.kv_cache, ws, case.block_tables, case.seq_lens, max_len, out=torch.empty(rows, hq, d, device=device),
        return_lse=True, **args)
    ref16 = kvattn.xqa_batch_decode_with_kv_cache(q, case.kv_cache, ws, case.block_tables, case.seq_lens, max_len,
                                                  **args)
    kv, tables = _rank_slice(case, sharding, rank, device, seed)
    ws_local = torch.zeros(2 << 20, dtype=torch.uint8, device=device)
    heads = slice(rank * hq // world, (rank + 1) * hq // world) if scatter else slice(None)
    out_heads = hq // world if scatter else hq
    o32, lse = kd.batch_decode(q, kv, ws_local, tables, case.seq_lens, max_len, sharding=sharding,
                               out=torch.full((rows, out_heads, d), float("nan"), device=device), return_lse=True,
                               scatter_heads=scatter, **args)
    o16 = kd.batch_decode(q, kv, ws_local, tables, case.seq_lens, max_len, sharding=sharding, scatter_heads=scatter,
                          **args)

    def exact():
        cpu = {k: v.cpu() if torch.is_tensor(v) else v for k, v in args.items()}
        if drafts is None:
            return dense.batch_decode(q.cpu(), case.kv_cache.cpu(), case.block_tables.cpu(), case.seq_lens.cpu(),
                                      **cpu)[:, heads]
        cu = cpu.pop("q_cu_seq_lens").tolist()
        m = cpu.pop("mask")
        parts = []
        for b, n in enumerate(drafts):  # each request by itself, its drafts as its q_len_per_req
            if n:
                r = slice(cu[b], cu[b + 1])
                parts.append(dense.batch_decode(
                    q[r].cpu(), case.kv_cache.cpu(), case.block_tables[b:b + 1].cpu(), case.seq_lens[b:b + 1].cpu(),
                    **dict(cpu, q_len_per_req=n, mask=None if m is None else m[r].reshape(1, n, -1)))[:, heads])
        return torch.cat(parts)

    check_results("batch_decode", dtype, o32, o16, lse, ref_o[:, heads], ref16[:, heads], ref_lse[:, heads], exact)


# ---------------------------------------------------------------------------------------------
# MLA
# ---------------------------------------------------------------------------------------------
def mla_case(rank, world, device, dtype, *, lens, scheme="round_robin", span=None, page=16, hq=16, scatter=False,
             q_len=1, seed=0):
    sharding = kd.PageSharding(world, page, scheme, span)
    case = make_paged_kv(lens, num_kv_heads=1, head_dim=576, page_size=page, dtype=dtype, form="shared",
                         device=device, seed=seed)
    cache = case.kv_cache[:, 0, :, 0]  # [P, page, 576]
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(lens), q_len, hq, 576, generator=g).to(device=device, dtype=dtype)
    max_len = max(max(lens), 1)
    args = dict(bmm1_scale=192**-0.5, bmm2_scale=1.25)
    ws = torch.zeros(2 << 20, dtype=torch.uint8, device=device)
    tokens = (len(lens), q_len) if q_len > 1 else (len(lens),)
    ref_o, ref_lse = _mla_call(q, cache, ws, case.block_tables, case.seq_lens, max_len,
                               torch.empty(*tokens, hq, 512, device=device), **args)
    ref16 = kvattn.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, case.block_tables, case.seq_lens,
                                                      max_len, **args)
    kv, tables = kd.shard_kv_cache(cache, case.block_tables, case.seq_lens, sharding, rank, extra_pages=2)
    heads = slice(rank * hq // world, (rank + 1) * hq // world) if scatter else slice(None)
    out_heads = hq // world if scatter else hq
    # (the merge's buffers grow with the rows: Q tokens x the requests, times the ranks gathered)
    ws_local = torch.zeros((2 << 20) * q_len, dtype=torch.uint8, device=device)
    o32, lse = kd.mla_decode(q, kv, ws_local, tables, case.seq_lens, max_len, sharding=sharding,
                             out=torch.empty(*tokens, out_heads, 512, device=device), return_lse=True,
                             scatter_heads=scatter, **args)
    o16 = kd.mla_decode(q, kv, ws_local, tables, case.seq_lens, max_len, sharding=sharding, scatter_heads=scatter,
                        **args)

    def exact():
        # token r: a one-token decode over the first L - (Q - 1 - r) keys (zero where none)
        lens_cpu = case.seq_lens.cpu().to(torch.int64)
        per_token = []
        for r in range(q_len):
            seen = (lens_cpu - (q_len - 1 - r)).clamp(min=0)
            o = dense.mla(q[:, r : r + 1].cpu(), cache.cpu(), case.block_tables.cpu(), seen.to(torch.int32), **args)
            per_token.append(torch.where((seen == 0)[:, None, None], 0.0, o))
        o = torch.stack(per_token, 1) if q_len > 1 else per_token[0]
        return o[..., heads, :]

    cut = (slice(None),) * (len(tokens) - 1)
    check_results("mla", dtype, o32, o16, lse, ref_o[cut + (slice(None), heads)], ref16[cut + (slice(None), heads)],
                  ref_lse[cut + (slice(None), heads)], exact)


def _mla_call(q, cache, ws, tables, lens, max_len, out, **args):
    if q.dtype == torch.bfloat16:
        return kvattn.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, tables, lens, max_len, out=out,
                                                         return_lse=True, **args)
    raise AssertionError("MLA cases use bfloat16")


# ---------------------------------------------------------------------------------------------
# single decode
# ---------------------------------------------------------------------------------------------
def single_decode_case(rank, world, device, dtype, *, length, hq=8, hkv=2, d=64, layout="NHD", window=-1,
                       mode="NONE", soft_cap=None, scatter=False, seed=0, shares=None):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(hq, d, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(length, hkv, d, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(length, hkv, d, generator=g).to(device=device, dtype=dtype)
    args = dict(pos_encoding_mode=mode, window_left=window, logits_soft_cap=soft_cap, kv_layout=layout)
    layout_kv = (lambda t: t) if layout == "NHD" else (lambda t: t.transpose(0, 1).contiguous())
    ref_o, ref_lse = kvattn.single_decode_with_kv_cache(q, layout_kv(k), layout_kv(v), return_lse=True,
                                                        out=torch.empty(hq, d, device=device), **args)
    start, stop = shares[rank] if shares is not None else kd.shard_range(length, world, rank)
    k_r, v_r = layout_kv(k[start:stop]), layout_kv(v[start:stop])
    heads = slice(rank * hq // world, (rank + 1) * hq // world) if scatter else slice(None)
    out_heads = hq // world if scatter else hq
    ref16 = kvattn.single_decode_with_kv_cache(q, layout_kv(k), layout_kv(v), **args)
    o32, lse = kd.single_decode(q, k_r, v_r, kv_offset=start, total_len=length, return_lse=True,
                                out=torch.empty(out_heads, d, device=device), scatter_heads=scatter, **args)
    o16 = kd.single_decode(q, k_r, v_r, kv_offset=start, total_len=length,
                           workspace_buffer=torch.zeros(1 << 20, dtype=torch.uint8, device=device),
                           scatter_heads=scatter, **args)

    def exact():
        return dense.single_decode(q.cpu(), layout_kv(k).cpu(), layout_kv(v).cpu(), **args)[0][heads]

    check_results("single_decode", dtype, o32, o16, lse, ref_o[heads], ref16[heads], ref_lse[heads], exact)


# ---------------------------------------------------------------------------------------------
# the case lists
# ---------------------------------------------------------------------------------------------
RAGGED = [0, 1, 17, 70, 129, 33]


def cases(world: int, quick: bool):
    """``(name, function, kwargs)`` of every case, for ``world`` ranks."""
    span = 2  # pages a rank of the contiguous scheme holds (the last rank: the rest)
    out = [
        ("decode-rr", batch_decode_case, dict(lens=RAGGED)),
        ("decode-rr-sinks-window", batch_decode_case, dict(lens=RAGGED, sinks=True, window=40)),
        ("decode-contig-sinks-window", batch_decode_case, dict(lens=RAGGED, scheme="contiguous", span=span, sinks=True,
                                                              window=25)),
        ("decode-rr-spec-mask", batch_decode_case, dict(lens=[3, 40, 66, 18], q_len=3, mask=True, sinks=True)),
        ("decode-rr-ragged-drafts-mask", batch_decode_case, dict(lens=[3, 40, 66, 18], q_len=4, drafts=[2, 4, 0, 3],
                                                                 mask=True, sinks=True)),
        ("decode-contig-spec-causal", batch_decode_case, dict(lens=[2, 40, 66], q_len=2, scheme="contiguous",
                                                              span=span, layout="HND")),
        ("decode-rr-scatter-heads", batch_decode_case, dict(lens=RAGGED, sinks=True, scatter=True)),
        ("mla-rr", mla_case, dict(lens=[0, 50, 97, 16])),
        ("mla-contig-scatter", mla_case, dict(lens=[50, 97, 5], scheme="contiguous", span=span, scatter=True)),
        # three tokens a request: one exactly Q long, one shorter, drafts across page (rank) boundaries
        ("mla-rr-mtp", mla_case, dict(lens=[3, 50, 4, 33, 0], q_len=3)),
        ("mla-contig-mtp-scatter", mla_case, dict(lens=[4, 97, 31], q_len=4, scheme="contiguous", span=span,
                                                  scatter=True)),
        ("single", single_decode_case, dict(length=300)),
        ("single-window-hnd", single_decode_case, dict(length=257, window=100, layout="HND")),
        ("single-alibi-window", single_decode_case, dict(length=190, mode="ALIBI", window=150)),
        ("single-softcap-scatter", single_decode_case, dict(length=120, soft_cap=20.0, scatter=True)),
        # one rank with no key at all, one holding everything
        ("single-uneven", single_decode_case, dict(length=64, shares=[(0, 0)] + [(0, 64)] + [(64, 64)] * (world - 2))),
    ]
    keep = ("decode-rr-sinks-window", "decode-contig-sinks-window", "decode-rr-spec-mask", "mla-rr", "mla-rr-mtp",
            "single-window-hnd", "single-uneven")
    if quick == "gpu":  # 2 GPUs: the quick cases, scattered heads, MLA on Hopper's Gluon kernel, long requests
        out = [c for c in out if c[0] in keep + ("decode-rr-scatter-heads", "decode-rr-ragged-drafts-mask")]
        out.append(("mla-rr-gluon", mla_case, dict(lens=[0, 500, 1200, 64], hq=64, page=64)))
        out.append(("mla-rr-gluon-mtp", mla_case, dict(lens=[2, 500, 1200, 64], hq=16, q_len=4, page=64)))
        out.append(("decode-long", batch_decode_case, dict(lens=[5000, 1, 20000, 777], d=128, hkv=8, sinks=True)))
    elif quick:  # one case of each function and scheme
        out = [c for c in out if c[0] in keep]
    return out


def run_rank(rank: int, world: int, port: int, backend: str, dtype_name: str, quick, env: dict) -> None:
    """The body of one spawned rank: init the group, run the cases (all, the ``quick`` subset, or
    those named in a list), tear down."""
    os.environ.update(env)
    torch.set_num_threads(1)  # (ranks share the machine's cores)
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    # An explicit store, so the teardown can use it after the group is gone: rank 0 hosts it and
    # returns only once every other rank has torn down (a rank whose peer's store vanished under
    # its gloo teardown aborted: "terminate called without an active exception").
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=300))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            **({"device_id": device} if backend == "nccl" else {}))
    dtype = getattr(torch, dtype_name)
    try:
        chosen = cases(world, False)
        if isinstance(quick, (list, tuple)):
            chosen = [c for c in chosen if c[0] in quick]
        elif quick:
            chosen = cases(world, quick)
        for name, fn, kw in chosen:
            try:
                fn(rank, world, device, dtype, **kw)
            except Exception as exc:
                raise AssertionError(f"rank {rank}/{world}, case {name}: {exc}\n{traceback.format_exc()}") from exc
            if rank == 0 and backend == "nccl":  # (progress, for a run cut short by a time limit)
                print(f"case {name}: ok", flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
        if rank:
            store.add("torn_down", 1)
        else:
            deadline = time.monotonic() + 60
            while store.add("torn_down", 0) < world - 1 and time.monotonic() < deadline:
                time.sleep(0.01)
