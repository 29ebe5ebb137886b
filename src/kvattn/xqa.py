"""``xqa``: the low-level paged decode that writes its output in place."""

from __future__ import annotations

import math
import sys
import types
from typing import Optional, Union

import torch

from . import decode, reference
from .runtime import backend as _backend
from .runtime.callcache import CallCache
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
    check_shape,
    check_query_heads,
    check_sinks,
    check_tensor,
    check_workspace,
    debug_check_pages,
    SwapHints,
    looks,
    to_scale,
)
from ._formats_table import BY_NAME
from .formats import FP8_DTYPE, NVFP4_BLOCK

NVFP4_DTYPE = BY_NAME["nvfp4"].dtype  # uint8

XQA_PAGE_SIZES = (16, 32, 64, 128)


def _pool_pages(pool: torch.Tensor, page_size: int, num_kv_heads: int) -> torch.Tensor:
    return pool.unflatten(0, (-1, page_size, num_kv_heads))


def _hnd_pages(pages: torch.Tensor) -> torch.Tensor:
    return pages.transpose(1, 2)


def _cache_pages(cache, name: str, num_kv_heads: int, page_size: int, last_dim: int, layout: str, q_dtype, device,
                 dtypes=None, what: str = "head_dim"):
    """``[pages, page_size, Hkv, last_dim]`` view of xqa's flat head pool (or of 4-D NHD/HND pages)."""
    if name == "k_cache" and isinstance(cache, torch.Tensor) and cache.dtype not in (FP8_DTYPE, NVFP4_DTYPE):
        check_half_match(q_dtype, "q", cache.dtype, name)  # (a V unlike K is reported as such below)
    dtypes = (q_dtype, FP8_DTYPE, NVFP4_DTYPE) if dtypes is None else dtypes
    check_tensor(cache, name, dtypes=dtypes, ndim=(2, 4), device=device, contiguous_last=True)
    shape = cache.shape
    if shape[-1] != last_dim:
        raise ValueError(f"{name}: expected {what} {last_dim} in the last dim, got {shape[-1]}")
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


def _rows_view(t: torch.Tensor, rows_shape: tuple):
    """``t`` (``[..., H, D]``) seen as ``rows_shape`` (``[rows, H, D]``) without a copy, or None
    where its leading dims do not collapse into one (read from the strides: no exception path, so
    torch.compile traces it)."""
    lead = [(n, st) for n, st in zip(t.shape[:-len(rows_shape) + 1], t.stride()) if n != 1]
    if any(a[1] != b[0] * b[1] for a, b in zip(lead, lead[1:])):
        return None
    return t.view(rows_shape)


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
    q_scale: Union[float, torch.Tensor] = 1.0,
    kv_scale: Optional[Union[float, torch.Tensor]] = None,
    sliding_win_size: int = 0,
    kv_layout: Union[str, int] = "NHD",
    sm_count: Optional[int] = None,
    enable_pdl: Optional[bool] = None,
    rcp_out_scale: float = 1.0,
    q_seq_len: int = 1,
    mask: Optional[torch.Tensor] = None,
    *,
    q_cu_seq_lens: Optional[torch.Tensor] = None,
    k_sf_cache: Optional[torch.Tensor] = None,
    v_sf_cache: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    lse: Optional[torch.Tensor] = None,
) -> Optional[torch.Tensor]:
    """Paged decode writing ``output`` in place.

    The signature is FlashInfer 0.7.2.post1's; a call written for the seed, whose position 14 is
    ``sm_count``, runs too: an int at ``kv_layout``'s position is taken as ``sm_count``.

    Parameters
    ----------
    q : torch.Tensor, float16 or bfloat16
        ``[B, 1, Hq, D]`` (beam_width 1); ``[B, 1, q_seq_len, Hq, D]`` with ``q_seq_len > 1``
        (speculative decoding: request ``b``'s drafts are its last ``q_seq_len`` tokens); packed
        ``[total_q, Hq, D]`` with ``q_cu_seq_lens``.
    k_cache, v_cache : torch.Tensor ``[total_num_cache_heads, D]``
        Pools of head vectors: token slot ``s`` of page ``p``, KV head ``h`` is row
        ``(p * page_size + s) * num_kv_heads + h``. 4-D page tensors in ``kv_layout`` are accepted
        too. The query's dtype, float8_e4m3fn, or uint8 NVFP4 (last dim ``D / 2``, with
        ``k_sf_cache`` / ``v_sf_cache``).
    page_table : torch.Tensor int32 ``[B, pages_per_seq]`` (shared by K and V)
    seq_lens : torch.Tensor uint32 or int32 ``[B, 1]``
        Each request's KV length, its draft tokens included.
    output : torch.Tensor, the query's shape
        The query's dtype, float8_e4m3fn with a quantised cache (stored times ``rcp_out_scale``),
        or float32 (unrounded partial results to merge).
    workspace_buffer : torch.Tensor uint8 (zeroed before first use)
        At least 16400 bytes; :func:`kvattn.workspace_size` gives the bytes a call can use.
    semaphores : torch.Tensor uint32 (checked; kvattn's split-KV merge keeps its counters in the workspace)
    num_kv_heads : int
    page_size : int in 16, 32, 64, 128
    sinks : torch.Tensor float32 ``[num_kv_heads, Hq / num_kv_heads]``, optional
    q_scale : float or one-element float32 tensor
    kv_scale : float or one-element float32 tensor, optional
        Dequant scale of a quantised (fp8 or NVFP4) cache: it multiplies the logits and the output
        (ignored for float16/bfloat16 caches).
    sliding_win_size : int
        ``W > 0``: each query row sees the keys of its last ``W`` positions (drafts before it
        included only through ``mask``); 0: all.
    kv_layout : {"NHD", "HND"}, or an int: the seed's ``sm_count`` at this position
        Layout of 4-D page tensors (the flat pool is always NHD).
    sm_count : int, optional
        Caps the number of programs launched.
    enable_pdl : bool, optional
        As :func:`kvattn.decode.xqa_batch_decode_with_kv_cache`'s (Hopper: programmatic dependent
        launch).
    rcp_out_scale : float
        FlashInfer 0.7.2.post1: a float8_e4m3fn output is stored times this (the reciprocal of
        the output's scale); other outputs ignore it.
    q_seq_len : int
        FlashInfer 0.7.2.post1: draft tokens per request (speculative decoding), the maximum with
        ``q_cu_seq_lens``. Draft row ``r`` of ``n`` sits at position ``L - n + r``.
    mask : torch.Tensor uint16, optional
        ``[B, q_seq_len, 2 * ceil(q_seq_len / 32)]`` (``[total_q, ...]`` with ``q_cu_seq_lens``):
        bit ``c % 16`` of word ``c // 16`` of row ``r`` lets draft row ``r`` see draft ``c`` (the
        convention of :func:`kvattn.decode.xqa_batch_decode_with_kv_cache`); None: causal.
    q_cu_seq_lens : torch.Tensor int32 or uint32 ``[B + 1]``, keyword-only, optional
        FlashInfer 0.7.2.post1: ragged drafts, request ``b`` owns packed rows ``cu[b] : cu[b + 1]``
        (0 to ``q_seq_len`` of them); see :func:`kvattn.decode.xqa_batch_decode_with_kv_cache`.
    k_sf_cache, v_sf_cache : torch.Tensor, keyword-only, optional
        FlashInfer 0.7.2.post1: the NVFP4 caches' e4m3 block scales (uint8 or float8_e4m3fn), the
        caches' form with last dim ``D / 16``.
    return_lse : bool, keyword-only
        Also write and return each row's base-2 log-sum-exp, float32 of the query's shape without
        its last dim (as :func:`kvattn.decode.xqa_batch_decode_with_kv_cache`'s: sinks excluded,
        ``-inf`` for an empty request).
    lse : torch.Tensor float32, keyword-only, optional
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
    >>> # Speculative decoding: 3 drafts a request, [B, 1, 3, Hq, D], causal among them.
    >>> q3 = torch.randn(B, 1, 3, Hq, D, dtype=torch.float16)
    >>> out3 = torch.empty_like(q3)
    >>> kvattn.xqa.xqa(q3, k, v, table, lens, out3, torch.zeros(1 << 20, dtype=torch.uint8),
    ...                torch.zeros(8, dtype=torch.uint32), Hkv, page, q_seq_len=3)
    """
    if isinstance(kv_layout, int) and not isinstance(kv_layout, bool):  # the seed's sm_count at position 14
        if sm_count is not None:
            raise TypeError(f"kv_layout: an int here is the seed's sm_count, but sm_count={sm_count!r} is given too")
        kv_layout, sm_count = "NHD", kv_layout
    args = (q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores, num_kv_heads, page_size,
            sinks, q_scale, kv_scale, sliding_win_size, sm_count, kv_layout, return_lse, lse, enable_pdl,
            rcp_out_scale, q_seq_len, mask, q_cu_seq_lens, k_sf_cache, v_sf_cache)
    try:
        if q_cu_seq_lens is not None:  # ragged drafts run the ordinary way (see decode.xqa_batch_decode_with_kv_cache)
            return _xqa(*args)
        return _CACHE.run(args, lambda: _xqa(*args))
    except (TypeError, ValueError) as error:
        _SWAPS.add(error, args)
        raise


# Calls replayed from their metadata (kvattn.runtime.callcache).
_CACHE = CallCache("xqa")


def _xqa(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores, num_kv_heads, page_size,
         sinks, q_scale, kv_scale, sliding_win_size, sm_count, kv_layout, return_lse, lse, enable_pdl=None,
         rcp_out_scale=1.0, q_seq_len=1, mask=None, q_cu_seq_lens=None, k_sf_cache=None, v_sf_cache=None):
    """:func:`xqa`, the ordinary way: validation, then the kernels' entry (``kvattn.ops.decode.op``:
    the launch is three calls from here, docs/extending.md "Layers") or the reference."""
    q_len = check_int(q_seq_len, "q_seq_len", minimum=1)
    ragged = q_cu_seq_lens is not None
    ndim = 3 if ragged else (5 if q_len > 1 else 4)
    form = {3: "[total_q, Hq, D] (packed, with q_cu_seq_lens)", 4: "[B, 1, Hq, D]",
            5: "[B, 1, q_seq_len, Hq, D] (q_seq_len > 1)"}[ndim]
    check_tensor(q, "q", dtypes=HALF_DTYPES, contiguous_last=True)
    if q.dim() != ndim:
        raise ValueError(f"q: expected shape {form}, got {list(q.shape)}")
    device, shape, q_dtype = q.device, q.shape, q.dtype
    if ndim > 3 and shape[1] != 1:
        raise ValueError(f"q: expected beam_width 1 (shape {form}), got {list(shape)}")
    if ndim == 5 and shape[2] != q_len:
        raise ValueError(f"q: expected q_seq_len={q_len} rows a request in dim 2, got {list(shape)}")
    head_dim = check_head_dim(shape[-1], "q")
    num_heads = shape[-2]
    num_kv_heads = check_int(num_kv_heads, "num_kv_heads", minimum=1)
    page_size = check_int(page_size, "page_size", choices=XQA_PAGE_SIZES)
    layout = check_layout(kv_layout)
    group = check_query_heads(num_heads, "q", num_kv_heads)
    nvfp4 = isinstance(k_cache, torch.Tensor) and k_cache.dtype == NVFP4_DTYPE
    stored = head_dim // 2 if nvfp4 else head_dim
    what = "head_dim / 2 (NVFP4 packs 2 values a byte)" if nvfp4 else "head_dim (the query's)"
    k = _cache_pages(k_cache, "k_cache", num_kv_heads, page_size, stored, layout, q_dtype, device, what=what)
    v = _cache_pages(v_cache, "v_cache", num_kv_heads, page_size, stored, layout, q_dtype, device, what=what)
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
    k_sf = v_sf = None
    if nvfp4:
        if head_dim % NVFP4_BLOCK:
            raise ValueError(f"k_cache: NVFP4 needs head_dim a multiple of {NVFP4_BLOCK}, got {head_dim}")
        sf_dtypes = (torch.uint8, FP8_DTYPE)
        for t, n in ((k_sf_cache, "k_sf_cache"), (v_sf_cache, "v_sf_cache")):
            if t is None:
                raise ValueError(f"{n}: expected the block scales of an NVFP4 (uint8) cache, got None")
        k_sf, v_sf = (_cache_pages(t, n, num_kv_heads, page_size, head_dim // NVFP4_BLOCK, layout, q_dtype, device,
                                   dtypes=sf_dtypes, what="head_dim / 16")
                      for t, n in ((k_sf_cache, "k_sf_cache"), (v_sf_cache, "v_sf_cache")))
        k_sf, v_sf = (t.view(FP8_DTYPE) if t.dtype == torch.uint8 else t for t in (k_sf, v_sf))
        for t, pages, n in ((k_sf, k, "k_sf_cache"), (v_sf, v, "v_sf_cache")):
            if t.shape[0] < pages.shape[0]:
                raise ValueError(f"{n}: expected scales of at least {pages.shape[0]} pages, got {t.shape[0]}")
    else:
        for t, n in ((k_sf_cache, "k_sf_cache"), (v_sf_cache, "v_sf_cache")):
            if t is not None:
                raise ValueError(f"{n}: block scales are only for NVFP4 (uint8) caches, got a {kv_dtype} cache")
    check_tensor(page_table, "page_table", dtypes=(torch.int32,), ndim=2, device=device)
    batch = page_table.shape[0] if ragged else shape[0]
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table: expected {batch} rows (one per request), got {page_table.shape[0]}")
    check_tensor(seq_lens, "seq_lens", dtypes=(torch.uint32, torch.int32), device=device)
    if seq_lens.numel() != batch:
        raise ValueError(f"seq_lens: expected shape [{batch}, 1], got {list(seq_lens.shape)}")
    if ragged:
        check_tensor(q_cu_seq_lens, "q_cu_seq_lens", dtypes=(torch.int32, torch.uint32), ndim=1, device=device)
        check_shape(q_cu_seq_lens, "q_cu_seq_lens", (batch + 1,))
    quantised = kv_dtype in (FP8_DTYPE, NVFP4_DTYPE)
    check_out(output, "output", shape, (q_dtype, FP8_DTYPE, torch.float32), device)
    if output.dtype == FP8_DTYPE and not quantised:
        raise TypeError(f"output: a float8_e4m3fn output needs a quantised (fp8 or NVFP4) cache, "
                        f"got a {kv_dtype} cache")
    check_workspace(workspace_buffer, "workspace_buffer", device)
    check_tensor(semaphores, "semaphores", dtypes=(torch.uint32,), device=device)
    if sinks is not None:
        check_tensor(sinks, "sinks", dtypes=(torch.float32,), device=device)
        if tuple(sinks.shape) != (num_kv_heads, group):
            raise ValueError(f"sinks: expected shape [{num_kv_heads}, {group}], got {list(sinks.shape)}")
        sinks = check_sinks(sinks, "sinks", num_heads, device)
    win = check_int(sliding_win_size, "sliding_win_size", minimum=0)
    if sm_count is not None:
        sm_count = check_int(sm_count, "sm_count", minimum=1)
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl: expected a bool or None, got {type(enable_pdl).__name__}")
    if isinstance(rcp_out_scale, bool) or not isinstance(rcp_out_scale, (int, float)):
        raise TypeError(f"rcp_out_scale: expected a float, got {type(rcp_out_scale).__name__}")
    if not math.isfinite(rcp_out_scale) or rcp_out_scale == 0:
        raise ValueError(f"rcp_out_scale: expected a finite non-zero float, got {rcp_out_scale!r}")
    words = 2 * ((q_len + 31) // 32)
    if mask is not None:
        check_tensor(mask, "mask", dtypes=(torch.uint16,), device=device)
        check_shape(mask, "mask", (shape[0], words) if ragged else (batch, q_len, words))
    qs = to_scale(q_scale, "q_scale", device)
    if quantised:
        kv_eff = to_scale(kv_scale, "kv_scale", device, allow_none_as=1.0)
    else:
        if kv_scale is not None:
            to_scale(kv_scale, "kv_scale", device)
        kv_eff = Scale(1.0)
    logit = qs.times(kv_eff).times(1.0 / math.sqrt(head_dim))
    out_scale = kv_eff.times(float(rcp_out_scale)) if output.dtype == FP8_DTYPE else kv_eff

    lse = check_lse_out(lse, return_lse, 0, 0, device, shape=tuple(shape[:-1]))

    # The rows as the batch decode takes them: [B * q_seq_len or total_q, Hq, D] (views).
    rows = shape[0] * (q_len if ndim == 5 else 1)
    q_rows = _rows_view(q, (rows, num_heads, head_dim))
    if q_rows is None:
        q_rows = q.reshape(rows, num_heads, head_dim)
    out_rows = _rows_view(output, (rows, num_heads, head_dim))
    out_tmp = out_rows is None  # (an output whose strides allow no such view: written through a copy)
    if out_tmp:
        out_rows = torch.empty((rows, num_heads, head_dim), dtype=output.dtype, device=device)
    lse_rows = None
    if lse is not None:
        lse_rows = _rows_view(lse, (rows, num_heads))
        if lse_rows is None:
            raise ValueError(f"lse: expected strides that view it as [{rows}, {num_heads}] rows, got {lse.stride()}")

    kv = PagedKV(k, v, page_table, page_table, head_dim, head_dim, k_sf, v_sf)
    debug_check_pages(kv, seq_lens, "page_table", pool_name="k_cache", q_len=1 if ragged else q_len,
                      scales=(("q_scale", qs.tensor), ("kv_scale", kv_eff.tensor)))
    if ragged:
        decode.debug_check_drafts(q_cu_seq_lens, seq_lens, shape[0], q_len, q_len_name="q_seq_len")
    window_left = win - 1 if win > 0 else -1
    seq_lens = seq_lens.reshape(batch)
    ops = _backend.triton_entry("batch_decode", device=device)
    if ops is None:
        reference.batch_decode(q_rows, kv, seq_lens, out_rows, q_len=q_len, logit_scale=logit, out_scale=out_scale,
                               window_left=window_left, sinks=sinks, mask=mask, lse=lse_rows,
                               q_cu_seq_lens=q_cu_seq_lens)
    else:
        check_interpretable(("k_cache", kv.k.dtype))
        # (decode.py and xqa.py run the same rows: ragged drafts padded around the decode, ops.decode.ragged)
        if not ragged:
            call_rows = (q_rows, mask, out_rows, lse_rows)
        else:
            call_rows = ops.ragged_rows(q_rows, q_cu_seq_lens, mask, out_rows, lse_rows, q_len, window_left)
            if call_rows is not None:
                ops.ragged_pack(q_rows, q_cu_seq_lens, mask, call_rows[0], call_rows[1], q_len, window_left)
        if call_rows is not None:  # (None: ragged drafts of no row or no request: nothing to launch)
            call_q, call_mask, call_out, call_lse = call_rows
            ops.batch_decode(call_q, kv, seq_lens, call_mask, sinks, logit, out_scale, call_out, workspace_buffer,
                             q_len, kv.capacity, window_left, sm_count, bool(enable_pdl), call_lse, None)
            if ragged:
                ops.ragged_unpack(call_out, call_lse, q_cu_seq_lens, out_rows, lse_rows, q_len)
    if out_tmp:
        output.copy_(out_rows.view(shape))
    return lse


_SWAPS = SwapHints(
    _xqa, q=looks("float", (4,)), k_cache=looks("float", (2, 4)), page_table=looks("int", (2,)),
    seq_lens=looks("int uint", (1, 2)), workspace_buffer=looks("byte", (1,)))


class _CallableModule(types.ModuleType):
    """Lets ``kvattn.xqa(...)`` call the function while ``kvattn.xqa.xqa`` stays the seed's path."""

    def __call__(self, *args, **kwargs):
        return xqa(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
