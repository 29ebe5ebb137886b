"""DeepSeek MLA decode over a latent paged cache (``[ckv(512) | kpe(64)]`` per token)."""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch

from .runtime import backend as _backend
from . import reference
from .runtime.callcache import CallCache
from ._inputs import (
    PagedKV,
    check_int,
    check_interpretable,
    check_last_dim_contiguous,
    check_max_seq_len,
    check_lse_out,
    check_out,
    check_seq_lens,
    check_shape,
    check_tensor,
    check_workspace,
    debug_check_pages,
    SwapHints,
    looks,
    to_scale,
)
from .formats import FP8_DTYPE

MLA_DTYPES = (torch.bfloat16, FP8_DTYPE)
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
QK_NOPE_HEAD_DIM = 128
# Query tokens a request (multi-token prediction: the real token and up to three drafts). Every
# backend folds (token, head) into one row axis of Q * Hq rows; four tokens of 16 heads fill the
# kernels' 64-row tile as 64 heads do.
MAX_Q_LEN = 4


def xqa_batch_decode_with_kv_cache_mla(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    workspace_buffer: torch.Tensor,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out: Optional[torch.Tensor] = None,
    bmm1_scale: Union[float, torch.Tensor] = 1.0,
    bmm2_scale: Union[float, torch.Tensor] = 1.0,
    sinks: Optional[List[torch.Tensor]] = None,
    enable_pdl: Optional[bool] = None,
    *,
    return_lse: bool = False,
    lse: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """MLA decode: each query row attends over the 576-wide latent rows of its request.

    Parameters
    ----------
    query : torch.Tensor ``[B, Q, Hq, 576]`` = ``[q_nope_absorbed(512) | q_rope(64)]``, bfloat16 or fp8
        Any ``Hq``; ``Q = q_len_per_request`` query tokens a request, 1 to 4 (multi-token
        prediction). Token ``r`` of request ``b`` sits at position ``L - Q + r`` (``L =
        seq_lens[b]``, which counts the new tokens) and sees keys ``0 .. L - Q + r``; a token at a
        negative position (a request shorter than ``Q``) sees no key: zero output, LSE ``-inf``.
    kv_cache : torch.Tensor ``[P, page_size, 576]`` or ``[P, 1, page_size, 576]`` = ``[ckv | kpe]``
        bfloat16 or float8_e4m3fn; row ``j`` is key ``j`` (all 576) and value ``j`` (first 512).
    workspace_buffer : torch.Tensor uint8 (zeroed before first use)
        At least 16400 bytes; :func:`kvattn.workspace_size` gives the bytes a call can use.
    qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim : int
        Must be 128, 512, 64.
    block_tables : torch.Tensor int32 ``[B, pages_per_seq]``
    seq_lens : torch.Tensor int32 or uint32 ``[B]``
    max_seq_len : int
        Host-side bound of ``seq_lens``.
    out : torch.Tensor ``[B, Hq, 512]`` (``Q = 1``; ``[B, 1, Hq, 512]`` also accepted) or ``[B, Q, Hq, 512]``, optional
        bfloat16 (or float32: unrounded partial results to merge). With ``Q > 1`` its token and
        head dims must fold into one (``out.stride(1) == Hq * out.stride(2)``, as in a contiguous
        tensor).
    bmm1_scale, bmm2_scale : float or one-element float32 tensor
        Logits ``bmm1 * q.kv``; output ``bmm2 * softmax(...) ckv``.
    sinks : must be None
    enable_pdl : bool, optional (accepted; unused by Triton launches)
    return_lse : bool, keyword-only
        Also return each row's base-2 log-sum-exp of its scaled logits, float32 ``[B, Hq]`` for
        ``Q = 1`` (``[B, 1, Hq]`` with a 4-D ``out``), ``[B, Q, Hq]`` for ``Q > 1`` (``-inf`` for a
        row that sees no key): with the output, an attention state :func:`kvattn.merge_states`
        merges exactly.
    lse : torch.Tensor float32, the shape above, keyword-only, optional
        Where to write it (with ``return_lse``); allocated if None.

    Returns
    -------
    torch.Tensor ``[B, Hq, 512]`` (``Q = 1``) or ``[B, Q, Hq, 512]``, bfloat16 (``out``'s dtype), and
    with ``return_lse`` the LSE

    Examples
    --------
    >>> import torch, kvattn
    >>> q = torch.randn(2, 1, 16, 576, dtype=torch.bfloat16)
    >>> cache = torch.randn(6, 32, 576, dtype=torch.bfloat16)
    >>> table = torch.tensor([[4, 0, 2], [1, 5, 3]], dtype=torch.int32)
    >>> lens = torch.tensor([70, 33], dtype=torch.int32)
    >>> ws = torch.zeros(1 << 20, dtype=torch.uint8)
    >>> o = kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q, cache, ws, 128, 512, 64, table, lens, 96,
    ...                                                   bmm1_scale=192 ** -0.5)
    >>> o.shape
    torch.Size([2, 16, 512])
    >>> q3 = torch.randn(2, 3, 16, 576, dtype=torch.bfloat16)  # three tokens a request (MTP)
    >>> kvattn.mla.xqa_batch_decode_with_kv_cache_mla(q3, cache, ws, 128, 512, 64, table, lens, 96,
    ...                                               bmm1_scale=192 ** -0.5).shape
    torch.Size([2, 3, 16, 512])
    """
    args = (query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim, block_tables,
            seq_lens, max_seq_len, out, bmm1_scale, bmm2_scale, sinks, enable_pdl, return_lse, lse)
    try:
        return _CACHE.run(args, lambda: _mla(*args))
    except (TypeError, ValueError) as error:
        _SWAPS.add(error, args)
        raise


# Calls replayed from their metadata (kvattn.runtime.callcache).
_CACHE = CallCache("xqa_batch_decode_with_kv_cache_mla")


def _mla(query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens,
         max_seq_len, out, bmm1_scale, bmm2_scale, sinks, enable_pdl, return_lse, lse):
    """:func:`xqa_batch_decode_with_kv_cache_mla`, the ordinary way: validation, then the kernels'
    entry (``kvattn.ops.mla.op``: the launch is three calls from here, docs/extending.md "Layers")
    or the reference."""
    check_int(qk_nope_head_dim, "qk_nope_head_dim", choices=(QK_NOPE_HEAD_DIM,))
    check_int(kv_lora_rank, "kv_lora_rank", choices=(KV_LORA_RANK,))
    check_int(qk_rope_head_dim, "qk_rope_head_dim", choices=(QK_ROPE_HEAD_DIM,))
    dim = KV_LORA_RANK + QK_ROPE_HEAD_DIM
    check_tensor(query, "query", dtypes=MLA_DTYPES, ndim=4)
    check_last_dim_contiguous(query, "query")
    device = query.device
    batch, q_len, num_heads = query.shape[0], query.shape[1], query.shape[2]
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"query: expected q_len_per_request 1 to {MAX_Q_LEN} (shape [B, Q, Hq, {dim}]), "
                         f"got {list(query.shape)}")
    check_shape(query, "query", (batch, q_len, num_heads, dim))
    if num_heads < 1:
        raise ValueError(f"query: expected at least one head, got shape {list(query.shape)}")
    check_tensor(kv_cache, "kv_cache", dtypes=MLA_DTYPES, ndim=(3, 4), device=device)
    check_last_dim_contiguous(kv_cache, "kv_cache")
    if kv_cache.dim() == 4:
        if kv_cache.shape[1] != 1:
            raise ValueError(f"kv_cache: expected shape [P, 1, page_size, {dim}], got {list(kv_cache.shape)}")
        kv_cache = kv_cache[:, 0]
    if kv_cache.shape[-1] != dim:
        raise ValueError(f"kv_cache: expected a last dim of {dim} (kv_lora_rank + qk_rope_head_dim), got {kv_cache.shape[-1]}")
    if sinks is not None:
        raise ValueError("sinks: MLA decode takes no attention sinks; expected None")
    if enable_pdl is not None and not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl: expected a bool or None, got {type(enable_pdl).__name__}")
    check_tensor(block_tables, "block_tables", dtypes=(torch.int32,), ndim=2, device=device)
    if block_tables.shape[0] != batch:
        raise ValueError(f"block_tables: expected {batch} rows (one per request), got {block_tables.shape[0]}")
    pages = kv_cache.unsqueeze(2)  # [P, page_size, 1, 576]: one latent "head"
    kv = PagedKV(pages, pages, block_tables, block_tables, dim, KV_LORA_RANK)
    seq_lens = check_seq_lens(seq_lens, "seq_lens", batch, device)
    max_seq_len = check_max_seq_len(max_seq_len, "max_seq_len", kv)
    check_workspace(workspace_buffer, "workspace_buffer", device)
    logit = to_scale(bmm1_scale, "bmm1_scale", device)
    out_scale = to_scale(bmm2_scale, "bmm2_scale", device)
    rows = q_len * num_heads  # (token, head) folded into one row axis, token-major
    four_d = q_len > 1 or (isinstance(out, torch.Tensor) and out.dim() == 4)  # [B, Q, Hq, 512]
    out_shape = (batch, q_len, num_heads, KV_LORA_RANK) if four_d else (batch, num_heads, KV_LORA_RANK)
    lse_shape = out_shape[:-1]
    if out is None:
        out = torch.empty(out_shape, dtype=torch.bfloat16, device=device)
    else:
        check_out(out, "out", out_shape, (torch.bfloat16, torch.float32), device)
        if four_d and q_len > 1 and out.stride(1) != num_heads * out.stride(2):
            raise ValueError(f"out: expected its token and head dims to fold into one (stride(1) == Hq * stride(2) "
                             f"= {num_heads * out.stride(2)}), got strides {list(out.stride())}")
    lse = check_lse_out(lse, return_lse, batch, num_heads, device, shape=lse_shape)
    if lse is not None and four_d and q_len > 1 and lse.stride(1) != num_heads * lse.stride(2):
        raise ValueError(f"lse: expected its token and head dims to fold into one (stride(1) == Hq * stride(2) "
                         f"= {num_heads * lse.stride(2)}), got strides {list(lse.stride())}")
    debug_check_pages(kv, seq_lens, max_len=max_seq_len, q_len=q_len,
                      scales=(("bmm1_scale", logit.tensor), ("bmm2_scale", out_scale.tensor)))
    # Row views [B, Q * Hq, ...] of the query, the output and the LSE (the query is copied only when
    # its token and head dims do not fold, an unusual layout).
    q3 = query.reshape(batch, rows, dim)
    out3 = out.view(batch, rows, KV_LORA_RANK)
    lse2 = lse.view(batch, rows) if lse is not None else None
    ops = _backend.triton_entry("mla_decode", device)
    if ops is not None:
        check_interpretable(("kv_cache", kv_cache.dtype))
        ops.mla_decode(q3, kv, seq_lens, logit, out_scale, out3, workspace_buffer, max_seq_len, q_len, lse2)
    else:
        reference.mla_decode(q3, kv, seq_lens, out3, logit_scale=logit, out_scale=out_scale, lse=lse2, q_len=q_len)
    return (out, lse) if return_lse else out


_SWAPS = SwapHints(
    _mla, query=looks("float", (3, 4)), kv_cache=looks("float", (3, 4)), block_tables=looks("int", (2,)),
    seq_lens=looks("int uint", (1,)), workspace_buffer=looks("byte", (1,)))
