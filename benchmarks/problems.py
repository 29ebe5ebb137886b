"""Per-shape inputs, the kvattn call on them, and the description the peers work from.

A :class:`Problem` holds one or more input sets (rotated when the data fits in L2); each set has
the kvattn call (output buffer preallocated where the API takes one, so a CUDA graph replays it
without allocating) and an :class:`AttnSpec`: the same attention in peer-friendly terms (query as
``[B, Hq, Lq, D]``, the paged pools or contiguous K/V, lengths, scale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from kvattn.benchmarking import inputs
from kvattn.benchmarking.inputs import PagedPools

from .metrics import MLA_QK_DIM, MLA_V_DIM, Work, work
from .shapes import Shape

# kvattn op names (kvattn.runtime.backend.TRITON_OPS) per suite.
SUITE_OPS = {
    "decode": "batch_decode",
    "spec_decode": "batch_decode",
    "single_decode": "single_decode",
    "prefill": "context",
    "mla": "mla_decode",
}
MLA_SCALE = 1.0 / math.sqrt(128 + 64)  # DeepSeek: qk_nope_head_dim + qk_rope_head_dim

_workspaces: dict[tuple[str, int], torch.Tensor] = {}


def workspace(device: torch.device, mib: int) -> torch.Tensor:
    """One zeroed uint8 workspace per device, shared by every call (as an engine would)."""
    key = (str(device), mib)
    if key not in _workspaces:
        _workspaces.clear()
        _workspaces[key] = torch.zeros(mib << 20, dtype=torch.uint8, device=device)
    return _workspaces[key]


@dataclass
class AttnSpec:
    """One input set's attention, as the peers see it.

    ``q4`` ``[B, Hq, Lq, Dqk]`` (a view of kvattn's query); ``pools`` for paged suites, or ``k4``/
    ``v4`` ``[1, H, L, D]`` views of contiguous K/V (single decode). Query row ``i`` of request ``b``
    sits at position ``lens[b] - q_len + i`` and sees keys ``j <= position`` (decode: all keys).
    ``to_common`` maps a peer output ``[B, Hq, Lq, Dv]`` to kvattn's output layout.

    A mixed prefill batch sets ``q_lens`` (each request's query rows; ``q_len`` is then their
    maximum): ``q4`` is the packed query as ``[1, Hq, sum(q_lens), Dqk]``, :meth:`q_parts` its
    per-request ``[1, Hq, q_lens[b], Dqk]`` views, and ``to_common`` takes the list of per-request
    outputs ``[1, Hq, q_lens[b], Dv]``.

    ``native`` holds kvattn's own inputs of the call by name (its query, lengths, scale...): the
    FlashInfer peers take the same tensors, FlashInfer's signatures being kvattn's.
    """

    q4: torch.Tensor
    pools: PagedPools | None
    k4: torch.Tensor | None
    v4: torch.Tensor | None
    num_kv_heads: int
    lens: list[int]
    q_len: int
    scale: float
    v_dim: int
    rope: bool
    to_common: Callable[[torch.Tensor], torch.Tensor]
    q_lens: list[int] | None = None
    native: dict = field(default_factory=dict)

    def q_parts(self) -> list[torch.Tensor]:
        """Per-request query views ``[1, Hq, q_lens[b], Dqk]`` of a mixed batch's packed rows."""
        if self.q_lens is None:
            raise ValueError("q_parts: this spec has one query length (q4 is [B, Hq, Lq, D])")
        starts = [0]
        for n in self.q_lens:
            starts.append(starts[-1] + n)
        return [self.q4[:, :, s : s + n] for s, n in zip(starts, self.q_lens)]


@dataclass
class InputSet:
    kvattn: Callable[[], torch.Tensor]
    spec: AttnSpec | None  # None: a shape no peer computes (peers=False)


@dataclass
class Problem:
    shape: Shape
    op: str
    sets: list[InputSet]
    work: Work


def num_sets(nbytes: float, l2_bytes: int, max_sets: int = 4) -> int:
    """Input sets to rotate: enough that the sets together exceed twice the L2 size."""
    if nbytes >= 2 * l2_bytes:
        return 1
    return max(2, min(max_sets, math.ceil(2 * l2_bytes / max(nbytes, 1.0))))


def build(shape: Shape, device: torch.device, *, l2_bytes: int, workspace_mib: int, seed: int = 0) -> Problem:
    w = work(shape)
    n = num_sets(w.bytes, l2_bytes)
    builder = {
        "decode": _decode_set,
        "spec_decode": _decode_set,
        "single_decode": _single_set,
        "prefill": _prefill_set,
        "mla": _mla_set,
    }[shape.suite]
    ws = workspace(device, workspace_mib)
    sets = [builder(shape, device, inputs.generator(device, seed + i), ws) for i in range(n)]
    return Problem(shape, SUITE_OPS[shape.suite], sets, w)


def _paged_spec(q: torch.Tensor, pools, shape: Shape, lens: list, q_len: int, scale: float) -> AttnSpec:
    """The peers' view of a paged problem whose ``q [B * q_len, Hq, D]`` rows are the last ``q_len``
    tokens of each request (decode, speculative decode, prefill)."""
    b, hq, d = shape.batch, shape.num_qo_heads, shape.head_dim
    return AttnSpec(
        q4=q.view(b, q_len, hq, d).transpose(1, 2), pools=pools, k4=None, v4=None,
        num_kv_heads=shape.num_kv_heads, lens=lens, q_len=q_len, scale=scale, v_dim=d, rope=False,
        to_common=lambda o: o.transpose(1, 2).reshape(b * q_len, hq, d),
    )


def _decode_set(shape: Shape, device, gen, ws) -> InputSet:
    import kvattn

    b, q_len, hq, d = shape.batch, shape.q_len, shape.num_qo_heads, shape.head_dim
    lens = shape.seq_lens()
    pools = inputs.make_pools(lens, num_heads=shape.num_kv_heads, head_dim=d, page_size=shape.page_size,
                              layout=shape.layout, dtype=inputs.torch_dtype(shape.kv_dtype), device=device, gen=gen)
    q_lens = shape.q_lens()
    q = inputs.randn((sum(q_lens), hq, d), torch.bfloat16, device, gen)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(d)
    max_len = max(lens)
    cu = None
    if shape.ragged_drafts:  # packed rows, request b's at cu[b] : cu[b + 1]
        cu = torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)

    def call():
        return kvattn.decode.xqa_batch_decode_with_kv_cache(
            q, (pools.k, pools.v), ws, pools.tables, pools.seq_lens, max_len,
            bmm1_scale=scale, bmm2_scale=1.0, out=out, kv_layout=shape.layout, q_len_per_req=q_len,
            kv_cache_sf=None if pools.k_sf is None else (pools.k_sf, pools.v_sf), q_cu_seq_lens=cu,
        )

    if shape.ragged_drafts:  # (ragged drafts: no peer formulation, the shape is kvattn's alone)
        return InputSet(call, None)
    spec = _paged_spec(q, pools, shape, lens, q_len, scale)
    spec.native = dict(q=q, max_len=max_len, scale=scale)
    return InputSet(call, spec)


def _single_set(shape: Shape, device, gen, ws) -> InputSet:
    import kvattn

    hq, hkv, d, n = shape.num_qo_heads, shape.num_kv_heads, shape.head_dim, shape.kv_len
    kv_dtype = inputs.torch_dtype(shape.kv_dtype)
    q = inputs.randn((hq, d), torch.bfloat16, device, gen)
    k = inputs.randn((n, hkv, d), kv_dtype, device, gen)
    v = inputs.randn((n, hkv, d), kv_dtype, device, gen)
    mode = shape.pos_encoding_mode

    def call():
        return kvattn.decode.single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode=mode)

    spec = AttnSpec(
        q4=q.view(1, hq, 1, d), pools=None, k4=k.unsqueeze(0).transpose(1, 2), v4=v.unsqueeze(0).transpose(1, 2),
        num_kv_heads=hkv, lens=[n], q_len=1, scale=1.0 / math.sqrt(d), v_dim=d, rope=mode == "ROPE_LLAMA",
        to_common=lambda o: o.reshape(hq, d), native=dict(q=q, k=k, v=v, pos_encoding_mode=mode),
    )
    return InputSet(call, spec)


def _prefill_set(shape: Shape, device, gen, ws) -> InputSet:
    import kvattn

    b, lq, hq, d = shape.batch, shape.q_len, shape.num_qo_heads, shape.head_dim
    lens = shape.seq_lens()
    q_lens = shape.q_lens()
    rows = sum(q_lens)
    pools = inputs.make_pools(lens, num_heads=shape.num_kv_heads, head_dim=d, page_size=shape.page_size,
                              layout=shape.layout, dtype=inputs.torch_dtype(shape.kv_dtype), device=device, gen=gen)
    q = inputs.randn((rows, hq, d), inputs.torch_dtype(shape.q_dtype), device, gen)
    out = torch.empty((rows, hq, d), dtype=torch.bfloat16, device=device)
    cum_q = torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    cum_kv = torch.tensor([0] + lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    scale = 1.0 / math.sqrt(d)
    max_kv = max(lens)

    def call():
        return kvattn.prefill.trtllm_batch_context_with_kv_cache(
            q, (pools.k, pools.v), ws, pools.tables, pools.seq_lens, lq, max_kv, scale, 1.0, b, cum_q, cum_kv,
            out=out, kv_layout=shape.layout,
            kv_cache_sf=None if pools.k_sf is None else (pools.k_sf, pools.v_sf), causal=shape.causal,
        )

    native = dict(q=q, cum_q=cum_q, scale=scale)
    if not shape.reqs:
        spec = _paged_spec(q, pools, shape, lens, lq, scale)
        spec.native = native
        return InputSet(call, spec)
    spec = AttnSpec(
        q4=q.view(1, rows, hq, d).transpose(1, 2), pools=pools, k4=None, v4=None,
        num_kv_heads=shape.num_kv_heads, lens=lens, q_len=lq, scale=scale, v_dim=d, rope=False,
        to_common=lambda outs: torch.cat([o.transpose(1, 2).reshape(-1, hq, o.shape[-1]) for o in outs]),
        q_lens=q_lens, native=native,
    )
    return InputSet(call, spec)


def _mla_set(shape: Shape, device, gen, ws) -> InputSet:
    import kvattn

    b, hq, q_len = shape.batch, shape.num_qo_heads, shape.q_len
    lens = shape.seq_lens()
    dtype = inputs.torch_dtype(shape.kv_dtype)
    pools = inputs.make_pools(lens, num_heads=1, head_dim=MLA_QK_DIM, page_size=shape.page_size, layout="NHD",
                              dtype=dtype, device=device, gen=gen, mla=True)
    q = inputs.randn((b, q_len, hq, MLA_QK_DIM), inputs.torch_dtype(shape.q_dtype), device, gen)
    # [B, Hq, 512] for one token a request, [B, Q, Hq, 512] for several (multi-token prediction)
    out_shape = (b, q_len, hq, MLA_V_DIM) if q_len > 1 else (b, hq, MLA_V_DIM)
    out = torch.empty(out_shape, dtype=torch.bfloat16, device=device)
    max_len = max(lens)

    def call():
        return kvattn.mla.xqa_batch_decode_with_kv_cache_mla(
            q, pools.k, ws, 128, MLA_V_DIM, 64, pools.tables, pools.seq_lens, max_len,
            out=out, bmm1_scale=MLA_SCALE, bmm2_scale=1.0,
        )

    spec = AttnSpec(
        q4=q.transpose(1, 2), pools=pools, k4=None, v4=None, num_kv_heads=1, lens=lens, q_len=q_len,
        scale=MLA_SCALE, v_dim=MLA_V_DIM, rope=False, to_common=lambda o: o.transpose(1, 2).reshape(out_shape),
        native=dict(q=q),
    )
    return InputSet(call, spec)
