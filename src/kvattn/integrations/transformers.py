"""kvattn as an attention implementation of Hugging Face transformers (v5).

:func:`register` adds one attention function to transformers' ``AttentionInterface`` under two
names, ``"kvattn"`` and ``"paged|kvattn"``. Load (or switch) a model with
``attn_implementation="kvattn"``; the function serves both generation paths:

* **paged** (``model.generate_batch``, transformers' continuous batching): the step's queries run
  through :func:`kvattn.prefill.trtllm_batch_context_with_kv_cache` (prefill chunks, mixed batches)
  or :func:`kvattn.decode.xqa_batch_decode_with_kv_cache` (batches of one new token per request)
  straight over transformers' paged cache: its full-attention layers keep K and V as NHD pages
  (``[pages, page_size, Hkv, D]``) that kvattn reads in place, with page tables derived on the device
  from the cache indices transformers passes. Where transformers has not written the new tokens
  yet (releases whose attention function owns the cache update), :func:`kvattn.append_paged_kv_cache`
  writes them. Sliding-window layers keep a ring buffer whose slot order is not token order;
  for them kvattn attends over the window transformers gathers for the step (see ``docs/transformers.md``).
* **non-paged** (``model.generate`` with transformers' contiguous ``DynamicCache``): the K/V of
  each layer, ``[B, Hkv, L, D]``, are read in place as pages of one token, so the same two
  functions serve prefill and decode without a copy. Calls that need a mask kvattn does not take
  (padded batches, static caches) run transformers' SDPA instead, with a warning once.

Float16 and bfloat16 models run kvattn's kernels on CUDA (its reference on CPU); float32 models run
kvattn's reference implementation (for tests on CPU). GQA/MQA, head dims 64/128/256, sliding
windows and attention sinks (gpt-oss's ``sinks``) are supported; logit soft-capping is not.

Naming: transformers releases up to 5.22 run continuous batching through ``"paged|<name>"``
implementations (``generate_batch`` switches ``"kvattn"`` to ``"paged|kvattn"`` itself); later
releases dropped the prefix and accept only their own implementations for continuous batching, so
:func:`register` also teaches ``generate_batch`` to keep ``"kvattn"`` (a narrow wrapper of
``ContinuousBatchingManager.switch_to_cb_friendly_attn`` that acts only on kvattn's names).

Example
-------
>>> import torch, transformers                                       # doctest: +SKIP
>>> from kvattn.integrations import transformers as kvattn_tf        # doctest: +SKIP
>>> kvattn_tf.register()                                             # doctest: +SKIP
>>> cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
...                                num_key_value_heads=2, head_dim=64)  # doctest: +SKIP
>>> model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)  # doctest: +SKIP
>>> model.set_attn_implementation("kvattn")                          # doctest: +SKIP
>>> out = model.generate_batch([[1, 2, 3], [4, 5]], generation_config=transformers.GenerationConfig(
...     max_new_tokens=8, do_sample=False))                          # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import math
import threading
import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from .. import reference
from .._inputs import HALF_DTYPES, PagedKV, Scale
from ..cache import append_paged_kv_cache, batch_indices_positions
from ..decode import xqa_batch_decode_with_kv_cache
from ..prefill import trtllm_batch_context_with_kv_cache

NAME = "kvattn"
PAGED_NAME = "paged|kvattn"
NAMES = (NAME, PAGED_NAME)
CACHE_KWARG = "kvattn_paged_cache"  # attention kwarg through which the wrapped cache update passes itself
WORKSPACE_BYTES = 128 << 20  # split-KV partials of decode; zeroed once per device

_workspaces: dict = {}
_STAT_KEYS = ("pages", "gathered", "dense", "fallback", "prefill", "decode")
_stats = dict.fromkeys(_STAT_KEYS, 0)


def stats() -> dict:
    """Attention calls served since :func:`reset_stats`, by path: ``pages`` (paged cache read in
    place), ``gathered`` (K/V transformers gathered), ``dense`` (contiguous cache), ``fallback``
    (SDPA), and by kernel: ``prefill``, ``decode``. Host-side counters, for tests and debugging."""
    return dict(_stats)


def reset_stats() -> None:
    for k in _STAT_KEYS:
        _stats[k] = 0

_lock = threading.Lock()
_warned: set = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def workspace(device: torch.device) -> torch.Tensor:
    """The zeroed uint8 workspace kvattn's calls on ``device`` share (every call leaves its counters
    at zero, and the calls of a model run in stream order)."""
    ws = _workspaces.get(device)
    if ws is None:
        with _lock:
            ws = _workspaces.get(device)
            if ws is None:
                size = WORKSPACE_BYTES if device.type == "cuda" else 1 << 16
                ws = _workspaces[device] = torch.zeros(size, dtype=torch.uint8, device=device)
    return ws


# ---------------------------------------------------------------------------------------------
# the attention core: a ragged batch of queries over paged K/V
# ---------------------------------------------------------------------------------------------
def attend_paged(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_q: torch.Tensor,
    *,
    max_q: int,
    max_k: int,
    scale: float,
    window_left: int = -1,
    sinks: Optional[torch.Tensor] = None,
    cu_k: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``[T, Hq, D]`` attention of ragged query rows over NHD pages ``[P, page, Hkv, D]``.

    Request ``b`` owns rows ``cu_q[b]:cu_q[b + 1]``, the last of its ``seq_lens[b]`` tokens (rows
    past ``cu_q[B]`` are padding: left at zero). Decode (one row a request) takes the decode kernel,
    anything else the prefill kernel; float32 runs kvattn's reference.
    """
    rows, batch = q.shape[0], seq_lens.shape[0]
    max_q = max(0, min(max_q, rows, max_k))
    decode = max_q == 1 and rows == batch
    _stats["decode" if decode else "prefill"] += 1
    if q.dtype not in HALF_DTYPES:
        return _attend_reference(q, k_pages, v_pages, tables, seq_lens, cu_q, scale, window_left, sinks)
    ws = workspace(q.device)
    if decode:
        return xqa_batch_decode_with_kv_cache(
            q, (k_pages, v_pages), ws, tables, seq_lens, max_k, bmm1_scale=scale, window_left=window_left,
            sinks=sinks, kv_layout="NHD",
        )
    out = torch.zeros_like(q)  # rows past cu_q[B] (CUDA-graph padding) stay finite
    if cu_k is None:  # (prefill checks it against seq_lens: their prefix sums)
        cu_k = torch.nn.functional.pad(seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    return trtllm_batch_context_with_kv_cache(
        q, (k_pages, v_pages), ws, tables, seq_lens, max_q, max_k, scale, 1.0, batch, cu_q, cu_k,
        window_left=window_left, out=out, kv_layout="NHD", sinks=sinks,
    )


def _attend_reference(q, k_pages, v_pages, tables, seq_lens, cu_q, scale, window_left, sinks):
    kv = PagedKV(k_pages, v_pages, tables, tables, q.shape[-1], v_pages.shape[-1])
    o = reference.context(q, kv, seq_lens, cu_q, logit_scale=Scale(float(scale)), out_scale=Scale(1.0),
                          window_left=window_left, sinks=sinks)
    return o.to(q.dtype)


def tables_from_indices(index: torch.Tensor, cu_k: torch.Tensor, max_k: int, page_size: int) -> torch.Tensor:
    """int32 ``[B, ceil(max_k / page_size)]`` page tables from transformers' flat cache indices.

    ``index[cu_k[b] + t]`` is the flat slot (``page * page_size + slot``) of token ``t`` of request
    ``b``, tokens in order from 0: token ``j * page_size`` starts page ``j``. Device ops only.
    """
    width = max(1, -(-max_k // page_size))
    cols = torch.arange(width, device=index.device, dtype=torch.int64) * page_size
    start = cu_k[:-1].to(torch.int64).unsqueeze(1)
    lens = (cu_k[1:] - cu_k[:-1]).to(torch.int64).unsqueeze(1)
    valid = cols.unsqueeze(0) < lens
    if index.numel() == 0:
        return torch.zeros(valid.shape, dtype=torch.int32, device=index.device)
    at = (start + cols.unsqueeze(0)).clamp(0, index.numel() - 1)
    return torch.where(valid, index.to(torch.int64)[at] // page_size, 0).to(torch.int32)


def tables_contiguous(cu_k: torch.Tensor, max_k: int) -> torch.Tensor:
    """int32 ``[B, max_k]`` tables reading rows ``cu_k[b] + t`` of a ``[N, 1, H, D]`` page-of-one-token view."""
    width = max(1, max_k)
    cols = torch.arange(width, device=cu_k.device, dtype=torch.int64)
    lens = (cu_k[1:] - cu_k[:-1]).to(torch.int64).unsqueeze(1)
    ids = cu_k[:-1].to(torch.int64).unsqueeze(1) + cols.unsqueeze(0)
    return torch.where(cols.unsqueeze(0) < lens, ids, 0).to(torch.int32)


# ---------------------------------------------------------------------------------------------
# the paged cache of transformers' continuous batching, across releases
# ---------------------------------------------------------------------------------------------
@dataclass
class LayerCache:
    """One layer's view of transformers' ``PagedAttentionCache``.

    ``k_pages``/``v_pages``: NHD pages of a full-attention layer (None for a sliding-window ring);
    ``group``: index of the layer's group in the ``read_index``/``write_index`` lists;
    ``layer_type``: key of the per-type ``cu_seq_lens_k``/``max_*_k`` dicts; ``written``: whether
    transformers already wrote (and gathered) the step's K/V before calling attention.
    """

    k_pages: Optional[torch.Tensor]
    v_pages: Optional[torch.Tensor]
    page_size: int
    group: int
    layer_type: str
    written: bool


def is_paged_cache(cache) -> bool:
    return type(cache).__name__ == "PagedAttentionCache"


def layer_cache(cache, layer_idx: int) -> LayerCache:
    """The layer's cache in the form of the installed transformers release."""
    allocators = getattr(cache, "layer_to_allocator", None)
    if allocators is not None:
        # Allocator-based cache (the model calls cache.update before attention): the update kvattn
        # wraps (see _patch_cache_update) leaves full-attention layers to kvattn and runs as usual
        # (write, then gather) for sliding-window layers.
        alloc = allocators[layer_idx]
        full = _full_attention_allocator(alloc)
        k = v = None
        if full:
            k, v = alloc.get_cache_for_block_table(layer_idx)
        return LayerCache(k, v, int(alloc.tokens_per_page), int(alloc.index), alloc.layer_type, not full)
    # Group-based cache (the attention function owns the update): kvattn writes full-attention
    # layers itself and calls cache.update for sliding-window ones.
    group, in_group = cache.layer_index_to_group_indices[layer_idx]
    sliding = cache.sliding_windows.get(layer_idx, 1) != 1
    k = v = None
    page = int(cache.block_size)
    if not sliding:
        heads, dim = cache.key_cache[in_group].shape[-2:]
        k = cache.key_cache[in_group].view(-1, page, heads, dim)
        v = cache.value_cache[in_group].view(-1, page, heads, dim)
    return LayerCache(k, v, page, int(group), "sliding_attention" if sliding else "full_attention", False)


def _full_attention_allocator(alloc) -> bool:
    return bool(getattr(alloc, "supports_block_table", False)) and getattr(alloc, "layer_type", "") == "full_attention"


def _per_type(value, layer_type: str):
    return value[layer_type] if isinstance(value, dict) else value


def _first(kwargs: dict, *names, default=None):
    for n in names:
        if kwargs.get(n) is not None:
            return kwargs[n]
    return default


def _window_left(module, kwargs) -> int:
    w = kwargs.get("sliding_window", None)
    if w is None:
        w = getattr(module, "sliding_window", None)
    return int(w) - 1 if w else -1


def _sinks(module, kwargs) -> Optional[torch.Tensor]:
    s = kwargs.get("s_aux")
    if s is None:
        s = getattr(module, "sinks", None)
    return None if s is None else s.detach().float().reshape(-1)


def _scale(module, scaling, head_dim: int) -> float:
    if scaling is None:
        scaling = getattr(module, "scaling", None)
    return float(scaling) if scaling is not None else 1.0 / math.sqrt(head_dim)


# Every layer of a group sees the same step tensors (the same objects within one forward): their
# page tables and token positions are computed once a forward. The memo lives for one forward: a
# layer index not above the last one seen (layers run in order) or a new cu_seq_lens_q object
# clears it, since a buffer may be refilled in place between forwards. Entries hold their key
# tensors, so an id cannot be reused while it is cached.
_plan_memo: dict = {"cu_q": None, "layer": -1, "items": {}}


def _step_plan(layer: int, cu_q, cu_k, seq_lens, index, max_k: int, page_size: int, rows: int, positions: bool):
    """``(tables, batch_indices, positions)`` of a full-attention group for this forward (the last
    two None unless ``positions``)."""
    if _plan_memo["cu_q"] is not cu_q or layer <= _plan_memo["layer"]:
        _plan_memo["cu_q"], _plan_memo["items"] = cu_q, {}
    _plan_memo["layer"] = layer
    key = (id(cu_k), id(index), max_k, page_size, rows, positions)
    hit = _plan_memo["items"].get(key)
    if hit is not None and hit[0] is cu_k and hit[1] is index:
        return hit[2]
    tables = tables_from_indices(index, cu_k, max_k, page_size)
    b = pos = None
    if positions:
        b, pos = batch_indices_positions(cu_q, seq_lens, rows)
    _plan_memo["items"][key] = (cu_k, index, (tables, b, pos))
    return tables, b, pos


def _paged_forward(module, query, key, value, cache, scale, window_left, sinks, kwargs):
    rows = query.shape[2]
    q = query[0].transpose(0, 1)  # [T, Hq, D], a view
    cu_q = kwargs["cu_seq_lens_q"]
    lc = layer_cache(cache, module.layer_idx) if cache is not None else None
    layer_type = lc.layer_type if lc is not None else ""
    cu_k = _per_type(kwargs["cu_seq_lens_k"], layer_type).to(torch.int32)
    max_k = int(_per_type(_first(kwargs, "max_length_k", "max_seqlen_k"), layer_type))
    max_q = int(_first(kwargs, "max_length_q", "max_seqlen_q", default=rows))
    seq_lens = cu_k[1:] - cu_k[:-1]
    if lc is not None and lc.k_pages is not None:
        # Full attention: read the pages in place. The token list of request b starts at cu_k[b]
        # in the read index; without any past in the batch, the write index lists the same tokens.
        read = kwargs["read_index"][lc.group]
        index = read if read.numel() else kwargs["write_index"][lc.group]
        tables, b, pos = _step_plan(module.layer_idx, cu_q, cu_k, seq_lens, index, max_k, lc.page_size, rows, not lc.written)
        if not lc.written:
            append_paged_kv_cache(key[0].transpose(0, 1), value[0].transpose(0, 1), (lc.k_pages, lc.v_pages),
                                  tables, b, pos)
        k_pages, v_pages = lc.k_pages, lc.v_pages
        _stats["pages"] += 1
    else:
        # Sliding window (or a release whose cache kvattn cannot see): attend over the K/V
        # transformers gathers for the step, as pages of one token. (The ring buffer of a sliding
        # layer keeps slot = position mod window, not token order.)
        if lc is not None and not lc.written:
            key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                                      read_index=kwargs["read_index"], write_index=kwargs["write_index"])
            k_rows, v_rows = key, value  # [N, Hkv, D]
        else:
            k_rows, v_rows = key[0].transpose(0, 1), value[0].transpose(0, 1)
        k_pages, v_pages = k_rows.unsqueeze(1), v_rows.unsqueeze(1)
        tables = tables_contiguous(cu_k, max_k)
        _stats["gathered"] += 1
    out = attend_paged(q, k_pages, v_pages, tables, seq_lens, cu_q, max_q=max_q, max_k=max_k, scale=scale,
                       window_left=window_left, sinks=sinks, cu_k=cu_k)
    return out.unsqueeze(0), None


# ---------------------------------------------------------------------------------------------
# contiguous caches (model.generate)
# ---------------------------------------------------------------------------------------------
def token_pages(x: torch.Tensor):
    """``[B, H, L, D]`` K or V as NHD pages of one token (a strided view, no copy), and the row
    stride: token ``t`` of batch row ``b`` is page ``b * row + t``. None when the strides do not
    allow it."""
    b, h, length, d = x.shape
    sb, sh, sl, sd = x.stride()
    if sd != 1 or sl <= 0 or sb % sl:
        return None
    row = sb // sl
    pages = (b - 1) * row + length
    return x.as_strided((pages, 1, h, d), (sl, sl, sh, 1)), row


def _dense_forward(module, query, key, value, scale, window_left, sinks):
    batch, hq, lq, d = query.shape
    lk = key.shape[2]
    kp, vp = token_pages(key), token_pages(value)
    if kp is None or vp is None or kp[1] != vp[1]:
        key, value = key.contiguous(), value.contiguous()
        kp, vp = token_pages(key), token_pages(value)
    (k_pages, row), (v_pages, _) = kp, vp
    _stats["dense"] += 1
    dev = query.device
    tables = (torch.arange(batch, device=dev, dtype=torch.int32).unsqueeze(1) * row
              + torch.arange(lk, device=dev, dtype=torch.int32).unsqueeze(0))
    seq_lens = torch.full((batch,), lk, dtype=torch.int32, device=dev)
    steps = torch.arange(batch + 1, device=dev, dtype=torch.int32)
    cu_q, cu_k = steps * lq, steps * lk
    q = query.transpose(1, 2).reshape(batch * lq, hq, d)
    out = attend_paged(q, k_pages, v_pages, tables, seq_lens, cu_q, max_q=lq, max_k=lk, scale=scale,
                       window_left=window_left, sinks=sinks, cu_k=cu_k)
    return out.view(batch, lq, hq, d), None


def _fallback(module, query, key, value, attention_mask, why: str, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _warn_once(why, f"kvattn: {why}; this call runs transformers' sdpa attention instead")
    _stats["fallback"] += 1
    kwargs.pop("cache", None)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def kvattn_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    **kwargs,
):
    """transformers attention function (``AttentionInterface``) backed by kvattn.

    Parameters
    ----------
    module : the attention layer (``layer_idx``, ``scaling``; ``sliding_window``/``sinks`` if any)
    query : ``[B, Hq, Lq, D]``; key, value : ``[B, Hkv, Lk, D]`` (with a paged cache, ``B = 1`` and the
        step's packed tokens)
    attention_mask : None, or a mask (non-paged calls with a mask run SDPA)
    kwargs : transformers' attention kwargs (``cache``, ``cu_seq_lens_q``/``_k``, ``read_index``,
        ``write_index``, ``sliding_window``, ``s_aux``, ...)

    Returns
    -------
    (attn_output ``[B, Lq, Hq, D]``, None)
    """
    if kwargs.get("softcap") is not None or getattr(module, "attn_logit_softcapping", None):
        raise NotImplementedError("kvattn: attention logit soft-capping is not supported")
    head_dim = query.shape[-1]
    scale = _scale(module, scaling, head_dim)
    window_left = _window_left(module, kwargs)
    sinks = _sinks(module, kwargs)
    cache = kwargs.get("cache")
    if cache is None:
        cache = kwargs.get(CACHE_KWARG)
    if cache is not None and is_paged_cache(cache):
        return _paged_forward(module, query, key, value, cache, scale, window_left, sinks, kwargs)
    if "cu_seq_lens_k" in kwargs and "read_index" in kwargs:  # packed continuous-batching step, cache unseen
        return _paged_forward(module, query, key, value, None, scale, window_left, sinks, kwargs)
    if dropout and module.training:
        return _fallback(module, query, key, value, attention_mask, "dropout in training", scaling=scaling,
                         dropout=dropout, **kwargs)
    if attention_mask is not None:
        return _fallback(module, query, key, value, attention_mask, "a call with an attention mask (padded batch, "
                         "static cache) has no kvattn kernel", scaling=scaling, **kwargs)
    if not getattr(module, "is_causal", True) or kwargs.get("is_causal") is False:
        return _fallback(module, query, key, value, attention_mask, "non-causal attention has no kvattn kernel",
                         scaling=scaling, **kwargs)
    return _dense_forward(module, query, key, value, scale, window_left, sinks)


# ---------------------------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------------------------
_registered = False


def _uses_paged_prefix() -> bool:
    """Whether this transformers names continuous-batching implementations ``"paged|<name>"``."""
    from transformers import AttentionInterface

    return "paged|sdpa" in AttentionInterface._global_mapping


def _patch_cb_switch() -> None:
    """Let ``generate_batch`` keep a kvattn implementation on releases that accept only their own
    for continuous batching (no ``paged|`` prefix). Other implementations are untouched."""
    try:
        from transformers.generation.continuous_batching.continuous_api import ContinuousBatchingManager
    except ImportError:  # pragma: no cover - a release without continuous batching
        return
    original = ContinuousBatchingManager.switch_to_cb_friendly_attn
    if getattr(original, "_kvattn_wrapped", False):
        return

    def switch_to_cb_friendly_attn(self, model, *args, **kwargs):
        if getattr(model.config, "_attn_implementation", None) in NAMES:
            return None  # kvattn serves the paged path under its own name
        return original(self, model, *args, **kwargs)

    switch_to_cb_friendly_attn._kvattn_wrapped = True
    switch_to_cb_friendly_attn.__doc__ = original.__doc__
    ContinuousBatchingManager.switch_to_cb_friendly_attn = switch_to_cb_friendly_attn


def _patch_cache_update() -> None:
    """On releases whose models call ``PagedAttentionCache.update`` before attention: for a model
    running kvattn, hand the cache to kvattn (an attention kwarg) and leave its full-attention
    layers to kvattn, which writes the new K/V into the pages itself and reads them in place;
    transformers' own update (write, then gather the whole sequence) still runs for sliding-window
    layers. Models on other implementations are untouched."""
    try:
        from transformers.generation.continuous_batching.cache import PagedAttentionCache
    except ImportError:  # pragma: no cover
        return
    original = PagedAttentionCache.update
    if getattr(original, "_kvattn_wrapped", False) or "kwargs" not in inspect.signature(original).parameters:
        return  # already wrapped, or an update that is not the model-side one (kwargs dict argument)

    def update(self, key_states, value_states, layer_idx, kwargs, *args, **kw):
        if getattr(self.config, "_attn_implementation", None) in NAMES and isinstance(kwargs, dict):
            kwargs[CACHE_KWARG] = self
            if kwargs.get("block_table") is None and _full_attention_allocator(self.layer_to_allocator[layer_idx]):
                return key_states, value_states
        return original(self, key_states, value_states, layer_idx, kwargs, *args, **kw)

    update._kvattn_wrapped = True
    update.__doc__ = original.__doc__
    PagedAttentionCache.update = update


def _causal_like(mask_function) -> bool:
    """Whether ``mask_function(b, h, q, kv)`` lets a query see the keys before it and none after
    (causal, or causal within a window): the masks kvattn applies itself."""
    t = torch.tensor
    try:
        before = bool(mask_function(t(0), t(0), t(5), t(4))) and bool(mask_function(t(0), t(0), t(5), t(5)))
        after = bool(mask_function(t(0), t(0), t(4), t(5)))
    except Exception:  # a mask function that needs more than indices: let SDPA handle it
        return False
    return before and not after


def kvattn_mask(*args, **kwargs):
    """Mask builder for ``"kvattn"``: None (no mask: kvattn applies causality and the layer's
    window itself) when the mask would only be causal / sliding-window over an unpadded batch;
    otherwise transformers' SDPA mask, which sends the call to SDPA. Reading the padding mask
    synchronises, once a forward, as transformers' own SDPA mask does."""
    from transformers.masking_utils import sdpa_mask

    mask = sdpa_mask(*args, **kwargs)
    if mask is None:
        return None
    padding = kwargs.get("attention_mask")
    mask_function = kwargs.get("mask_function")
    if (padding is None or bool(padding.all())) and mask_function is not None and _causal_like(mask_function):
        return None
    return mask


def register() -> str:
    """Register kvattn with transformers; returns the name to pass as ``attn_implementation``.

    Adds :func:`kvattn_attention_forward` as ``"kvattn"`` and ``"paged|kvattn"`` to
    ``transformers.AttentionInterface``, a mask builder for ``"kvattn"`` (:func:`kvattn_mask`: no mask
    for causal / sliding-window layers of unpadded batches, SDPA's otherwise, so that padded calls
    fall back to SDPA), and, on releases without ``paged|`` names,
    lets ``generate_batch`` keep ``"kvattn"``. Idempotent.
    """
    global _registered
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    if not _registered:
        AttentionInterface.register(NAME, kvattn_attention_forward)
        AttentionInterface.register(PAGED_NAME, kvattn_attention_forward)
        ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, kvattn_mask)
        if not _uses_paged_prefix():
            _patch_cb_switch()
            _patch_cache_update()
        _registered = True
    return NAME


def paged_name() -> str:
    """The implementation name continuous batching runs kvattn under in this transformers release
    (what ``model.config._attn_implementation`` reads inside ``generate_batch``)."""
    return PAGED_NAME if _uses_paged_prefix() else NAME


__all__ = ["register", "paged_name", "stats", "reset_stats", "kvattn_attention_forward", "attend_paged", "tables_from_indices",
           "append_paged_kv_cache", "NAME", "PAGED_NAME"]
