"""``kvattn bench``'s problems: one shape per public function (GPU-sized on CUDA, tiny on a CPU), random
values drawn on the device, each request's pages in a random order (:mod:`~kvattn.benchmarking.inputs`,
as the repository's registry draws them), and the same attention laid out contiguously for torch's
peers (:class:`~kvattn.benchmarking.torch_peers.PeerInputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .._console import FUNCTION_KEYS
from . import inputs
from .torch_peers import PeerInputs

DTYPE = torch.bfloat16
MLA_SCALE = 192 ** -0.5  # DeepSeek's 1 / sqrt(128 + 64)


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


def sizes(device: torch.device) -> dict:
    """The grid: GPU shapes a serving engine meets; CPU shapes small enough to finish in seconds."""
    if device.type == "cuda":
        return dict(decode=(32, 4096, 32, 8, 128, 16), single=(32768, 32, 128), mla=(32, 4096, 128, 64),
                    prefill=(4, 2048, 32, 8, 128, 64), workspace=128 << 20)
    return dict(decode=(2, 64, 4, 2, 64, 16), single=(128, 4, 64), mla=(2, 64, 16, 16),
                prefill=(2, 32, 4, 2, 64, 16), workspace=8 << 20)


def _contiguous(pool: torch.Tensor, pools: inputs.PagedPools) -> torch.Tensor:
    """Each request's tokens from its pages, contiguous ``[B, H, L, D]`` (all requests ``L`` long)."""
    return inputs.gather_pages(pool, pools.tables, pools.layout)[:, :, : pools.lens[0]].contiguous()


def _decode(key: str, grid: dict, ws: torch.Tensor, device: torch.device) -> Problem:
    """Batch decode and xqa (the same attention; xqa on the flat pools of head vectors)."""
    import kvattn

    b, n, hq, hkv, d, page = grid["decode"]
    gen = inputs.generator(device, 1)
    pools = inputs.make_pools([n] * b, num_heads=hkv, head_dim=d, page_size=page, layout="NHD", dtype=DTYPE,
                              device=device, gen=gen)
    k, v, table, lens = pools.k, pools.v, pools.tables, pools.seq_lens
    q = inputs.randn((b, hq, d), DTYPE, device, gen)
    work = b * n * hkv * d * 2 * 2 + 2 * q.numel() * 2
    shape = f"{b} requests x {n} tokens, {hq}/{hkv} heads, D {d}, bf16 pages of {page}"
    if key == "batch_decode":
        out = torch.empty_like(q)

        def run():
            return kvattn.decode.xqa_batch_decode_with_kv_cache(
                query=q, kv_cache=(k, v), workspace_buffer=ws, block_tables=table, seq_lens=lens,
                max_seq_len=n, bmm1_scale=d ** -0.5, out=out)

        peers = PeerInputs(q.view(b, hq, 1, d), _contiguous(k, pools), _contiguous(v, pools), d ** -0.5, causal=False)
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


def _single(key: str, grid: dict, ws: torch.Tensor, device: torch.device) -> Problem:
    import kvattn

    n, h, d = grid["single"]
    gen = inputs.generator(device, 4)
    q = inputs.randn((h, d), DTYPE, device, gen)
    k = inputs.randn((n, h, d), DTYPE, device, gen)
    v = inputs.randn((n, h, d), DTYPE, device, gen)

    def run():
        return kvattn.decode.single_decode_with_kv_cache(q=q, k=k, v=v)

    peers = PeerInputs(q.view(1, h, 1, d), k.transpose(0, 1).unsqueeze(0).contiguous(),
                       v.transpose(0, 1).unsqueeze(0).contiguous(), d ** -0.5, causal=False)
    return Problem(key, "single decode", f"{n} tokens, {h} heads, D {d}, bf16", run,
                   lambda o: o.view(1, h, 1, d), 2 * n * h * d * 2 + 2 * q.numel() * 2, "B", peers)


def _mla(key: str, grid: dict, ws: torch.Tensor, device: torch.device) -> Problem:
    import kvattn

    b, n, hq, page = grid["mla"]
    gen = inputs.generator(device, 7)
    pools = inputs.make_pools([n] * b, num_heads=1, head_dim=576, page_size=page, layout="NHD", dtype=DTYPE,
                              device=device, gen=gen, mla=True)
    cache, table, lens = pools.k, pools.tables, pools.seq_lens  # cache [P, page, 576]
    q = inputs.randn((b, 1, hq, 576), DTYPE, device, gen)
    out = torch.empty(b, hq, 512, dtype=DTYPE, device=device)

    def run():
        return kvattn.mla.xqa_batch_decode_with_kv_cache_mla(
            query=q, kv_cache=cache, workspace_buffer=ws, qk_nope_head_dim=128, kv_lora_rank=512,
            qk_rope_head_dim=64, block_tables=table, seq_lens=lens, max_seq_len=n, out=out, bmm1_scale=MLA_SCALE)

    rows = _contiguous(cache, pools)  # [B, 1, L, 576]
    peers = PeerInputs(q.transpose(1, 2).contiguous(), rows, rows[..., :512], MLA_SCALE, causal=False,
                       flex="not tried: FlexAttention does not compile 576-wide heads")
    return Problem(key, "MLA decode", f"{b} requests x {n} tokens, {hq} heads, bf16 pages of {page}", run,
                   lambda o: o.view(b, hq, 1, 512), 2.0 * hq * b * n * (576 + 512), "FLOP", peers)


def _prefill(key: str, grid: dict, ws: torch.Tensor, device: torch.device) -> Problem:
    import kvattn

    b, n, hq, hkv, d, page = grid["prefill"]
    gen = inputs.generator(device, 9)
    pools = inputs.make_pools([n] * b, num_heads=hkv, head_dim=d, page_size=page, layout="HND", dtype=DTYPE,
                              device=device, gen=gen)
    k, v, table, lens = pools.k, pools.v, pools.tables, pools.seq_lens
    q = inputs.randn((b * n, hq, d), DTYPE, device, gen)
    cum = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device=device)
    out = torch.empty_like(q)

    def run():
        return kvattn.prefill.trtllm_batch_context_with_kv_cache(
            query=q, kv_cache=(k, v), workspace_buffer=ws, block_tables=table, seq_lens=lens, max_q_len=n,
            max_kv_len=n, bmm1_scale=d ** -0.5, bmm2_scale=1.0, batch_size=b, cum_seq_lens_q=cum,
            cum_seq_lens_kv=cum, out=out, kv_layout="HND")

    peers = PeerInputs(q.view(b, n, hq, d).transpose(1, 2).contiguous(), _contiguous(k, pools),
                       _contiguous(v, pools), d ** -0.5, causal=True)
    flops = 4.0 * d * hq * b * (n * (n + 1) / 2)  # causal (query, key) pairs
    return Problem(key, "prefill", f"{b} requests x {n} new tokens (causal), {hq}/{hkv} heads, D {d}, "
                   f"bf16 pages of {page}", run, lambda o: o.view(b, n, hq, d).transpose(1, 2), flops, "FLOP", peers)


BUILDERS = {"batch_decode": _decode, "xqa": _decode, "single_decode": _single, "mla": _mla, "prefill": _prefill}


def build(key: str, device: torch.device) -> Problem:
    """The problem of one function on ``device`` (inputs allocated here)."""
    if key not in BUILDERS:
        raise ValueError(f"unknown function {key!r}; expected one of {FUNCTION_KEYS}")
    grid = sizes(device)
    ws = torch.zeros(grid["workspace"], dtype=torch.uint8, device=device)
    return BUILDERS[key](key, grid, ws, device)
