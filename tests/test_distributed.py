"""kvattn.distributed: sharding arithmetic in one process; context-parallel calls across processes.

On a CPU machine the group is 2 or 4 gloo processes (``torch.multiprocessing`` spawn) running the
reference backend; on a machine with 2+ GPUs the same cases run over NCCL on 2 GPUs with the
Triton kernels (NVLink multicast off: ``NCCL_NVLS_ENABLE=0``). Every rank checks the distributed
result against the single-process one (``tests/distributed_cases.py``).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import kvattn
from kvattn import distributed as kd
from kvattn.distributed import context_parallel

import distributed_cases

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world: int, backend: str, dtype: str, quick: bool = False, env: dict | None = None) -> None:
    env = dict(env or {})
    env.setdefault("KVATTN_BACKEND", "triton" if backend == "nccl" else "reference")
    mp.spawn(distributed_cases.run_rank, args=(world, _free_port(), backend, dtype, quick, env), nprocs=world,
             join=True)


# ---------------------------------------------------------------------------------------------
# process groups
# ---------------------------------------------------------------------------------------------
def test_two_gloo_ranks_reproduce_one_process():
    """Batch decode (ragged, both schemes, sinks, windows, spec decode, scattered heads), MLA and
    single decode (windows, ALiBi, soft cap, an empty rank) on the reference backend."""
    _spawn(2, "gloo", "bfloat16")


def test_four_gloo_ranks_reproduce_one_process():
    """The same design on 4 ranks: one case of each function and scheme (4 processes on a 2-core
    machine cost twice the time of 2)."""
    _spawn(4, "gloo", "bfloat16", quick=True)


@pytest.mark.skipif(GPUS > 0, reason="the CPU tier's run of the kernels (a GPU machine runs them over NCCL)")
def test_two_gloo_ranks_on_the_interpreted_kernels():
    """The Triton path (local-length kernel, the decode kernel's per-request first key, the merge
    kernel) across 2 gloo ranks, interpreted, float16: a windowed batch decode with sinks and a
    single decode with an empty rank."""
    _spawn(2, "gloo", "float16", quick=["decode-rr-sinks-window", "single-uneven"],
           env={"KVATTN_BACKEND": "triton", "TRITON_INTERPRET": "1"})


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_nccl_two_gpus_reproduce_one_gpu():
    """The cases over NCCL on 2 GPUs, Triton kernels, NVLink multicast off: one of each function
    and scheme, scattered heads, MLA on the Gluon kernel (Hq 64, 64-token pages) and long requests
    (the local decodes split)."""
    _spawn(2, "nccl", "bfloat16", quick="gpu", env={"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                                    "NVSHMEM_DISABLE_NVLS": "1"})


# ---------------------------------------------------------------------------------------------
# sharding arithmetic (one process)
# ---------------------------------------------------------------------------------------------
def _owners(sh: kd.PageSharding, length: int, rank: int) -> list:
    """Global positions rank holds among the first ``length`` tokens, in local order (brute force)."""
    pos = [t for t in range(length) if sh.owner(t // sh.page_size) == rank]
    return sorted(pos, key=lambda t: (sh.local_page(t // sh.page_size), t % sh.page_size))


SHARDINGS = [kd.PageSharding(2, 16), kd.PageSharding(3, 4), kd.PageSharding(4, 1),
             kd.PageSharding(2, 16, "contiguous", 2), kd.PageSharding(3, 4, "contiguous", 3)]


@pytest.mark.parametrize("sh", SHARDINGS, ids=lambda s: f"{s.scheme}-R{s.world_size}-P{s.page_size}")
def test_local_lengths_positions_and_bounds(sh):
    lens = torch.tensor([0, 1, 3, 4, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 129], dtype=torch.int32)
    for rank in range(sh.world_size):
        local = sh.local_seq_lens(lens, rank)
        assert local.dtype == torch.int32
        for n, got in zip(lens.tolist(), local.tolist()):
            held = _owners(sh, n, rank)
            assert got == len(held), (rank, n)
            if held:
                pos = sh.global_positions(torch.arange(len(held)), rank)
                assert pos.tolist() == held, (rank, n)
        assert sum(sh.local_seq_lens(lens, r) for r in range(sh.world_size)).tolist() == lens.tolist()
        for m in (1, 16, 17, 100, 129):
            assert sh.local_max_seq_len(m, rank) >= max(sh.local_seq_lens(lens[lens <= m], rank).tolist())
            assert sh.local_max_seq_len(m, rank) <= m
        out = torch.full((lens.numel(),), -7, dtype=torch.int32)
        assert sh.local_seq_lens(lens, rank, out=out) is out and out.tolist() == local.tolist()


@pytest.mark.parametrize("sh", SHARDINGS, ids=lambda s: f"{s.scheme}-R{s.world_size}-P{s.page_size}")
def test_local_lengths_kernel_matches_the_torch_form(sh, monkeypatch):
    """The one-launch Triton form of the local lengths and window starts (GPU path) against
    PageSharding's torch form."""
    device = torch.device("cuda" if GPUS else "cpu")
    lens = torch.tensor([0, 1, 3, 4, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 129, 300], dtype=torch.int32,
                        device=device)
    for window in (-1, 0, 7, 40):
        for rank in range(sh.world_size):
            got = []
            for backend in ("triton", "reference"):
                monkeypatch.setenv("KVATTN_BACKEND", backend)
                lens_out = torch.full_like(lens, -5)
                start_out = torch.full_like(lens, -5) if window >= 0 else None
                context_parallel._local_lengths(sh, lens, rank, lens_out, start_out, window)
                got.append((lens_out.cpu(), None if start_out is None else start_out.cpu()))
            assert torch.equal(got[0][0], got[1][0]), (window, rank)
            if window >= 0:
                assert torch.equal(got[0][1], got[1][1]), (window, rank)
                first = (lens.cpu().long() - 1 - window).clamp(min=0)
                assert got[1][1].tolist() == [len(_owners(sh, int(t), rank)) for t in first]


def test_local_block_tables_are_the_owned_columns():
    tables = torch.arange(3 * 7, dtype=torch.int32).view(3, 7)
    rr, spans = kd.PageSharding(3, 16), kd.PageSharding(2, 16, "contiguous", 3)
    assert rr.local_block_tables(tables, 1).tolist() == tables[:, [1, 4]].tolist()
    assert spans.local_block_tables(tables, 0).tolist() == tables[:, :3].tolist()
    assert spans.local_block_tables(tables, 1).tolist() == tables[:, 3:].tolist()  # the last rank: the rest
    view = rr.local_block_tables(tables, 2)
    assert view.data_ptr() == tables[:, 2:].data_ptr()  # a view


def test_sharding_rejects_bad_arguments():
    with pytest.raises(ValueError, match="^scheme:"):
        kd.PageSharding(2, 16, "striped")
    with pytest.raises(ValueError, match="^span_pages:"):
        kd.PageSharding(2, 16, "contiguous")
    with pytest.raises(ValueError, match="^span_pages:"):
        kd.PageSharding(2, 16, span_pages=3)
    with pytest.raises(ValueError, match="^world_size:"):
        kd.PageSharding(0, 16)
    with pytest.raises(ValueError, match="^rank:"):
        kd.PageSharding(2, 16).local_seq_lens(torch.tensor([3], dtype=torch.int32), 2)


def test_shard_range_covers_the_sequence():
    for length in (0, 1, 7, 100):
        for world in (1, 2, 3, 8):
            spans = [kd.shard_range(length, world, r) for r in range(world)]
            assert spans[0][0] == 0 and spans[-1][1] == length
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1


@pytest.mark.parametrize("sh", SHARDINGS[:2] + SHARDINGS[3:4], ids=lambda s: f"{s.scheme}-R{s.world_size}")
def test_shard_kv_cache_holds_each_ranks_tokens(sh):
    from kvattn.testing import make_paged_kv

    case = make_paged_kv([0, 9, 40, 70], num_kv_heads=2, head_dim=64, page_size=sh.page_size, dtype=torch.float16)
    for rank in range(sh.world_size):
        kv, tables = kd.shard_kv_cache(case.kv_cache, case.block_tables, case.seq_lens, sh, rank)
        local = sh.local_seq_lens(case.seq_lens, rank)
        for b, n in enumerate(local.tolist()):
            pos = sh.global_positions(torch.arange(n), rank)
            t = torch.arange(n)
            got = kv[tables[b, t // sh.page_size].long(), 0, t % sh.page_size].float()
            assert torch.equal(got, case.k_tokens[b][pos]), (rank, b)


@pytest.mark.parametrize("q_len,with_mask", [(2, False), (3, True), (5, True)])
@pytest.mark.parametrize("sh", [kd.PageSharding(2, 4), kd.PageSharding(3, 2, "contiguous", 2)],
                         ids=["rr", "contig"])
def test_local_draft_mask_matches_brute_force(sh, q_len, with_mask):
    """Bit (row, slot) of the local mask: local key ``n - Q + slot`` is a global key before the drafts
    (visible) or global draft ``c`` (the row's bit of the global mask, or ``c <= row``)."""
    g = torch.Generator().manual_seed(q_len)
    lens = torch.tensor([q_len, q_len + 1, 9, 14, 23], dtype=torch.int32)
    words = 2 * ((q_len + 31) // 32)
    bits = torch.randint(0, 2, (lens.numel(), q_len, q_len), generator=g, dtype=torch.int32)
    mask = None
    if with_mask:
        packed = torch.zeros(lens.numel(), q_len, words, dtype=torch.int32)
        for c in range(q_len):
            packed[:, :, c // 16] |= bits[:, :, c] << (c % 16)
        mask = packed.to(torch.int16).view(torch.uint16)
    for rank in range(sh.world_size):
        local = sh.local_seq_lens(lens, rank)
        out = torch.empty(lens.numel(), q_len, words, dtype=torch.int16)
        got = context_parallel._local_mask(mask, q_len, lens, local, sh, rank, out)
        assert got.dtype == torch.uint16
        gw = got.view(torch.int16).to(torch.int64) & 0xFFFF
        for b, (n, ln) in enumerate(zip(lens.tolist(), local.tolist())):
            for slot in range(q_len):
                i = ln - q_len + slot
                for row in range(q_len):
                    bit = (int(gw[b, row, slot // 16]) >> (slot % 16)) & 1
                    if i < 0:
                        assert bit == 0
                        continue
                    gpos = int(sh.global_positions(torch.tensor([i]), rank))
                    c = gpos - (n - q_len)
                    want = 1 if c < 0 else (int(bits[b, row, c]) if with_mask else int(c <= row))
                    assert bit == want, (rank, b, row, slot)


def test_calls_need_an_initialised_group():
    q = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="not initialised"):
        kd.batch_decode(q, torch.randn(4, 2, 16, 2, 64, dtype=torch.bfloat16), torch.zeros(1 << 20, dtype=torch.uint8),
                        torch.zeros(2, 2, dtype=torch.int32), torch.tensor([3, 4], dtype=torch.int32), 4,
                        sharding=kd.PageSharding(2, 16))


def test_exported():
    assert kvattn.distributed is kd
    for name in kd.__all__:
        assert getattr(kd, name).__doc__
