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
  lower right (:func:`causal_kwargs`).
- mixed prefill batch (``AttnSpec.q_lens``): one SDPA call per request, ``[1, Hq, q_lens[b], D]``
  over exactly its ``lens[b]`` keys, in one timed callable (a Python loop, captured whole in the
  CUDA graph). The other form a caller has, one call on a padded ``[B, Hq, max Lq, D]`` x
  ``[B, Hkv, max L, D]`` batch with a dense mask (flash takes none), computes ``B x max Lq x max L``
  pairs, a dense mask leaving no tile to skip: 18x the causal pairs of the grid's mixed batch, so
  it would time the padding rather than the attention. ``+gather``
  gathers each request's K/V from the pages (one indexing op per tensor and request, from a token
  index built once, as an engine's slot mapping); neither variant times copying the per-request
  outputs into one packed tensor.

Lower-right causality when a request has fewer query rows than keys (chunked prefill, prefix
caching): row ``i`` of ``Lq`` sees keys ``j <= L - Lq + i``. SDPA's ``is_causal`` is aligned to the
upper left, so it serves only ``Lq == L``. Otherwise flash and efficient take torch's
``causal_lower_right`` bias, which dispatches to their native lower-right causal kernels
(``torch/nn/attention/bias.py``, ``CausalBias._dispatch``); that dispatch never reaches cuDNN: with
only cuDNN enabled it materialises a boolean ``[Lq, L]`` mask on every call, which SDPA converts to
an additive one on every call. So the cuDNN variants get that additive mask directly, built once
outside the timed call (:func:`lower_right_bias`): cuDNN then runs exactly what SDPA would hand it,
without two mask-building kernels inside the timing.
"""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F

from kvattn.benchmarking.availability import NotAvailable, try_backend
from kvattn.benchmarking.inputs import apply_rope, gather_pages, gather_tokens, token_index
from kvattn.benchmarking.measure import Variant

from .problems import AttnSpec

BACKENDS = ("flash", "cudnn", "efficient")
FOLD_MAX_ROWS = 16  # fold query heads into rows below this many query tokens per request
# The additive value SDPA itself writes for a False entry of a boolean mask it hands to cuDNN
# (finite, where other backends get -inf): exp() of it is 0 in float32 for any row that sees a key.
CUDNN_MASKED = -65504.0


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


def lower_right_bias(q_len: int, kv_len: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask ``[1, 1, q_len, kv_len]``: 0 where row ``i`` sees key ``j <= kv_len - q_len + i``,
    :data:`CUDNN_MASKED` elsewhere (the cuDNN form of lower-right causality)."""
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(kv_len, device=device)[None, :]
    allowed = j <= (kv_len - q_len) + i
    bias = torch.zeros(q_len, kv_len, dtype=dtype, device=device).masked_fill_(~allowed, CUDNN_MASKED)
    return bias.view(1, 1, q_len, kv_len)


def causal_kwargs(q_len: int, kv_len: int, backend: str, dtype: torch.dtype, device) -> dict:
    """SDPA's causal argument for ``q_len`` rows over ``kv_len`` keys, aligned at the last key."""
    if q_len == kv_len:
        return {"is_causal": True}
    if backend == "cudnn":
        return {"attn_mask": lower_right_bias(q_len, kv_len, dtype, device)}
    from torch.nn.attention.bias import causal_lower_right

    return {"attn_mask": causal_lower_right(q_len, kv_len)}


def dense_kv(spec: AttnSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query ``[B, Hq, Lq, D]`` and contiguous-per-request K/V ``[B, Hkv, S, D]`` in bf16 (RoPE applied)."""
    if spec.q_lens is not None:
        raise ValueError("dense_kv: a mixed batch has no [B, Hq, Lq, D] form (see ragged_kv)")
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


def ragged_kv(spec: AttnSpec, index, expand_kv: bool) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A mixed batch, per request: query ``[1, Hq, q_lens[b], D]`` and its exact K/V
    ``[1, Hkv (or Hq expanded), lens[b], D]`` in bf16; ``index`` is ``token_index`` of the pools."""
    p = spec.pools
    g = spec.q4.shape[1] // spec.num_kv_heads
    out = []
    for q, (pages, rows) in zip(spec.q_parts(), index, strict=True):
        k = gather_tokens(p.k, pages, rows, p.layout)
        v = gather_tokens(p.v, pages, rows, p.layout)
        if k.dtype != torch.bfloat16:
            k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
        if q.dtype != torch.bfloat16:
            q = q.to(torch.bfloat16)
        if expand_kv and g > 1:
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        out.append((q, k, v))
    return out


def _ragged_kwargs(spec: AttnSpec, backend: str, expand_kv: bool) -> list[dict]:
    dev = spec.q4.device
    gqa = spec.q4.shape[1] != spec.num_kv_heads and not expand_kv
    kws = []
    for q_len, kv_len in zip(spec.q_lens, spec.lens, strict=True):
        kw = {"scale": spec.scale, **causal_kwargs(q_len, kv_len, backend, torch.bfloat16, dev)}
        if gqa:
            kw["enable_gqa"] = True
        kws.append(kw)
    return kws


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


def _static_args(spec: AttnSpec, kv_len: int, expand_kv: bool, backend: str) -> tuple[dict, object]:
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
        kw.update(causal_kwargs(lq, kv_len, backend, torch.bfloat16, dev))
    else:
        pos = lens[:, None] - lq + torch.arange(lq, device=dev)[None, :]
        kw["attn_mask"] = (torch.arange(kv_len, device=dev)[None, None, :] <= pos[:, :, None])[:, None]
    return kw, (lambda o: o)


def _kv_len(spec: AttnSpec) -> int:
    if spec.pools is not None:
        return spec.pools.width * spec.pools.page_size
    return spec.k4.shape[2]


def _uses_gqa(spec: AttnSpec) -> bool:
    """Whether the formulation passes ``enable_gqa`` (so expanding K/V heads is the fallback)."""
    folded = spec.q_lens is None and spec.q4.shape[2] < FOLD_MAX_ROWS
    return spec.q4.shape[1] != spec.num_kv_heads and not folded


def attention_fn(spec: AttnSpec, backend: str, expand_kv: bool = False):
    """``(fn, unfold)``: ``fn()`` runs the attention alone on tensors prepared here, once.

    The same callable runs on a CPU with no backend selected (SDPA's math backend there), which is
    how the tests check each backend's formulation against kvattn.
    """
    if spec.q_lens is not None:
        data = ragged_kv(spec, token_index(spec.pools.tables, spec.lens, spec.pools.page_size), expand_kv)
        kws = _ragged_kwargs(spec, backend, expand_kv)
        return (lambda: [F.scaled_dot_product_attention(*d, **kw) for d, kw in zip(data, kws)]), (lambda o: o)
    kw, unfold = _static_args(spec, _kv_len(spec), expand_kv, backend)
    q, k, v = _data(spec, expand_kv)
    return (lambda: F.scaled_dot_product_attention(q, k, v, **kw)), unfold


def prep_fn(spec: AttnSpec, backend: str, expand_kv: bool = False):
    """``(fn, unfold)``: ``fn()`` prepares the inputs (gather, cast, RoPE) and runs the attention."""
    if spec.q_lens is not None:
        index = token_index(spec.pools.tables, spec.lens, spec.pools.page_size)
        kws = _ragged_kwargs(spec, backend, expand_kv)
        return (lambda: [F.scaled_dot_product_attention(*d, **kw)
                         for d, kw in zip(ragged_kv(spec, index, expand_kv), kws)]), (lambda o: o)
    kw, unfold = _static_args(spec, _kv_len(spec), expand_kv, backend)
    return (lambda: F.scaled_dot_product_attention(*_data(spec, expand_kv), **kw)), unfold


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
    try:
        try_backend(attention_fn(spec, backend, False)[0], ctx)
        return False, ""
    except NotAvailable as first:
        if not _uses_gqa(spec):
            raise
        try_backend(attention_fn(spec, backend, True)[0], ctx)
        return True, f"K/V heads expanded (native GQA not available: {str(first)[:120]})"


def _lower_right(spec: AttnSpec) -> bool:
    """Whether the formulation uses :func:`causal_kwargs` with fewer query rows than keys."""
    if spec.q_lens is not None:
        return any(q != n for q, n in zip(spec.q_lens, spec.lens))
    lq, kv_len = spec.q4.shape[2], _kv_len(spec)
    return lq >= FOLD_MAX_ROWS and lq != kv_len and all(n == kv_len for n in spec.lens)


def _note(spec: AttnSpec, backend: str, note: str) -> str:
    extra = []
    if spec.q_lens is not None:
        extra.append(f"one SDPA call per request ({len(spec.q_lens)} calls)")
    if backend == "cudnn" and _lower_right(spec):
        extra.append("lower-right causal as an additive mask built once")
    return "; ".join(([note] if note else []) + extra)


def _core_variant(specs: list[AttnSpec], backend: str) -> Variant:
    expand, note = _choose_expand(specs, backend)
    fns, unfold = [], None
    for spec in specs:
        fn, unfold = attention_fn(spec, backend, expand)
        fns.append(fn)
    return Variant(f"sdpa-{backend}", "sdpa", fns, note=_note(specs[0], backend, note), unfold=unfold,
                   context=_context(backend))


def _prep_variant(specs: list[AttnSpec], backend: str) -> Variant:
    expand, note = _choose_expand(specs, backend)
    fns, unfold = [], None
    for spec in specs:
        fn, unfold = prep_fn(spec, backend, expand)
        fns.append(fn)
    label = prep_label(specs[0])
    return Variant(f"sdpa-{backend}+{label}", "sdpa", fns, includes=label, note=_note(specs[0], backend, note),
                   unfold=unfold, context=_context(backend), eager=False)
