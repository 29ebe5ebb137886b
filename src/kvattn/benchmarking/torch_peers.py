"""``kvattn bench``'s peers: torch's ``scaled_dot_product_attention`` under one backend (flash, cuDNN,
memory-efficient) and FlexAttention (``torch.compile``), on the problem's values laid out
contiguously, ``[B, H, L, D]``. Their K/V are gathered from the pages before timing, so their times
leave out the copy a paged cache would pay on every call. Without causality the query heads of a KV
head are folded into query rows (K/V read once per KV head on every backend). A backend that refuses
the inputs raises :class:`~kvattn.benchmarking.availability.NotAvailable`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .availability import NotAvailable, try_backend
from .measure import Variant

SDPA_BACKENDS = ("flash", "cudnn", "efficient")


@dataclass
class PeerInputs:
    """What the peers compute: ``softmax(scale * q k^T) v`` with ``q [B, Hq, Lq, D]``,
    ``k [B, Hkv, L, D]``, ``v [B, Hkv, L, Dv]`` (contiguous), causal aligned to the last query."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float
    causal: bool
    flex: str = ""  # why FlexAttention is not tried here (empty: tried)


def sdpa(p: PeerInputs, backend: str) -> Variant:
    """``sdpa-<backend>``: one SDPA call under that backend alone; output unfolded to ``[B, Hq, Lq, Dv]``."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    enum = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]

    def context():
        return sdpa_kernel([enum])

    b, hq, lq, d = p.q.shape
    hkv, dv = p.k.shape[1], p.v.shape[-1]
    g = hq // hkv
    note = ""
    if not p.causal:
        # Every key is visible: fold each KV head's query heads into query rows, K/V read once a head.
        q, k, v, kw = p.q.reshape(b, hkv, g * lq, d), p.k, p.v, {}

        def unfold(o):
            return o.reshape(b, hq, lq, dv)
    else:  # causal with as many queries as keys (prefill): is_causal's top-left alignment is exact
        assert lq == p.k.shape[2], "causal peers are built with Lq == L"
        q, k, v, kw = p.q, p.k, p.v, {"is_causal": True, "enable_gqa": g > 1}

        def unfold(o):
            return o

    def call(q=q, k=k, v=v, kw=kw):
        return F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kw)

    try:
        try_backend(call, context)
    except NotAvailable:
        if not kw.get("enable_gqa"):
            raise
        # This backend has no GQA: K/V with each head repeated for its query heads (outside the timing).
        k, v = p.k.repeat_interleave(g, dim=1), p.v.repeat_interleave(g, dim=1)
        kw = {"is_causal": True}
        try_backend(lambda: F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kw), context)
        note = "K/V heads repeated (no native GQA)"

        def call(q=q, k=k, v=v, kw=kw):
            return F.scaled_dot_product_attention(q, k, v, scale=p.scale, **kw)

    return Variant(f"sdpa-{backend}", "sdpa", [call], note=note, unfold=unfold, context=context)


_compiled_flex = None


def flex(p: PeerInputs) -> Variant:
    """``flex``: FlexAttention compiled once a process (``dynamic=False``), GQA native, a block mask
    for causality."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    compiled = _compiled_flex
    b, hq, lq, _ = p.q.shape
    n = p.k.shape[2]
    gqa = hq != p.k.shape[1]
    mask = None
    if p.causal:
        def causal(bi, hi, qi, ki):
            return ki - qi <= n - lq

        mask = create_block_mask(causal, B=None, H=None, Q_LEN=lq, KV_LEN=n, device=p.q.device)

    def call():
        return compiled(p.q, p.k, p.v, block_mask=mask, scale=p.scale, enable_gqa=gqa)

    return Variant("flex", "flex", [call])
