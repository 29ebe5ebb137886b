"""``xqa``: the low-level paged decode that writes its output in place."""

from __future__ import annotations

import math
import sys
import types
from typing import Optional

import torch

from . import _backend, reference
from ._callcache import CallCache
from ._inputs import (
    HALF_DTYPES,
    PagedKV,
    Scale,
    cached_aliases,
    check_half_match,
    check_head_dim,
    check_int,
    check_interpretable,
    check_layout,
    check_lse_out,
    check_out,
    check_query_heads,
    check_sinks,
    check_tensor,
    check_workspace,
    debug_check_pages,
    hint_swaps,
    looks,
    to_scale,
)
from .formats import FP8_DTYPE

XQA_PAGE_SIZES = (16, 32, 64, 128)


def _pool_pages(pool: torch.Tensor, page_size: int, num_kv_heads: int) -> torch.Tensor:
    return pool.unflatten(0, (-1, page_size, num_kv_heads))


def _hnd_pages(pages: torch.Tensor) -> torch.Tensor:
    return pages.transpose(1, 2)


def _cache_pages(cache, name: str, num_kv_heads: int, page_size: int, head_dim: int, layout: str, q_dtype, device):
    """``[pages, page_size, Hkv, D]`` view of xqa's flat head pool (or of 4-D NHD/HND pages)."""
    if name == "k_cache" and isinstance(cache, torch.Tensor):  # (a V unlike K is reported as such below)
        check_half_match(q_dtype, "q", cache.dtype, name)
    check_tensor(cache, name, dtypes=(q_dtype, FP8_DTYPE), ndim=(2, 4), device=device, contiguous_last=True)
    shape = cache.shape
    if shape[-1] != head_dim:
        raise ValueError(f"{name}: expected head_dim {head_dim} (the query's) in the last dim, got {shape[-1]}")
    if len(shape) == 2:
        per_page = page_size * num_kv_heads
        if shape[0] % per_page:
            raise ValueError(
                f"{name}: expected total_num_cache_heads a multiple of page_size * num_kv_heads = {per_page}, "
                f"got {shape[0]}"
            )
        return cached_aliases(cache, ("pool",), _pool_pages, page_size, num_kv_heads)
    pages = cache if layout == "NHD" else cached_aliases(cache, ("hnd",), _hnd_pages)
    if pages.shape[1] != page_size or pages.shape[2] != num_kv_heads:
        other = "HND" if layout == "NHD" else "NHD"
        hint = f"; is kv_layout='{other}' meant?" if (pages.shape[2], pages.shape[1]) == (page_size, num_kv_heads) else ""
        raise ValueError(
            f"{name}: expected {layout} pages with page_size={page_size} and num_kv_heads={num_kv_heads}, "
            f"got shape {list(cache.shape)}{hint}"
        )
    return pages


def xqa(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    output: torch.Tensor,
    workspace_buffer: torch.Tensor,
    semaphores: torch.Tensor,
    num_kv_heads: int,
    page_size: int,
    sinks: Optional[torch.Tensor] = None,
    q_scale: float = 1.0,
    kv_scale: Optional[torch.Tensor] = None,
    sliding_win_size: int = 0,
    sm_count: Optional[int] = None,
    *,
    kv_layout: str = "NHD",
    return_lse: bool = False,
    lse: Optional[torch.Tensor] = None,
) -> Optional[torch.Tensor]:
    """Paged decode writing ``output`` in place (one query token per request).

    Parameters
    ----------
    q : torch.Tensor ``[B, 1, Hq, D]``, float16 or bfloat16 (beam_width 1)
    k_cache, v_cache : torch.Tensor ``[total_num_cache_heads, D]``
        Pools of head vectors: token slot ``s`` of page ``p``, KV head ``h`` is row
        ``(p * page_size + s) * num_kv_heads + h``. 4-D page tensors in ``kv_layout`` are accepted
        too. The query's dtype or float8_e4m3fn.
    page_table : torch.Tensor int32 ``[B, pages_per_seq]`` (shared by K and V)
    seq_lens : torch.Tensor uint32 or int32 ``[B, 1]``
    output : torch.Tensor ``[B, 1, Hq, D]``, the query's dtype (or float8_e4m3fn with an fp8 cache, or
        float32 for unrounded partial results to merge)
    workspace_buffer : torch.Tensor uint8 (zeroed before first use)
        At least 16400 bytes; :func:`kvattn.workspace_size` gives the bytes a call can use.
    semaphores : torch.Tensor uint32 (checked; kvattn's split-KV merge keeps its counters in the workspace)
    num_kv_heads : int
    page_size : int in 16, 32, 64, 128
    sinks : torch.Tensor float32 ``[num_kv_heads, Hq / num_kv_heads]``, optional
    q_scale : float or one-element float32 tensor
    kv_scale : torch.Tensor float32 ``[1]``, optional
        Dequant scale of an fp8 cache (ignored for float16/bfloat16 caches).
    sliding_win_size : int
        ``W > 0``: each query sees its last ``W`` keys; 0: all.
    sm_count : int, optional
        Caps the number of programs launched.
    kv_layout : {"NHD", "HND"}, keyword-only
        Layout of 4-D page tensors (the flat pool is always NHD).
    return_lse : bool, keyword-only
        Also write and return each row's base-2 log-sum-exp, float32 ``[B, 1, Hq]`` (as
        :func:`kvattn.decode.xqa_batch_decode_with_kv_cache`'s: sinks excluded, ``-inf`` for an
        empty request).
    lse : torch.Tensor float32 ``[B, 1, Hq]``, keyword-only, optional
        Where to write it (with ``return_lse``); allocated if None.

    Returns
    -------
    None, or with ``return_lse`` the LSE.

    Examples
    --------
    >>> import torch, kvattn
    >>> B, Hq, Hkv, D, page = 2, 8, 2, 128, 16
    >>> q = torch.randn(B, 1, Hq, D, dtype=torch.float16)
    >>> k = torch.randn(4 * page * Hkv, D, dtype=torch.float16)
    >>> v = torch.randn(4 * page * Hkv, D, dtype=torch.float16)
    >>> table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    >>> lens = torch.tensor([[20], [32]], dtype=torch.uint32)
    >>> out = torch.empty_like(q)
    >>> kvattn.xqa.xqa(q, k, v, table, lens, out, torch.zeros(1 << 20, dtype=torch.uint8),
    ...                torch.zeros(8, dtype=torch.uint32), Hkv, page)
    """
    args = (q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores, num_kv_heads, page_size,
            sinks, q_scale, kv_scale, sliding_win_size, sm_count, kv_layout, return_lse, lse)
    if lse is not None or return_lse is False:  # (else the call allocates the LSE)
        return _CACHE.run(args, lambda: _xqa(*args))
    return _xqa(*args)


# Calls replayed from their metadata (kvattn._callcache).
_CACHE = CallCache("xqa")


@hint_swaps(q=looks("float", (4,)), k_cache=looks("float", (2, 4)), page_table=looks("int", (2,)),
            seq_lens=looks("int uint", (1, 2)), workspace_buffer=looks("byte", (1,)))
def _xqa(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores, num_kv_heads, page_size,
         sinks, q_scale, kv_scale, sliding_win_size, sm_count, kv_layout, return_lse, lse):
    """:func:`xqa`, the ordinary way."""
    check_tensor(q, "q", dtypes=HALF_DTYPES, ndim=4, contiguous_last=True)
    device, shape, q_dtype = q.device, q.shape, q.dtype
    if shape[1] != 1:
        raise ValueError(f"q: expected beam_width 1 (shape [B, 1, Hq, D]), got {list(shape)}")
    head_dim = check_head_dim(shape[3], "q")
    num_kv_heads = check_int(num_kv_heads, "num_kv_heads", minimum=1)
    page_size = check_int(page_size, "page_size", choices=XQA_PAGE_SIZES)
    layout = check_layout(kv_layout)
    group = check_query_heads(shape[2], "q", num_kv_heads)
    k = _cache_pages(k_cache, "k_cache", num_kv_heads, page_size, head_dim, layout, q_dtype, device)
    v = _cache_pages(v_cache, "v_cache", num_kv_heads, page_size, head_dim, layout, q_dtype, device)
    kv_dtype = k_cache.dtype
    if kv_dtype != v_cache.dtype:
        raise TypeError(f"v_cache: expected the dtype of k_cache ({kv_dtype}), got {v_cache.dtype}")
    if v.shape[0] < k.shape[0]:
        # The kernels bound page ids by K's page count (one bound for both tables): a smaller V pool
        # would let an id valid for K read past V's end.
        raise ValueError(
            f"v_cache: expected at least as many pages as k_cache ({k.shape[0]} of {page_size} tokens), "
            f"got {v.shape[0]} (shape {list(v_cache.shape)})"
        )
    batch = shape[0]
    check_tensor(page_table, "page_table", dtypes=(torch.int32,), ndim=2, device=device)
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table: expected {batch} rows (one per request), got {page_table.shape[0]}")
    check_tensor(seq_lens, "seq_lens", dtypes=(torch.uint32, torch.int32), device=device)
    if seq_lens.numel() != batch:
        raise ValueError(f"seq_lens: expected shape [{batch}, 1], got {list(seq_lens.shape)}")
    check_out(output, "output", shape, (q_dtype, FP8_DTYPE, torch.float32), device)
    if output.dtype == FP8_DTYPE and kv_dtype != FP8_DTYPE:
        raise TypeError(f"output: a float8_e4m3fn output needs an fp8 cache, got a {kv_dtype} cache")
    check_workspace(workspace_buffer, "workspace_buffer", device)
    check_tensor(semaphores, "semaphores", dtypes=(torch.uint32,), device=device)
    if sinks is not None:
        check_tensor(sinks, "sinks", dtypes=(torch.float32,), device=device)
        if tuple(sinks.shape) != (num_kv_heads, group):
            raise ValueError(f"sinks: expected shape [{num_kv_heads}, {group}], got {list(sinks.shape)}")
        sinks = check_sinks(sinks, "sinks", shape[2], device)
    win = check_int(sliding_win_size, "sliding_win_size", minimum=0)
    if sm_count is not None:
        sm_count = check_int(sm_count, "sm_count", minimum=1)
    qs = to_scale(q_scale, "q_scale", device)
    if kv_dtype == FP8_DTYPE:
        kv_eff = to_scale(kv_scale, "kv_scale", device, allow_none_as=1.0)
    else:
        if kv_scale is not None:
            to_scale(kv_scale, "kv_scale", device)
        kv_eff = Scale(1.0)
    logit = qs.times(kv_eff).times(1.0 / math.sqrt(head_dim))

    lse = check_lse_out(lse, return_lse, batch, shape[2], device, shape=(batch, 1, shape[2]))
    lse_rows = lse[:, 0] if lse is not None else None

    kv = PagedKV(k, v, page_table, page_table, head_dim, head_dim)
    debug_check_pages(kv, seq_lens, "page_table", pool_name="k_cache",
                      scales=(("q_scale", qs.tensor), ("kv_scale", kv_eff.tensor)))
    window_left = win - 1 if win > 0 else -1
    ops = _backend.triton_entry("batch_decode", device)
    if ops is not None:
        check_interpretable(("k_cache", kv_dtype))
        # The launcher takes [B, 1, Hq, D] queries/outputs and [B, 1] lengths as they are.
        ops.batch_decode(
            q, kv, seq_lens, output, workspace_buffer, q_len=1, max_seq_len=kv.capacity,
            logit_scale=logit, out_scale=kv_eff, window_left=window_left, sinks=sinks, mask=None,
            max_programs=sm_count, lse=lse_rows,
        )
    else:
        reference.batch_decode(q[:, 0], kv, seq_lens.reshape(batch), output[:, 0], q_len=1, logit_scale=logit,
                               out_scale=kv_eff, window_left=window_left, sinks=sinks, mask=None, lse=lse_rows)
    return lse


class _CallableModule(types.ModuleType):
    """Lets ``kvattn.xqa(...)`` call the function while ``kvattn.xqa.xqa`` stays the seed's path."""

    def __call__(self, *args, **kwargs):
        return xqa(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
