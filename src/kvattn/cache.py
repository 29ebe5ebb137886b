"""Writing into paged KV caches: the append op engines call next to attention.

A serving loop keeps each layer's K/V in pages (the caches :func:`kvattn.decode.xqa_batch_decode_with_kv_cache`
and :func:`kvattn.prefill.trtllm_batch_context_with_kv_cache` read) and, every step, writes the K/V
rows of the step's new tokens into them. :func:`append_paged_kv_cache` does that write, quantising on
the way for fp8 and NVFP4 caches; :func:`batch_indices_positions` turns the ragged layout of a step
(``cum_seq_lens_q``, ``seq_lens``: the prefill convention) into the per-token request and position
the append takes.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from .runtime import backend as _backend
from . import reference
from ._formats_table import QUANTISED_DTYPES
from ._inputs import check_int, check_layout, check_shape, check_tensor, paged_kv_from_cache, to_scale

APPEND_SRC_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)


def append_paged_kv_cache(
    key: torch.Tensor,
    value: Optional[torch.Tensor],
    kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
    block_tables: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    kv_layout: str = "NHD",
    k_scale: Union[float, torch.Tensor] = 1.0,
    v_scale: Union[float, torch.Tensor] = 1.0,
    kv_cache_sf: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
) -> None:
    """Write new tokens' K/V rows into a paged KV cache, in place.

    Token ``i`` (row ``i`` of ``key``/``value``) belongs to request ``b = batch_indices[i]`` at position
    ``p = positions[i]`` (0 for the request's first token); it is written to page
    ``block_tables[b, p // page_size]``, slot ``p % page_size`` -- the slot the attention functions
    read token ``p`` of request ``b`` from. A token whose ``b`` is outside ``[0, B)``, whose ``p``
    is outside ``[0, pages_per_seq * page_size)`` or whose page id is outside ``[0, num_pages)`` is
    dropped (nothing written; -1 marks padding tokens). Tokens writing one slot twice leave either row.

    Parameters
    ----------
    key : torch.Tensor ``[N, Hkv, D]``, float16, bfloat16 or float32
        Only the last dim must be contiguous.
    value : torch.Tensor ``[N, Hkv, D]`` or None
        The key's dtype; None exactly when the cache has a single plane (K = V, ``[P, 1, ...]``).
    kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        As the attention functions take it: one tensor ``[P, 2 or 1, page_size, Hkv, D]`` (NHD) /
        ``[P, 2 or 1, Hkv, page_size, D]`` (HND), or a ``(K, V)`` tuple of ``[P, page_size, Hkv, D]`` /
        ``[P, Hkv, page_size, D]``. Dtype: the key's (no conversion), float8_e4m3fn (stores
        ``e4m3(x / scale)``, nearest even, saturating at +-448) or uint8 NVFP4 (last dim ``D / 2``;
        stores the e2m1 codes of ``x / scale`` and per 16 elements the e4m3 block scale
        ``amax / 6`` in ``kv_cache_sf``, as :func:`kvattn.formats.quantize_nvfp4`).
    block_tables : torch.Tensor int32 ``[B, pages_per_seq]``
    batch_indices, positions : torch.Tensor int32 or int64 ``[N]``
        See :func:`batch_indices_positions` to build them from a step's ``cum_seq_lens_q`` and ``seq_lens``.
    kv_layout : {"NHD", "HND"}
    k_scale, v_scale : float or one-element float32 tensor
        Dequant scales of an fp8/NVFP4 cache (the cache holds ``x / scale``; fold ``scale`` into the
        attention's ``bmm1_scale`` / ``bmm2_scale``). Ignored for 16-bit caches.
    kv_cache_sf : torch.Tensor or tuple, optional
        NVFP4 block scales, float8_e4m3fn, the data's shape with last dim ``D / 16`` (one tensor with
        the cache's plane dim, or a ``(k_sf, v_sf)`` tuple), as the attention functions take them.

    Notes
    -----
    On CUDA one Triton launch; nothing waits for the device and nothing is allocated, so the call
    can be captured in a CUDA graph (tokens, positions and tables rewritten in place between replays).

    Examples
    --------
    >>> import torch, kvattn
    >>> Hkv, D, page = 2, 64, 16
    >>> cache = torch.zeros(6, 2, page, Hkv, D, dtype=torch.bfloat16)
    >>> tables = torch.tensor([[3, 1], [0, 5]], dtype=torch.int32)
    >>> lens = torch.tensor([20, 5], dtype=torch.int32)   # after the step: 20 and 5 tokens
    >>> cum_q = torch.tensor([0, 4, 9], dtype=torch.int32)  # 4 new tokens, then 5
    >>> b, p = kvattn.cache.batch_indices_positions(cum_q, lens, 9)
    >>> p.tolist()
    [16, 17, 18, 19, 0, 1, 2, 3, 4]
    >>> k = torch.randn(9, Hkv, D, dtype=torch.bfloat16)
    >>> v = torch.randn(9, Hkv, D, dtype=torch.bfloat16)
    >>> kvattn.cache.append_paged_kv_cache(k, v, cache, tables, b, p)
    >>> bool((cache[1, 0, 0] == k[0]).all())  # position 16 of request 0: page 1, slot 0
    True
    """
    check_tensor(key, "key", dtypes=APPEND_SRC_DTYPES, ndim=3, contiguous_last=True)
    device = key.device
    num_tokens, num_heads, head_dim = key.shape
    if value is not None:
        check_tensor(value, "value", dtypes=(key.dtype,), ndim=3, device=device, contiguous_last=True)
        check_shape(value, "value", tuple(key.shape))
    # The cache takes the rows' dtype as it is, or a quantised format of the table.
    kv = paged_kv_from_cache(kv_cache, block_tables, kv_layout, head_dim, device, kv_sf=kv_cache_sf,
                             allowed_dtypes=(key.dtype, *QUANTISED_DTYPES))
    if kv.num_kv_heads != num_heads:
        # (the other layout swaps the NHD view's page_size and head dims)
        other = "HND" if check_layout(kv_layout) == "NHD" else "NHD"
        hint = f"; read as {other} it has {num_heads}: is kv_layout='{other}' meant?" if kv.page_size == num_heads else ""
        raise ValueError(f"kv_cache: expected pages of {num_heads} heads (the key's), got {list(kv.k.shape)} as NHD"
                         f"{hint}")
    one_plane = isinstance(kv_cache, torch.Tensor) and kv_cache.shape[1] == 1
    if one_plane and value is not None:
        raise ValueError("value: a cache with one plane (K = V, shape [P, 1, ...]) takes value=None, got a tensor")
    if not one_plane and value is None:
        raise ValueError("value: expected the new values for a cache with K and V, got None")
    for t, n in ((batch_indices, "batch_indices"), (positions, "positions")):
        check_tensor(t, n, dtypes=_INDEX_DTYPES, ndim=1, device=device)
        check_shape(t, n, (num_tokens,))
    k_scale = to_scale(k_scale, "k_scale", device)
    v_scale = to_scale(v_scale, "v_scale", device)

    ops = _backend.triton_entry("append_paged_kv", device)
    if ops is not None:
        ops.append_paged_kv(key, value, kv, batch_indices, positions, k_scale=k_scale, v_scale=v_scale)
    else:
        reference.append_paged_kv(key, value, kv, batch_indices, positions, k_scale=k_scale, v_scale=v_scale)


def batch_indices_positions(
    cum_seq_lens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    num_tokens: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token request and position of a ragged step, for :func:`append_paged_kv_cache`.

    Request ``b`` owns new-token rows ``cum_seq_lens_q[b] : cum_seq_lens_q[b + 1]``, the last
    ``q_b`` of its ``seq_lens[b]`` tokens (the convention of
    :func:`kvattn.prefill.trtllm_batch_context_with_kv_cache`): row ``cum_seq_lens_q[b] + i`` is
    at position ``seq_lens[b] - q_b + i``. Rows from ``cum_seq_lens_q[B]`` to ``num_tokens``
    (padding) get request ``B`` and position -1, which the append drops.

    Parameters
    ----------
    cum_seq_lens_q : torch.Tensor int32 or int64 ``[B + 1]``, non-decreasing from 0
    seq_lens : torch.Tensor int32 or int64 ``[B]``, lengths after the step
    num_tokens : int
        Rows to describe (``>= cum_seq_lens_q[B]``; a host-side bound, e.g. the padded token count).

    Returns
    -------
    (batch_indices, positions) : torch.Tensor int32 ``[num_tokens]`` each
        Device-side ops only (no synchronisation), usable inside a CUDA graph capture.

    Examples
    --------
    >>> import torch, kvattn
    >>> b, p = kvattn.cache.batch_indices_positions(torch.tensor([0, 2, 3]), torch.tensor([7, 1]), 4)
    >>> b.tolist(), p.tolist()
    ([0, 0, 1, 2], [5, 6, 0, -1])
    """
    check_tensor(cum_seq_lens_q, "cum_seq_lens_q", dtypes=_INDEX_DTYPES, ndim=1)
    device = cum_seq_lens_q.device
    batch = cum_seq_lens_q.shape[0] - 1
    if batch < 0:
        raise ValueError("cum_seq_lens_q: expected B + 1 >= 1 offsets, got an empty tensor")
    check_tensor(seq_lens, "seq_lens", dtypes=_INDEX_DTYPES + (torch.uint32,), ndim=1, device=device)
    check_shape(seq_lens, "seq_lens", (batch,))
    num_tokens = check_int(num_tokens, "num_tokens", minimum=0)
    cum = cum_seq_lens_q.to(torch.int64)
    rows = torch.arange(num_tokens, device=device, dtype=torch.int64)
    b = torch.searchsorted(cum[1:].contiguous(), rows, right=True)  # rows past the last request: B
    inside = b < batch
    b_safe = b.clamp(max=max(batch - 1, 0))
    if batch:
        start = seq_lens.to(torch.int64)[b_safe] - (cum[b_safe + 1] - cum[b_safe])
        pos = torch.where(inside, start + rows - cum[b_safe], -1)
    else:
        pos = torch.full_like(rows, -1)
    return b.to(torch.int32), pos.to(torch.int32)


__all__ = ["append_paged_kv_cache", "batch_indices_positions"]
