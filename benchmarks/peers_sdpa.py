"""PyTorch ``scaled_dot_product_attention`` peers: flash, cuDNN and memory-efficient backends.

SDPA has no paged form, so K/V are gathered from the pages into contiguous tensors (fp8 caches are
cast to bf16 on the way; RoPE, for single decode, is applied in PyTorch). Each backend is timed on
the prepared tensors (attention alone) and with the preparation inside the timed call (``+gather``
/ ``+rope``): what a caller without a paged kernel pays.

Formulations:
- few query rows (decode, speculative decode, MLA, single decode): the query heads of one KV head
  become query rows of that head (``[B, Hkv, G * Lq, D]``), so K/V are read once per KV head on
  every backend without GQA support; draft causality and ragged padding come from a boolean mask.
- prefill: ``[B, Hq, Lq, D]`` with ``enable_gqa`` (else K/V heads expanded), causal aligned to the
  lower right (``is_causal`` when Lq = L, else ``causal_lower_right``).
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F

from kvattn.bench import try_backend

from .inputs import apply_rope, gather_pages
from .problems import AttnSpec
from .variant import NotAvailable, Variant

BACKENDS = ("flash", "cudnn", "efficient")
FOLD_MAX_ROWS = 16  # fold query heads into rows below this many query tokens per request


def _backend_enum(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def prep_label(spec: AttnSpec) -> str:
    parts = []
    if spec.pools is not None:
        parts.append("gather")
    if spec.rope:
        parts.append("rope")
    src = spec.pools.k if spec.pools is not None else spec.k4
    if src.dtype != torch.bfloat16 or spec.q4.dtype != torch.bfloat16:
        parts.append("cast")
    return "+".join(parts)


def dense_kv(spec: AttnSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query ``[B, Hq, Lq, D]`` and contiguous-per-request K/V ``[B, Hkv, S, D]`` in bf16 (RoPE applied)."""
    q = spec.q4
    if spec.pools is not None:
        p = spec.pools
        k = gather_pages(p.k, p.tables, p.layout)
        v = gather_pages(p.v, p.tables, p.layout) if p.v is not None else None
    else:
        k, v = spec.k4, spec.v4
    if k.dtype != torch.bfloat16:
        k = k.to(torch.bfloat16)
        v = v.to(torch.bfloat16) if v is not None else None
    if v is None:  # MLA: values are the first v_dim columns of the latent rows
        v = k[..., : spec.v_dim]
    if q.dtype != torch.bfloat16:
        q = q.to(torch.bfloat16)
    if spec.rope:
        n = spec.lens[0]
        q = apply_rope(q, torch.full((1,), n - 1, device=q.device))
        k = apply_rope(k, torch.arange(n, device=q.device))
    return q, k, v


def _data(spec: AttnSpec, expand_kv: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = dense_kv(spec)
    b, hq, lq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    if lq < FOLD_MAX_ROWS:
        q = q.reshape(b, hkv, g, lq, d).reshape(b, hkv, g * lq, d)
    elif expand_kv and g > 1:
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
    return q, k, v


def _static_args(spec: AttnSpec, kv_len: int, expand_kv: bool) -> tuple[dict, object]:
    """SDPA keyword arguments (mask, causality, GQA) and the output unfold, built once."""
    b, hq, lq, _ = spec.q4.shape
    hkv = spec.num_kv_heads
    g = hq // hkv
    dv = spec.v_dim
    dev = spec.q4.device
    lens = torch.tensor(spec.lens, device=dev)
    kw: dict = {"scale": spec.scale}
    if lq < FOLD_MAX_ROWS:
        if lq > 1 or any(n != kv_len for n in spec.lens):
            r = torch.arange(lq, device=dev).repeat(g)  # folded row g * lq + r is draft r
            pos = lens[:, None] - lq + r[None, :]
            kw["attn_mask"] = (torch.arange(kv_len, device=dev)[None, None, :] <= pos[:, :, None])[:, None]
        return kw, (lambda o: o.reshape(b, hkv, g, lq, dv).reshape(b, hq, lq, dv))
    if g > 1 and not expand_kv:
        kw["enable_gqa"] = True
    if all(n == kv_len for n in spec.lens):
        if lq == kv_len:
            kw["is_causal"] = True
        else:
            from torch.nn.attention.bias import causal_lower_right

            kw["attn_mask"] = causal_lower_right(lq, kv_len)
    else:
        pos = lens[:, None] - lq + torch.arange(lq, device=dev)[None, :]
        kw["attn_mask"] = (torch.arange(kv_len, device=dev)[None, None, :] <= pos[:, :, None])[:, None]
    return kw, (lambda o: o)


def _kv_len(spec: AttnSpec) -> int:
    if spec.pools is not None:
        return spec.pools.width * spec.pools.page_size
    return spec.k4.shape[2]


def variants(specs: list[AttnSpec], backends=BACKENDS) -> Iterator[tuple[str, object]]:
    """Yield ``(name, build)`` for each peer variant; ``build()`` returns a Variant or raises."""
    for backend in backends:
        yield f"sdpa-{backend}", (lambda backend=backend: _core_variant(specs, backend))
        label = prep_label(specs[0])
        if label:
            yield f"sdpa-{backend}+{label}", (lambda backend=backend: _prep_variant(specs, backend))


def _context(backend: str):
    from torch.nn.attention import sdpa_kernel

    return lambda: sdpa_kernel([_backend_enum(backend)])


def _choose_expand(specs: list[AttnSpec], backend: str) -> tuple[bool, str]:
    """Native GQA first; if the backend refuses it, K/V with expanded heads."""
    ctx = _context(backend)
    spec = specs[0]
    kw, _ = _static_args(spec, _kv_len(spec), False)
    q, k, v = _data(spec, False)
    try:
        try_backend(lambda: F.scaled_dot_product_attention(q, k, v, **kw), ctx)
        return False, ""
    except NotAvailable as first:
        if "enable_gqa" not in kw:
            raise
        kw2, _ = _static_args(spec, _kv_len(spec), True)
        q, k, v = _data(spec, True)
        try_backend(lambda: F.scaled_dot_product_attention(q, k, v, **kw2), ctx)
        return True, f"K/V heads expanded (native GQA not available: {str(first)[:120]})"


def _core_variant(specs: list[AttnSpec], backend: str) -> Variant:
    expand, note = _choose_expand(specs, backend)
    fns, unfold = [], None
    for spec in specs:
        kw, unfold = _static_args(spec, _kv_len(spec), expand)
        q, k, v = _data(spec, expand)
        fns.append(lambda q=q, k=k, v=v, kw=kw: F.scaled_dot_product_attention(q, k, v, **kw))
    return Variant(f"sdpa-{backend}", "sdpa", fns, note=note, unfold=unfold, context=_context(backend))


def _prep_variant(specs: list[AttnSpec], backend: str) -> Variant:
    expand, note = _choose_expand(specs, backend)
    fns, unfold = [], None
    for spec in specs:
        kw, unfold = _static_args(spec, _kv_len(spec), expand)
        fns.append(lambda spec=spec, kw=kw: F.scaled_dot_product_attention(*_data(spec, expand), **kw))
    label = prep_label(specs[0])
    return Variant(f"sdpa-{backend}+{label}", "sdpa", fns, includes=label, note=note, unfold=unfold,
                   context=_context(backend), eager=False)
