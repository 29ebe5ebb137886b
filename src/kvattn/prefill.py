"""Paged causal context attention (prefill) of ragged query batches."""

from __future__ import annotations

import math
from typing import List, Optional, Tuple, Union

import torch

from .runtime import backend as _backend
from . import reference
from .runtime.callcache import CallCache
from ._inputs import (
    HALF_DTYPES,
    check_int,
    check_interpretable,
    check_last_dim_contiguous,
    check_lse_out,
    check_out,
    check_paged_heads,
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
from .formats import FP8_DTYPE, NVFP4_BLOCK, FP4Tensor, quantize_nvfp4_output, round_up
from .reference.core import store_output

PREFILL_HEAD_DIMS = (64, 128, 256)
_DTYPE_NAMES = {
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float8_e4m3fn": FP8_DTYPE, "fp8": FP8_DTYPE, "e4m3": FP8_DTYPE,
}
_OUT_DTYPES = (torch.float16, torch.bfloat16, FP8_DTYPE)


def _resolve_out_dtype(out, out_dtype, query_dtype):
    """``"nvfp4"`` or a torch dtype: ``out_dtype``, else ``out``'s, else the query's."""
    if out_dtype is not None:
        if isinstance(out_dtype, str):
            key = out_dtype.lower().replace("torch.", "")
            if key == "nvfp4":
                return "nvfp4"
            if key not in _DTYPE_NAMES:
                raise ValueError(f"out_dtype: expected float16, bfloat16, float8_e4m3fn or 'nvfp4', got {out_dtype!r}")
            return _DTYPE_NAMES[key]
        if out_dtype not in _OUT_DTYPES:
            raise TypeError(f"out_dtype: expected float16, bfloat16, float8_e4m3fn or 'nvfp4', got {out_dtype}")
        return out_dtype
    if isinstance(out, FP4Tensor):
        return "nvfp4"
    if out is not None:
        return check_tensor(out, "out", dtypes=_OUT_DTYPES).dtype
    return FP8_DTYPE if query_dtype == FP8_DTYPE else query_dtype


def trtllm_batch_context_with_kv_cache(
    query: torch.Tensor,
    kv_cache: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]],
    workspace_buffer: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    bmm1_scale: Union[float, torch.Tensor],
    bmm2_scale: Union[float, torch.Tensor],
    batch_size: int,
    cum_seq_lens_q: torch.Tensor,
    cum_seq_lens_kv: torch.Tensor,
    window_left: int = -1,
    out: Optional[Union[torch.Tensor, FP4Tensor]] = None,
    out_dtype: Optional[Union[str, torch.dtype]] = None,
    o_sf_scale: Optional[float] = None,
    o_sf_vec_size: Optional[int] = None,
    kv_layout: str = "HND",
    enable_pdl: Optional[bool] = None,
    sinks: Optional[List[torch.Tensor]] = None,
    kv_cache_sf: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
    skip_softmax_threshold_scale_factor: Optional[float] = None,
    uses_shared_paged_kv_idx: bool = True,
    causal: bool = True,
    lse: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    multi_ctas_kv_counter_buffer: Optional[torch.Tensor] = None,
    use_fp16_softmax: Optional[bool] = None,
    uses_spcompress: Optional[bool] = None,
    backend: str = "trtllm-gen",
    *,
    kv_block_scales: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
) -> Union[torch.Tensor, FP4Tensor, Tuple[Union[torch.Tensor, FP4Tensor], torch.Tensor]]:
    """Causal (or bidirectional) attention of each request's new query tokens over its paged KV cache.

    The signature is FlashInfer 0.7.2.post1's; the seed's ``kv_block_scales`` (its name at
    position 20) is accepted as a keyword too.

    Parameters
    ----------
    query : torch.Tensor ``[sum_q, Hq, D]``, float16, bfloat16 or float8_e4m3fn; ``D`` in 64, 128, 256
        Request ``b`` owns rows ``cum_seq_lens_q[b] : cum_seq_lens_q[b + 1]``: the last ``Lq`` of its
        ``L = seq_lens[b]`` tokens (already in the cache). Row ``i`` at ``p = L - Lq + i`` sees keys
        ``j <= p`` (and ``p - j <= window_left`` when ``window_left >= 0``).
    kv_cache : torch.Tensor or (torch.Tensor, torch.Tensor)
        As in :func:`kvattn.decode.xqa_batch_decode_with_kv_cache`, default layout HND. Dtype: the
        query's (float16/bfloat16), float8_e4m3fn, or uint8 NVFP4 with ``kv_cache_sf``.
    workspace_buffer : torch.Tensor uint8
        Scratch. On Hopper, the pages of an fp8 or NVFP4 cache (and of a 16-bit one in pages under
        64 tokens) are copied into it once a call as 16-bit values when they fit
        (``B * max_kv_len * Hkv * D * 4`` bytes past the first 16 KB, half that under an fp8 query):
        about 34 MB for one 8192-token request of 8 KV heads of D 128. A smaller workspace is
        correct too, and slower (the pages are read as they are). At least 16400 bytes;
        :func:`kvattn.workspace_size` gives the bytes a call can use.
    block_tables : torch.Tensor int32 ``[B, pages_per_seq]``, or ``[B, 2, pages_per_seq]`` (K, V page
        ids) with ``uses_shared_paged_kv_idx=False``
    seq_lens : torch.Tensor int32 or uint32 ``[B]``
    max_q_len, max_kv_len : int
        Host-side bounds of the query and KV lengths (size the launch).
    bmm1_scale, bmm2_scale : float or one-element float32 tensor
        Logits ``bmm1 * q.k``; output ``bmm2 * softmax(...) V`` (``bmm2 = v_scale / o_scale`` for a
        quantised output).
    batch_size : int
    cum_seq_lens_q : torch.Tensor int32 ``[B + 1]``
    cum_seq_lens_kv : torch.Tensor int32 ``[B + 1]`` (checked, not needed by the computation)
    window_left : int
    out : torch.Tensor ``[sum_q, Hq, D]`` or FP4Tensor, optional
    out_dtype : torch.dtype or str, optional
        float16, bfloat16, float8_e4m3fn, or ``"nvfp4"`` (returns an :class:`kvattn.formats.FP4Tensor`).
    o_sf_scale : float, optional
        NVFP4 output: block scale ``e4m3(o_sf_scale * amax / 6)``; default 1.
    o_sf_vec_size : int, optional (None or 16)
    kv_layout : {"HND", "NHD"}
    enable_pdl : bool, optional (accepted; unused by Triton launches)
    sinks : float32 ``[Hq]`` tensor (or a list of one), optional
    kv_cache_sf : NVFP4 block scales, ``(k_sf, v_sf)`` or one tensor with a size-2 dim 1
        (FlashInfer 0.7.2.post1's name; the seed's, ``kv_block_scales``, is accepted as a keyword,
        not both at once)
    skip_softmax_threshold_scale_factor : float, optional
        ``f > 0``: approximate attention that skips KV tiles whose scores are all below
        ``running_max + ln(f / L)``; tiles are 128 query rows x 128 keys
        (``kvattn.reference.SKIP_SOFTMAX_TILE_M/N``). None or 0: exact.
    uses_shared_paged_kv_idx : bool
    causal : bool
        True: the causal rule above. False (FlashInfer 0.7.2.post1): every row of a request sees all
        ``L`` of its keys (bidirectional); needs ``window_left == -1``.
    lse : torch.Tensor float32 ``[sum_q, Hq]``, optional
        Where to write each query row's base-2 log-sum-exp of its scaled logits over its visible
        keys: sinks excluded, ``-inf`` for a row that sees no key; with skip-softmax, over the keys
        of the tiles kept. Written whenever given (as FlashInfer 0.7.2.post1 does), returned only
        with ``return_lse``.
    return_lse : bool
        Also return the LSE (allocated when ``lse`` is None).
    multi_ctas_kv_counter_buffer : torch.Tensor, optional (uint8, int32, uint32 or int64)
        FlashInfer 0.7.2.post1: the counters of trtllm-gen's multi-CTA KV split. kvattn's prefill
        kernels never split a row's keys across programs, so the buffer is checked (an integer
        tensor on the query's device) and left untouched.
    use_fp16_softmax : bool, optional
        FlashInfer 0.7.2.post1: trtllm-gen's kernels with a float16 softmax accumulator. kvattn
        keeps its float32 softmax whatever the value (a result at least as exact); checked to be
        a bool or None.
    uses_spcompress : bool, optional
        FlashInfer 0.7.2.post1: trtllm-gen's sparse-compression kernels, an implementation choice
        with no effect on the result; checked to be a bool or None, no effect on kvattn.
    backend : {"trtllm-gen", "cake"}
        FlashInfer 0.7.2.post1's choice of its own implementation; kvattn's kernels serve both.
    kv_block_scales : keyword-only, optional
        The seed's name of ``kv_cache_sf``.

    Returns
    -------
    torch.Tensor ``[sum_q, Hq, D]`` or FP4Tensor, and with ``return_lse`` the LSE

    Examples
    --------
    >>> import torch, kvattn
    >>> Hq, Hkv, D, page = 8, 2, 64, 16
    >>> kv = torch.randn(10, 2, Hkv, page, D, dtype=torch.bfloat16)  # HND
    >>> tables = torch.randperm(10, dtype=torch.int32)[:8].view(2, 4)
    >>> lens = torch.tensor([40, 64], dtype=torch.int32)
    >>> cum_q = torch.tensor([0, 5, 69], dtype=torch.int32)
    >>> cum_kv = torch.tensor([0, 40, 104], dtype=torch.int32)
    >>> q = torch.randn(69, Hq, D, dtype=torch.bfloat16)
    >>> o = kvattn.prefill.trtllm_batch_context_with_kv_cache(
    ...     q, kv, torch.zeros(1 << 20, dtype=torch.uint8), tables, lens, 64, 64, D ** -0.5, 1.0, 2,
    ...     cum_q, cum_kv)
    >>> o.shape
    torch.Size([69, 8, 64])
    >>> # Bidirectional (FlashInfer 0.7.2.post1's causal=False): every row sees all its request's keys.
    >>> b = kvattn.prefill.trtllm_batch_context_with_kv_cache(
    ...     q, kv, torch.zeros(1 << 20, dtype=torch.uint8), tables, lens, 64, 64, D ** -0.5, 1.0, 2,
    ...     cum_q, cum_kv, causal=False)
    >>> bool(torch.equal(b[5:], o[5:])), bool(torch.equal(b[-1], o[-1]))  # (the last row sees every key either way)
    (False, True)
    """
    sf_name = "kv_cache_sf"  # (errors name the argument as the caller wrote it)
    if kv_block_scales is not None:
        if kv_cache_sf is not None:
            raise TypeError("kv_block_scales: the seed's name of kv_cache_sf; expected one of the two, got both")
        kv_cache_sf, sf_name = kv_block_scales, "kv_block_scales"
    args = (query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
            batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left, out, out_dtype, o_sf_scale, o_sf_vec_size,
            kv_layout, enable_pdl, sinks, kv_cache_sf, skip_softmax_threshold_scale_factor,
            uses_shared_paged_kv_idx, return_lse, lse, causal, multi_ctas_kv_counter_buffer, use_fp16_softmax,
            uses_spcompress, backend, sf_name)
    try:
        return _CACHE.run(args, lambda: _prefill(*args))
    except (TypeError, ValueError) as error:
        _SWAPS.add(error, args)
        raise


# Calls replayed from their metadata (kvattn.runtime.callcache; its TMA descriptors rebuilt on the new
# pointers: lab/notes/host-path.md "Host path: calls replayed from their metadata").
_CACHE = CallCache("trtllm_batch_context_with_kv_cache")


def _prefill(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
             batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left, out, out_dtype, o_sf_scale, o_sf_vec_size,
             kv_layout, enable_pdl, sinks, kv_cache_sf, skip_softmax_threshold_scale_factor,
             uses_shared_paged_kv_idx, return_lse, lse, causal=True, multi_ctas_kv_counter_buffer=None,
             use_fp16_softmax=None, uses_spcompress=None, backend="trtllm-gen", sf_name="kv_cache_sf"):
    """:func:`trtllm_batch_context_with_kv_cache`, the ordinary way: validation, then the kernels'
    entry (``kvattn.ops.prefill.op``: the launch is three calls from here, docs/extending.md
    "Layers") or the reference."""
    check_tensor(query, "query", dtypes=(*HALF_DTYPES, FP8_DTYPE), ndim=3)
    check_last_dim_contiguous(query, "query")
    device = query.device
    head_dim = query.shape[-1]
    if head_dim not in PREFILL_HEAD_DIMS:
        raise ValueError(f"query: expected head_dim in {PREFILL_HEAD_DIMS}, got {head_dim}")
    if not isinstance(uses_shared_paged_kv_idx, bool):
        raise TypeError(f"uses_shared_paged_kv_idx: expected a bool, got {type(uses_shared_paged_kv_idx).__name__}")
    kv_dtypes = QUANTISED_DTYPES if query.dtype == FP8_DTYPE else (query.dtype, *QUANTISED_DTYPES)
    kv = paged_kv_from_cache(
        kv_cache, block_tables, kv_layout, head_dim, device,
        kv_sf=kv_cache_sf, sf_name=sf_name, split_tables=not uses_shared_paged_kv_idx,
        allowed_dtypes=kv_dtypes, query_dtype=query.dtype,
    )
    check_paged_heads(query.shape[-2], "query", kv, kv_cache, kv_layout)
    batch = check_int(batch_size, "batch_size", minimum=0)
    if kv.k_table.shape[0] != batch:
        raise ValueError(f"block_tables: expected {batch} rows (batch_size), got {kv.k_table.shape[0]}")
    seq_lens = check_seq_lens(seq_lens, "seq_lens", batch, device)
    max_q_len = check_int(max_q_len, "max_q_len", minimum=0)
    max_kv_len = check_int(max_kv_len, "max_kv_len", minimum=0)
    if max_kv_len > kv.capacity:
        raise ValueError(f"max_kv_len: expected at most block_tables' capacity {kv.capacity}, got {max_kv_len}")
    if max_q_len > max_kv_len:
        raise ValueError(f"max_q_len: expected at most max_kv_len={max_kv_len} (queries are the last tokens), got {max_q_len}")
    for t, n in ((cum_seq_lens_q, "cum_seq_lens_q"), (cum_seq_lens_kv, "cum_seq_lens_kv")):
        check_tensor(t, n, dtypes=(torch.int32, torch.int64), ndim=1, device=device)
        check_shape(t, n, (batch + 1,))
    check_workspace(workspace_buffer, "workspace_buffer", device)
    window_left = check_window(window_left)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
    if not causal and window_left >= 0:
        raise ValueError(f"window_left: causal=False takes no window (FlashInfer 0.7.2.post1's rule): expected -1, "
                         f"got {window_left}")
    for flag, flag_name in ((use_fp16_softmax, "use_fp16_softmax"), (uses_spcompress, "uses_spcompress")):
        if flag is not None and not isinstance(flag, bool):
            raise TypeError(f"{flag_name}: expected a bool or None, got {type(flag).__name__}")
    if multi_ctas_kv_counter_buffer is not None:
        check_tensor(multi_ctas_kv_counter_buffer, "multi_ctas_kv_counter_buffer",
                     dtypes=(torch.uint8, torch.int32, torch.uint32, torch.int64), device=device)
    if backend not in ("trtllm-gen", "cake"):
        raise ValueError(f"backend: expected 'trtllm-gen' or 'cake', got {backend!r}")
    sinks = check_sinks(sinks, "sinks", query.shape[1], device)
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl: expected a bool or None, got {type(enable_pdl).__name__}")
    f = skip_softmax_threshold_scale_factor
    if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f < 0):
        raise ValueError(f"skip_softmax_threshold_scale_factor: expected None or a finite float >= 0, got {f!r}")
    if o_sf_vec_size not in (None, NVFP4_BLOCK):
        raise ValueError(f"o_sf_vec_size: expected None or 16, got {o_sf_vec_size!r}")
    logit = to_scale(bmm1_scale, "bmm1_scale", device)
    out_scale = to_scale(bmm2_scale, "bmm2_scale", device)

    sum_q, num_heads = query.shape[0], query.shape[1]
    kind = _resolve_out_dtype(out, out_dtype, query.dtype)
    if kind == "nvfp4":
        sf_scale = 1.0 if o_sf_scale is None else o_sf_scale
        if isinstance(sf_scale, bool) or not isinstance(sf_scale, (int, float)):
            raise TypeError(f"o_sf_scale: expected a float > 0 or None, got {type(sf_scale).__name__}")
        if not (sf_scale > 0 and math.isfinite(sf_scale)):
            raise ValueError(f"o_sf_scale: expected a finite float > 0, got {o_sf_scale!r}")
        if out is None:
            out = FP4Tensor.empty(sum_q, num_heads, head_dim, device)
        elif not isinstance(out, FP4Tensor):
            raise TypeError(f"out: expected an FP4Tensor for an nvfp4 output, got {type(out).__name__}")
        else:
            start = out.scale_start_index
            if isinstance(start, bool) or not isinstance(start, int) or start < 0:
                # (a negative start would make the kernel write scales before the buffer)
                raise ValueError(f"out.scale_start_index: expected an int >= 0, got {start!r}")
            check_tensor(out.data, "out.data", dtypes=(torch.uint8,), device=device)
            check_shape(out.data, "out.data", (sum_q, num_heads, head_dim // 2))
            cols = round_up(num_heads * head_dim // NVFP4_BLOCK, 4)
            check_tensor(out.scale, "out.scale", dtypes=(FP8_DTYPE, torch.uint8), ndim=2, device=device)
            if out.scale.shape[1] != cols or out.scale.shape[0] < sum_q + out.scale_start_index:
                raise ValueError(
                    f"out.scale: expected shape [>= {sum_q + out.scale_start_index} rows, {cols}], got {list(out.scale.shape)}"
                )
    else:
        if isinstance(out, FP4Tensor):
            raise TypeError(f"out: an FP4Tensor needs out_dtype='nvfp4', got out_dtype={out_dtype!r}")
        if out is None:
            out = torch.empty(sum_q, num_heads, head_dim, dtype=kind, device=device)
        else:
            check_out(out, "out", (sum_q, num_heads, head_dim), (kind,), device)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse).__name__}")
    # (an lse given is written whatever return_lse says, as in FlashInfer 0.7.2.post1)
    lse = check_lse_out(lse, return_lse or lse is not None, sum_q, num_heads, device)
    debug_check_pages(kv, seq_lens, max_len=max_kv_len, max_len_name="max_kv_len", cum_q=cum_seq_lens_q,
                      num_rows=sum_q, max_q_len=max_q_len, cum_kv=cum_seq_lens_kv,
                      scales=(("bmm1_scale", logit.tensor), ("bmm2_scale", out_scale.tensor)))

    ops = _backend.triton_entry("context", device)
    if ops is not None:
        check_interpretable(("kv_cache", kv.k.dtype))
        if lse is not None:
            lse.fill_(float("-inf"))  # rows the kernel's query tiles never reach (past cum_seq_lens_q[B])
        if isinstance(out, FP4Tensor):
            data, out_sf, sf_start = out.data, out.scale, int(out.scale_start_index)
        else:
            data, out_sf, sf_start = out, None, 0
        ops.context(query, kv, seq_lens, cum_seq_lens_q, sinks, logit, out_scale, data, out_sf, workspace_buffer,
                    max_q_len, max_kv_len, window_left, float(1.0 if o_sf_scale is None else o_sf_scale), sf_start,
                    float(f or 0.0), lse, causal)
        return (out, lse) if return_lse else out
    o_real = reference.context(query, kv, seq_lens, cum_seq_lens_q, lse=lse, logit_scale=logit, out_scale=out_scale,
                               window_left=window_left, sinks=sinks, skip_softmax_threshold_scale_factor=f or None,
                               causal=causal)
    if isinstance(out, FP4Tensor):
        out = quantize_nvfp4_output(o_real, 1.0 if o_sf_scale is None else float(o_sf_scale), out)
    else:
        out = store_output(o_real, out)
    return (out, lse) if return_lse else out


_SWAPS = SwapHints(
    _prefill, query=looks("float", (3,)), kv_cache=looks("float byte", (5,), (4,)),
    block_tables=looks("int", (2, 3)), seq_lens=looks("int uint", (1,)), workspace_buffer=looks("byte", (1,)))
