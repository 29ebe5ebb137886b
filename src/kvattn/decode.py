"""Decode attention: paged batch decode and single-request decode.

Both functions keep FlashInfer's signatures exactly; what they compute is stated
in docs/semantics.md.
"""

from __future__ import annotations

import math
from typing import Literal, Optional, Tuple, Union, overload

import torch

from .runtime import backend as _backend
from . import reference
from .runtime.callcache import CallCache
from ._inputs import (
    HALF_DTYPES,
    Scale,
    check_head_dim,
    check_int,
    check_half_match,
    check_interpretable,
    check_layout,
    check_max_seq_len,
    check_lse_out,
    check_out,
    check_paged_heads,
    check_query_heads,
    check_seq_lens,
    check_shape,
    check_sinks,
    check_tensor,
    check_window,
    check_workspace,
    debug_check_pages,
    SwapHints,
    looks,
    paged_kv_from_cache,
    to_scale,
)
from ._formats_table import QUANTISED_DTYPES
from .formats import FP8_DTYPE

POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")


def xqa_batch_decode_with_kv_cache(
    query: torch.Tensor,
    kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
    workspace_buffer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    bmm1_scale: Union[float, torch.Tensor] = 1.0,
    bmm2_scale: Union[float, torch.Tensor] = 1.0,
    window_left: int = -1,
    out: Optional[torch.Tensor] = None,
    sinks: Optional[torch.Tensor] = None,
    kv_layout: str = "NHD",
    enable_pdl: bool = None,
    q_len_per_req: Optional[int] = 1,
    o_scale: Optional[float] = 1.0,
    mask: Optional[torch.Tensor] = None,
    kv_cache_sf: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
    q_cu_seq_lens: Optional[torch.Tensor] = None,
    *,
    return_lse: bool = False,
    lse: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Paged batch decode: each request's ``q_len_per_req`` query tokens (or, with
    ``q_cu_seq_lens``, its own number of them) over its paged KV cache.

    Parameters
    ----------
    query : torch.Tensor ``[B * q_len_per_req, Hq, D]``, float16 or bfloat16
        Rows request-major, then draft index. ``D`` in 64, 128, 256.
    kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        One tensor ``[P, 2 or 1, page_size, Hkv, D]`` (NHD) / ``[P, 2 or 1, Hkv, page_size, D]`` (HND)
        (plane 1 of size 1: K and V are the same buffer), or a ``(K, V)`` tuple of
        ``[P, page_size, Hkv, D]`` / ``[P, Hkv, page_size, D]``. Dtype: the query's, float8_e4m3fn, or
        uint8 NVFP4 (last dim ``D / 2``, with ``kv_cache_sf``). Only the last dim must be contiguous.
    workspace_buffer : torch.Tensor uint8
        Scratch: its first 16 KB are the arrival counters of the split-KV merge (every call leaves
        them at zero), the split-KV partials follow. Zero it before its first use, and give calls
        that may run at the same time (other streams) workspaces of their own. Nothing else is
        allocated when ``out`` is given. At least 16400 bytes; :func:`kvattn.workspace_size` gives
        the bytes with which it never limits the split count (docs/semantics.md, "Workspace").
    block_tables : torch.Tensor int32 ``[B, pages_per_seq]``
    seq_lens : torch.Tensor int32 or uint32 ``[B]``
        KV length of each request, including its ``q_len_per_req`` new tokens. 0 gives a zero output.
    max_seq_len : int
        Host-side upper bound of ``seq_lens`` (sizes the launch); at most ``pages_per_seq * page_size``.
    bmm1_scale, bmm2_scale : float or one-element float32 tensor
        Logit multiplier (put ``1/sqrt(D)`` and q/k dequant scales here) and output multiplier.
    window_left : int
        ``w >= 0``: a query at position ``p`` sees keys ``p - w .. p``; -1: no window.
    out : torch.Tensor, optional ``[B * q_len_per_req, Hq, D]``
        The query's dtype, float8_e4m3fn (needs an fp8 cache), or float32 (unrounded partial
        results, e.g. to merge with :func:`kvattn.merge_states`).
    sinks : torch.Tensor float32 ``[Hq]``, optional
    kv_layout : {"NHD", "HND"}
    enable_pdl : bool, optional
        On Hopper, launch the kernel as a programmatic dependent launch: it may start while the
        previous kernel on the stream finishes, and waits for it before reading any input. (The
        split-KV combine always follows its split kernel that way there.) Ignored elsewhere.
    q_len_per_req : int
        Query tokens per request (speculative decoding); None means 1.
    o_scale : float
        Output scale: the result is ``bmm2 * o_scale * softmax(...) V``, stored divided by
        ``o_scale`` when ``out`` is fp8.
    mask : torch.Tensor uint16 ``[B, q_len_per_req, 2 * ceil(q_len_per_req / 32)]``, optional
        Bit ``c % 16`` of word ``c // 16`` of row ``r`` lets draft row ``r`` see draft token ``c``;
        None means causal among the drafts.
    kv_cache_sf : torch.Tensor or tuple, optional
        NVFP4 e4m3 block scales, the data's shape with last dim ``D / 16``. On GPUs with fp8
        conversion (sm_89+), caches whose code and scale rows start on 4-byte boundaries (any
        contiguous cache with D a multiple of 64) are read as 32-bit words, about twice as fast
        as the byte path other layouts take.
    q_cu_seq_lens : torch.Tensor int32 or uint32 ``[B + 1]``, optional
        FlashInfer 0.7.2.post1: ragged drafts. Request ``b`` owns query rows ``q_cu_seq_lens[b] :
        q_cu_seq_lens[b + 1]`` (``q_b`` of them, 0 to ``q_len_per_req``, which is then the
        maximum); row ``r`` sits at position ``L - q_b + r``. ``query``, ``out`` and the LSE are
        packed ``[total_q, Hq, ...]``, ``mask`` (if any) ``[total_q, 2 * ceil(q_len_per_req / 32)]``
        with each request's rows over its own drafts. ``B`` is ``block_tables.shape[0]``. The
        offsets are read on the device only (checked with ``KVATTN_DEBUG=1``: starting at 0,
        non-decreasing, ending at ``total_q``, no run past ``q_len_per_req`` or the request's length).
        The kernels run the rows padded to ``q_len_per_req`` a request, in ``B * q_len_per_req``-row
        temporaries allocated by the call (even with ``out`` given).
    return_lse : bool, keyword-only
        Also return each row's base-2 log-sum-exp of its scaled logits over its visible keys,
        float32 ``[B * q_len_per_req, Hq]``: ``-inf`` for a row that sees no key (an empty
        request), and sinks never included (docs/semantics.md), so ``(out, lse)`` of a call without sinks is an
        attention state :func:`kvattn.merge_states` merges exactly (see :mod:`kvattn.merge` for
        applying sinks once after a merge).
    lse : torch.Tensor float32 ``[B * q_len_per_req, Hq]``, keyword-only, optional
        Where to write the LSE (with ``return_lse``; its last dim contiguous); allocated if None.

    Returns
    -------
    torch.Tensor ``[B * q_len_per_req, Hq, D]``, and with ``return_lse`` the LSE

    Examples
    --------
    >>> import torch, kvattn
    >>> B, Hq, Hkv, D, page = 2, 8, 2, 128, 16
    >>> q = torch.randn(B, Hq, D, dtype=torch.bfloat16)
    >>> kv = torch.randn(8, 2, page, Hkv, D, dtype=torch.bfloat16)
    >>> tables = torch.randperm(8, dtype=torch.int32).view(B, 4)
    >>> lens = torch.tensor([37, 64], dtype=torch.int32)
    >>> ws = torch.zeros(1 << 20, dtype=torch.uint8)
    >>> o = kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 64, bmm1_scale=D ** -0.5)
    >>> o.shape
    torch.Size([2, 8, 128])
    >>> o, lse = kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 64, bmm1_scale=D ** -0.5,
    ...                                                       return_lse=True)
    >>> lse.shape, lse.dtype
    (torch.Size([2, 8]), torch.float32)
    >>> # Ragged drafts (FlashInfer 0.7.2.post1): 3 draft rows for request 0, 1 for request 1, packed.
    >>> drafts = torch.randn(4, Hq, D, dtype=torch.bfloat16)
    >>> cu = torch.tensor([0, 3, 4], dtype=torch.int32)
    >>> kvattn.decode.xqa_batch_decode_with_kv_cache(drafts, kv, ws, tables, lens, 64, bmm1_scale=D ** -0.5,
    ...                                              q_len_per_req=3, q_cu_seq_lens=cu).shape
    torch.Size([4, 8, 128])
    """
    args = (query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale, bmm2_scale,
            window_left, out, sinks, kv_layout, enable_pdl, q_len_per_req, o_scale, mask, kv_cache_sf, return_lse, lse,
            q_cu_seq_lens)
    try:
        if q_cu_seq_lens is not None:
            # Ragged drafts run the ordinary way: a replayed call left the output unwritten on an H200
            # (tests/ops/decode/test_ragged_drafts.py, graph replay then eager).
            return _batch_decode(*args[:17], return_lse=return_lse, lse=lse, q_cu_seq_lens=q_cu_seq_lens)
        return _BATCH_CACHE.run(args, lambda: _batch_decode(*args[:17], return_lse=return_lse, lse=lse))
    except (TypeError, ValueError) as error:
        _BATCH_SWAPS.add(error, args[:17])
        raise


# Calls replayed from their metadata (kvattn.runtime.callcache; lab/notes/host-path.md "Host path: calls
# replayed from their metadata").
_BATCH_CACHE = CallCache("xqa_batch_decode_with_kv_cache")
_SINGLE_CACHE = CallCache("single_decode_with_kv_cache", capture_sensitive=True)


def _batch_decode(
    query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len, bmm1_scale=1.0, bmm2_scale=1.0,
    window_left=-1, out=None, sinks=None, kv_layout="NHD", enable_pdl=None, q_len_per_req=1, o_scale=1.0,
    mask=None, kv_cache_sf=None, *, return_lse=False, lse=None, kv_start=None, q_cu_seq_lens=None,
    local_slice=False,
):
    """:func:`xqa_batch_decode_with_kv_cache`, and ``kv_start`` (int32 ``[B]``, on the query's
    device, optional): request ``b`` attends to no key before ``kv_start[b]``, which keeps a
    request's keys a window cuts off out of a local slice (:mod:`kvattn.distributed`);
    ``local_slice``: ``seq_lens`` are a rank's local lengths, which may hold fewer keys than the
    drafts (those lie on other ranks).

    Validation, then the kernels' entry (``kvattn.ops.decode.op``: the launch is three calls from
    here, docs/extending.md "Layers") or the reference."""
    check_tensor(query, "query", dtypes=HALF_DTYPES, ndim=3, contiguous_last=True)
    device, shape = query.device, query.shape
    head_dim = check_head_dim(shape[2], "query")
    q_len = 1 if q_len_per_req is None else check_int(q_len_per_req, "q_len_per_req", minimum=1)
    ragged = q_cu_seq_lens is not None
    if ragged:
        check_tensor(block_tables, "block_tables", ndim=(2, 3))
        batch = block_tables.shape[0]
        check_tensor(q_cu_seq_lens, "q_cu_seq_lens", dtypes=(torch.int32, torch.uint32), ndim=1, device=device)
        check_shape(q_cu_seq_lens, "q_cu_seq_lens", (batch + 1,))
    elif shape[0] % q_len:
        raise ValueError(
            f"q_len_per_req: expected a divisor of query.shape[0]={shape[0]} (B * q_len_per_req rows), got {q_len}"
        )
    else:
        batch = shape[0] // q_len
    kv = paged_kv_from_cache(
        kv_cache, block_tables, kv_layout, head_dim, device,
        kv_sf=kv_cache_sf, allowed_dtypes=(query.dtype, *QUANTISED_DTYPES), query_dtype=query.dtype,
    )
    check_paged_heads(shape[1], "query", kv, kv_cache, kv_layout)
    if block_tables.shape[0] != batch:
        raise ValueError(
            f"block_tables: expected {batch} rows (query rows / q_len_per_req), got {block_tables.shape[0]}"
        )
    seq_lens = check_seq_lens(seq_lens, "seq_lens", batch, device)
    max_seq_len = check_max_seq_len(max_seq_len, "max_seq_len", kv)
    check_workspace(workspace_buffer, "workspace_buffer", device)
    window_left = check_window(window_left)
    sinks = check_sinks(sinks, "sinks", shape[1], device)
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl: expected a bool or None, got {type(enable_pdl).__name__}")
    if o_scale is None:
        o_scale = 1.0
    if isinstance(o_scale, bool) or not isinstance(o_scale, (int, float)) or not math.isfinite(o_scale) or o_scale == 0:
        raise ValueError(f"o_scale: expected a finite non-zero float, got {o_scale!r}")
    if mask is not None:
        check_tensor(mask, "mask", dtypes=(torch.uint16,), device=device)
        words = 2 * ((q_len + 31) // 32)
        check_shape(mask, "mask", (shape[0], words) if ragged else (batch, q_len, words))
    logit = to_scale(bmm1_scale, "bmm1_scale", device)
    bmm2 = to_scale(bmm2_scale, "bmm2_scale", device)

    if out is None:
        out = torch.empty_like(query)
        out_fp8 = False
    else:
        check_out(out, "out", shape, (query.dtype, FP8_DTYPE, torch.float32), device)
        out_fp8 = out.dtype == FP8_DTYPE
        if out_fp8 and kv.kv_format != "fp8":
            raise TypeError(f"out: a float8_e4m3fn output needs an fp8 cache, got a {kv.kv_format} cache")
    # Stored value: o_real / o_scale for an fp8 output, o_real otherwise (o_real = bmm2 * o_scale * o).
    out_scale = bmm2 if out_fp8 else bmm2.times(o_scale)
    lse = check_lse_out(lse, return_lse, shape[0], shape[1], device)
    if kv_start is not None:
        check_tensor(kv_start, "kv_start", dtypes=(torch.int32,), device=device)
        check_shape(kv_start, "kv_start", (batch,))
    debug_check_pages(kv, seq_lens, max_len=max_seq_len, q_len=1 if ragged or local_slice else q_len,
                      scales=(("bmm1_scale", logit.tensor), ("bmm2_scale", bmm2.tensor)))
    if ragged:
        debug_check_drafts(q_cu_seq_lens, seq_lens, shape[0], q_len)
    ops = _backend.triton_entry("batch_decode", device=device)
    if ops is None:
        reference.batch_decode(query, kv, seq_lens, out, q_len=q_len, logit_scale=logit, out_scale=out_scale,
                               window_left=window_left, sinks=sinks, mask=mask, lse=lse, kv_start=kv_start,
                               q_cu_seq_lens=q_cu_seq_lens)
        return (out, lse) if return_lse else out
    check_interpretable(("kv_cache", kv.k.dtype))
    # (decode.py and xqa.py run the same rows: ragged drafts padded around the decode, ops.decode.ragged)
    if not ragged:
        call_rows = (query, mask, out, lse)
    else:
        call_rows = ops.ragged_rows(query, q_cu_seq_lens, mask, out, lse, q_len, window_left)
        if call_rows is not None:
            ops.ragged_pack(query, q_cu_seq_lens, mask, call_rows[0], call_rows[1], q_len, window_left)
    if call_rows is not None:  # (None: ragged drafts of no row or no request: nothing to launch)
        call_q, call_mask, call_out, call_lse = call_rows
        ops.batch_decode(call_q, kv, seq_lens, call_mask, sinks, logit, out_scale, call_out, workspace_buffer, q_len,
                         max_seq_len, window_left, None, bool(enable_pdl), call_lse, kv_start)
        if ragged:
            ops.ragged_unpack(call_out, call_lse, q_cu_seq_lens, out, lse, q_len)
    return (out, lse) if return_lse else out


_BATCH_SWAPS = SwapHints(
    _batch_decode, query=looks("float", (3,)), kv_cache=looks("float byte", (5,), (4,)),
    block_tables=looks("int", (2,)), seq_lens=looks("int uint", (1,)), workspace_buffer=looks("byte", (1,)))


def debug_check_drafts(q_cu_seq_lens: torch.Tensor, seq_lens: torch.Tensor, total: int, q_len: int,
                       q_len_name: str = "q_len_per_req") -> None:
    """Device-value checks of ragged draft offsets (synchronising): only with ``KVATTN_DEBUG=1``."""
    from .runtime import env as _env
    from ._inputs.device_checks import _debug_check_cum, _lengths_as_read

    if not _env.debug_checks():
        return
    cu = q_cu_seq_lens.reshape(-1)
    cu = (cu.view(torch.int32) if cu.dtype == torch.uint32 else cu).to(torch.int64).cpu()
    runs = _debug_check_cum(cu, "q_cu_seq_lens", total, "the query's rows")
    if bool((runs > q_len).any()):
        b = int((runs > q_len).nonzero()[0, 0])
        raise ValueError(f"q_cu_seq_lens: request {b} has {int(runs[b])} query rows, more than "
                         f"{q_len_name}={q_len} (the maximum)")
    lens, _ = _lengths_as_read(seq_lens)
    short = (runs > 0) & (lens < runs)
    if bool(short.any()):
        b = int(short.nonzero()[0, 0])
        raise ValueError(f"seq_lens: request {b} has length {int(lens[b])}, fewer than its {int(runs[b])} query rows "
                         f"(a length counts them)")


@overload
def single_decode_with_kv_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str = ..., pos_encoding_mode: str = ...,
    use_tensor_cores: bool = ..., q_scale: Optional[float] = ..., k_scale: Optional[float] = ...,
    v_scale: Optional[float] = ..., window_left: int = ..., logits_soft_cap: Optional[float] = ...,
    sm_scale: Optional[float] = ..., rope_scale: Optional[float] = ..., rope_theta: Optional[float] = ...,
    return_lse: Literal[False] = ..., *, out: Optional[torch.Tensor] = ..., lse: Optional[torch.Tensor] = ...,
) -> torch.Tensor: ...


@overload
def single_decode_with_kv_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_layout: str = ..., pos_encoding_mode: str = ...,
    use_tensor_cores: bool = ..., q_scale: Optional[float] = ..., k_scale: Optional[float] = ...,
    v_scale: Optional[float] = ..., window_left: int = ..., logits_soft_cap: Optional[float] = ...,
    sm_scale: Optional[float] = ..., rope_scale: Optional[float] = ..., rope_theta: Optional[float] = ...,
    return_lse: Literal[True] = ..., *, out: Optional[torch.Tensor] = ..., lse: Optional[torch.Tensor] = ...,
) -> Tuple[torch.Tensor, torch.Tensor]: ...


def _optional_float(value, name: str, default: float, *, positive: bool = False) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a finite float or None, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite float or None, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name}: expected a value > 0, got {value}")
    return float(value)


def single_decode_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_layout: str = "NHD",
    pos_encoding_mode: str = "NONE",
    use_tensor_cores: bool = False,
    q_scale: Optional[float] = None,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    window_left: int = -1,
    logits_soft_cap: Optional[float] = None,
    sm_scale: Optional[float] = None,
    rope_scale: Optional[float] = None,
    rope_theta: Optional[float] = None,
    return_lse: bool = False,
    *,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Decode one query token of one request over contiguous K/V.

    Parameters
    ----------
    q : torch.Tensor ``[Hq, D]``, float16 or bfloat16; ``D`` in 64, 128, 256
    k, v : torch.Tensor ``[L, Hkv, D]`` (NHD) or ``[Hkv, L, D]`` (HND)
        The query's dtype or float8_e4m3fn (raw values; dequant through ``k_scale``/``v_scale``).
    kv_layout : {"NHD", "HND"}
    pos_encoding_mode : {"NONE", "ROPE_LLAMA", "ALIBI"}
        ROPE_LLAMA rotates q (at position ``L - 1``) and each key (at its index) inside the kernel;
        ALIBI adds ``slope_h * j`` to the logit of key ``j``.
    use_tensor_cores : bool
        Picks the tile shape; results agree up to rounding.
    q_scale, k_scale, v_scale : float, optional
        Logits are ``sm_scale * q_scale * k_scale * q.k``; ``v_scale`` multiplies the output.
    window_left : int
        ``w >= 0``: the query sees keys ``L - 1 - w .. L - 1``; -1: all keys.
    logits_soft_cap : float, optional
        ``c > 0``: logits become ``c * tanh(s / c)`` (after the ALiBi bias).
    sm_scale : float, optional
        Default ``1 / sqrt(D)``.
    rope_scale, rope_theta : float, optional
        Defaults 1 and 1e4: ``freq_i = theta^(-2i/D) / rope_scale``.
    return_lse : bool
        Also return the base-2 log-sum-exp of the logits, float32 ``[Hq]`` (``-inf`` for
        ``L == 0``): with the output, an attention state :func:`kvattn.merge_states` merges exactly.
    out : torch.Tensor ``[Hq, D]``, keyword-only, optional
        Where to write the output: q's dtype, or float32 (unrounded, e.g. a partial result to
        merge). Allocated if None.
    lse : torch.Tensor float32 ``[Hq]``, keyword-only, optional
        Where to write the LSE (needs ``return_lse``).

    Returns
    -------
    torch.Tensor ``[Hq, D]`` in q's dtype (``out``'s), and with ``return_lse`` a float32 ``[Hq]`` LSE.

    Notes
    -----
    On the GPU a long sequence is split across programs, and the last program of each head to
    finish merges the splits (one launch). Having no workspace argument, the call keeps the
    arrival counters itself, at zero between calls: one small set per device and stream, and for a
    call captured in a CUDA graph a set of its own, so graphs may replay concurrently.

    Examples
    --------
    >>> import torch, kvattn
    >>> q = torch.randn(32, 128, dtype=torch.float16)
    >>> k = torch.randn(4096, 32, 128, dtype=torch.float16)
    >>> v = torch.randn(4096, 32, 128, dtype=torch.float16)
    >>> o = kvattn.decode.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA")
    >>> o.shape
    torch.Size([32, 128])
    """
    args = (q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale, window_left,
            logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse, out, lse)
    return _SINGLE_CACHE.run(args, lambda: _single_decode(*args))


def _single_decode(q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale, window_left,
                   logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse, out, lse):
    """:func:`single_decode_with_kv_cache`, the ordinary way: validation, then the kernels' entry
    (``kvattn.ops.decode.op``: the launch is three calls from here) or the reference."""
    check_tensor(q, "q", dtypes=HALF_DTYPES, ndim=2, contiguous_last=True)
    device = q.device
    head_dim = check_head_dim(q.shape[-1], "q")
    layout = check_layout(kv_layout)
    if isinstance(k, torch.Tensor):  # (a v unlike k is reported as such)
        check_half_match(q.dtype, "q", k.dtype, "k")
    for t, n in ((k, "k"), (v, "v")):
        check_tensor(t, n, dtypes=(q.dtype, FP8_DTYPE), ndim=3, device=device, contiguous_last=True)
    if k.dtype != v.dtype:
        raise TypeError(f"v: expected the dtype of k ({k.dtype}), got {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"v: expected the shape of k {list(k.shape)}, got {list(v.shape)}")
    k_nhd, v_nhd = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    if k_nhd.shape[-1] != head_dim:
        raise ValueError(f"k: expected head_dim {head_dim} (the query's), got {k_nhd.shape[-1]}")
    # The other layout swaps k's first two dims: [L, Hkv, D] and [Hkv, L, D].
    check_query_heads(q.shape[0], "q", k_nhd.shape[1], kv_name="k", kv_shape=k.shape, layout=layout,
                      other_heads=k_nhd.shape[0])
    mode = pos_encoding_mode.upper() if isinstance(pos_encoding_mode, str) else None
    if mode not in POS_ENCODING_MODES:
        raise ValueError(f"pos_encoding_mode: expected one of {POS_ENCODING_MODES}, got {pos_encoding_mode!r}")
    pos_encoding_mode = mode
    if not isinstance(use_tensor_cores, bool):
        raise TypeError(f"use_tensor_cores: expected a bool, got {type(use_tensor_cores).__name__}")
    window_left = check_window(window_left)
    soft_cap = _optional_float(logits_soft_cap, "logits_soft_cap", 0.0)
    if soft_cap < 0:
        raise ValueError(f"logits_soft_cap: expected a value >= 0 (0 or None: off), got {soft_cap}")
    sm = _optional_float(sm_scale, "sm_scale", 1.0 / math.sqrt(head_dim))
    logit = Scale(sm * _optional_float(q_scale, "q_scale", 1.0) * _optional_float(k_scale, "k_scale", 1.0))
    out_scale = Scale(_optional_float(v_scale, "v_scale", 1.0))
    rope_scale = _optional_float(rope_scale, "rope_scale", 1.0, positive=True)
    rope_theta = _optional_float(rope_theta, "rope_theta", 1e4, positive=True)
    lse = check_lse_out(lse, return_lse, 1, q.shape[0], device, shape=(q.shape[0],))
    if out is not None:
        check_out(out, "out", tuple(q.shape), (q.dtype, torch.float32), device)

    ops = _backend.triton_entry("single_decode", device)
    if ops is None:
        o, ref_lse = reference.single_decode(
            q, k_nhd, v_nhd, logit_scale=logit, out_scale=out_scale, pos_encoding_mode=pos_encoding_mode,
            window_left=window_left, logits_soft_cap=soft_cap or None, rope_scale=rope_scale, rope_theta=rope_theta,
        )
        out = o.to(q.dtype) if out is None else out.copy_(o)
        lse = ref_lse if lse is None else lse.copy_(ref_lse)
        return (out, lse) if return_lse else out
    check_interpretable(("k", k.dtype))
    rope, alibi = pos_encoding_mode == "ROPE_LLAMA", pos_encoding_mode == "ALIBI"
    if out is None and lse is None and torch.compiler.is_compiling():  # (traced: the functional op)
        out, lse = ops.single_decode(q, k_nhd, v_nhd, logit, out_scale, rope, alibi, window_left, soft_cap,
                                     rope_scale, rope_theta, use_tensor_cores)
    else:
        if out is None:  # (eager: the output alone, no LSE the caller drops)
            out = torch.empty_like(q, memory_format=torch.contiguous_format)
        # (no LSE asked for: the kernel stores none, and nothing is allocated with out given)
        ops.single_decode_into(q, k_nhd, v_nhd, logit, out_scale, rope, alibi, window_left, soft_cap, rope_scale,
                               rope_theta, use_tensor_cores, out, lse)
    return (out, lse) if return_lse else out
