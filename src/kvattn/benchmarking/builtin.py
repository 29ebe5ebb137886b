"""``kvattn bench``'s problems: one shape per public function (GPU-sized on CUDA, tiny on a CPU), random
values, each request's pages in a random order, and the same attention laid out contiguously for
torch's peers (:class:`~kvattn.benchmarking.torch_peers.PeerInputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .._console import FUNCTION_KEYS
from .torch_peers import PeerInputs


@dataclass
class Problem:
    key: str  # FUNCTION_KEYS
    function: str  # the table's name
    shape: str
    run: Callable[[], torch.Tensor]  # kvattn's call
    common: Callable[[torch.Tensor], torch.Tensor]  # kvattn's output as [B, Hq, Lq, Dv]
    work: float
    unit: str  # "B" (bytes: GB/s) or "FLOP" (TFLOP/s)
    peers: Optional[PeerInputs] = None
    peer_note: str = ""  # why there are no peers


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _randn(shape, dtype, device, seed: int) -> torch.Tensor:
    """Normal values drawn on ``device`` itself (the GPU grid's ~1.5 GB would take the host seconds)."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=dtype)


def _paged_pool(batch: int, length: int, heads: int, dim: int, page: int, layout: str, dtype, device, seed: int,
                planes: int = 1):
    """``planes`` pools of pages ``[P, page, H, dim]`` (NHD) or ``[P, H, page, dim]`` (HND) and one
    table of each request's pages in a random order (``[B, pages a request]`` int32; one spare page)."""
    per = -(-length // page)
    total = batch * per + 1
    shape = (total, page, heads, dim) if layout == "NHD" else (total, heads, page, dim)
    pools = [_randn(shape, dtype, device, seed + i) for i in range(planes)]
    table = torch.randperm(total, generator=_gen(seed + planes))[: batch * per].view(batch, per).to(torch.int32)
    return pools, table.to(device)


def _gather(pages: torch.Tensor, table: torch.Tensor, length: int, layout: str) -> torch.Tensor:
    """Each request's tokens from its pages, contiguous ``[B, H, L, dim]``."""
    rows = pages[table.long()]  # [B, per, page, H, d] (NHD) or [B, per, H, page, d]
    b, per = rows.shape[:2]
    if layout == "NHD":
        rows = rows.reshape(b, per * rows.shape[2], rows.shape[3], rows.shape[4]).transpose(1, 2)
    else:
        rows = rows.transpose(1, 2).reshape(b, rows.shape[2], per * rows.shape[3], rows.shape[4])
    return rows[:, :, :length].contiguous()


def sizes(device: torch.device) -> dict:
    """The grid: GPU shapes a serving engine meets; CPU shapes small enough to finish in seconds."""
    if device.type == "cuda":
        return dict(decode=(32, 4096, 32, 8, 128, 16), single=(32768, 32, 128), mla=(32, 4096, 128, 64),
                    prefill=(4, 2048, 32, 8, 128, 64), workspace=128 << 20)
    return dict(decode=(2, 64, 4, 2, 64, 16), single=(128, 4, 64), mla=(2, 64, 16, 16),
                prefill=(2, 32, 4, 2, 64, 16), workspace=8 << 20)


def build(key: str, device: torch.device) -> Problem:
    """The problem of one function on ``device`` (inputs allocated here)."""
    import kvattn

    dt = torch.bfloat16
    grid = sizes(device)
    ws = torch.zeros(grid["workspace"], dtype=torch.uint8, device=device)
    if key in ("batch_decode", "xqa"):
        b, n, hq, hkv, d, page = grid["decode"]
        (k, v), table = _paged_pool(b, n, hkv, d, page, "NHD", dt, device, seed=1, planes=2)
        lens = torch.full((b,), n, dtype=torch.int32, device=device)
        q = _randn((b, hq, d), dt, device, seed=3)
        work = b * n * hkv * d * 2 * 2 + 2 * q.numel() * 2
        shape = f"{b} requests x {n} tokens, {hq}/{hkv} heads, D {d}, bf16 pages of {page}"
        if key == "batch_decode":
            out = torch.empty_like(q)

            def run():
                return kvattn.decode.xqa_batch_decode_with_kv_cache(
                    query=q, kv_cache=(k, v), workspace_buffer=ws, block_tables=table, seq_lens=lens,
                    max_seq_len=n, bmm1_scale=d ** -0.5, out=out)

            peers = PeerInputs(q.view(b, hq, 1, d), _gather(k, table, n, "NHD"), _gather(v, table, n, "NHD"),
                               d ** -0.5, causal=False)
            return Problem(key, "batch decode", shape, run, lambda o: o.view(b, hq, 1, d), work, "B", peers)
        q1 = q.view(b, 1, hq, d)
        out1 = torch.empty_like(q1)
        lens1 = lens.view(b, 1)
        sem = torch.zeros(64, dtype=torch.uint32, device=device)
        k_pool, v_pool = k.view(-1, d), v.view(-1, d)  # the seed's flat pools of head vectors

        def run_xqa():
            kvattn.xqa.xqa(q=q1, k_cache=k_pool, v_cache=v_pool, page_table=table, seq_lens=lens1, output=out1,
                           workspace_buffer=ws, semaphores=sem, num_kv_heads=hkv, page_size=page)
            return out1

        return Problem(key, "xqa", shape, run_xqa, lambda o: o.view(b, hq, 1, d), work, "B",
                       peer_note="same work as batch decode: see its peers")
    if key == "single_decode":
        n, h, d = grid["single"]
        q = _randn((h, d), dt, device, seed=4)
        k = _randn((n, h, d), dt, device, seed=5)
        v = _randn((n, h, d), dt, device, seed=6)

        def run():
            return kvattn.decode.single_decode_with_kv_cache(q=q, k=k, v=v)

        peers = PeerInputs(q.view(1, h, 1, d), k.transpose(0, 1).unsqueeze(0).contiguous(),
                           v.transpose(0, 1).unsqueeze(0).contiguous(), d ** -0.5, causal=False)
        return Problem(key, "single decode", f"{n} tokens, {h} heads, D {d}, bf16", run,
                       lambda o: o.view(1, h, 1, d), 2 * n * h * d * 2 + 2 * q.numel() * 2, "B", peers)
    if key == "mla":
        b, n, hq, page = grid["mla"]
        (cache,), table = _paged_pool(b, n, 1, 576, page, "NHD", dt, device, seed=7)
        cache = cache[:, :, 0]  # [P, page, 576]
        lens = torch.full((b,), n, dtype=torch.int32, device=device)
        q = _randn((b, 1, hq, 576), dt, device, seed=8)
        out = torch.empty(b, hq, 512, dtype=dt, device=device)
        scale = 192 ** -0.5  # DeepSeek's 1 / sqrt(128 + 64)

        def run():
            return kvattn.mla.xqa_batch_decode_with_kv_cache_mla(
                query=q, kv_cache=cache, workspace_buffer=ws, qk_nope_head_dim=128, kv_lora_rank=512,
                qk_rope_head_dim=64, block_tables=table, seq_lens=lens, max_seq_len=n, out=out, bmm1_scale=scale)

        rows = _gather(cache.unsqueeze(2), table, n, "NHD")  # [B, 1, L, 576]
        peers = PeerInputs(q.transpose(1, 2).contiguous(), rows, rows[..., :512], scale, causal=False,
                           flex="not tried: FlexAttention does not compile 576-wide heads")
        return Problem(key, "MLA decode", f"{b} requests x {n} tokens, {hq} heads, bf16 pages of {page}", run,
                       lambda o: o.view(b, hq, 1, 512), 2.0 * hq * b * n * (576 + 512), "FLOP", peers)
    if key == "prefill":
        b, n, hq, hkv, d, page = grid["prefill"]
        (k, v), table = _paged_pool(b, n, hkv, d, page, "HND", dt, device, seed=9, planes=2)
        q = _randn((b * n, hq, d), dt, device, seed=11)
        lens = torch.full((b,), n, dtype=torch.int32, device=device)
        cum = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=device)
        out = torch.empty_like(q)

        def run():
            return kvattn.prefill.trtllm_batch_context_with_kv_cache(
                query=q, kv_cache=(k, v), workspace_buffer=ws, block_tables=table, seq_lens=lens, max_q_len=n,
                max_kv_len=n, bmm1_scale=d ** -0.5, bmm2_scale=1.0, batch_size=b, cum_seq_lens_q=cum,
                cum_seq_lens_kv=cum, out=out, kv_layout="HND")

        peers = PeerInputs(q.view(b, n, hq, d).transpose(1, 2).contiguous(), _gather(k, table, n, "HND"),
                           _gather(v, table, n, "HND"), d ** -0.5, causal=True)
        flops = 4.0 * d * hq * b * (n * (n + 1) / 2)  # causal (query, key) pairs
        return Problem(key, "prefill", f"{b} requests x {n} new tokens (causal), {hq}/{hkv} heads, D {d}, "
                       f"bf16 pages of {page}", run, lambda o: o.view(b, n, hq, d).transpose(1, 2), flops,
                       "FLOP", peers)
    raise ValueError(f"unknown function {key!r}; expected one of {FUNCTION_KEYS}")
