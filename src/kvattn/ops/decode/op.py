"""Decode's entry points and torch operators: paged batch decode and single-request decode.

The public functions in :mod:`kvattn.decode` and :mod:`kvattn.xqa` validate and normalise their
arguments, then call :func:`batch_decode` or :func:`single_decode`, which unpack
:class:`~kvattn._inputs.PagedKV` and :class:`~kvattn._inputs.Scale` into the flat operators
``torch.ops.kvattn.batch_decode`` / ``single_decode``. Each operator is a ``torch.library.custom_op``
with a fake implementation and exact ``mutates_args``, so ``torch.compile`` traces through the
public functions (the kernels stay opaque calls); eager calls run the same launcher without the
dispatcher (:func:`kvattn.runtime.common.entry`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._inputs import PagedKV, Scale
from ...runtime.common import entry
from .plan import launch_decode


def batch_decode(
    query: torch.Tensor,
    kv: PagedKV,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor,
    *,
    q_len: int,
    max_seq_len: int,
    logit_scale: Scale,
    out_scale: Scale,
    window_left: int,
    sinks,
    mask,
    enable_pdl: bool = False,
    max_programs=None,
    lse=None,
    kv_start=None,
) -> None:
    """``out [B * q_len, Hq, D] = out_scale * softmax(logit_scale * q.k) v`` over each request's pages,
    and the rows' base-2 LSE into ``lse [B * q_len, Hq]`` when given; no key before ``kv_start[b]``.

    Split-KV partials use ``workspace``; nothing is allocated and nothing waits for the device.
    """
    entry(batch_decode_op, batch_decode_impl)(
        query, kv.k, kv.v, kv.k_table, kv.v_table, kv.k_sf, kv.v_sf, seq_lens, mask, sinks,
        logit_scale.factor, logit_scale.tensor, out_scale.factor, out_scale.tensor, out, workspace,
        q_len, max_seq_len, window_left, max_programs, bool(enable_pdl), lse, kv_start,
    )


def single_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    use_tensor_cores: bool,
    logit_scale: Scale,
    out_scale: Scale,
    pos_encoding_mode: str,
    window_left: int,
    logits_soft_cap,
    rope_scale: float,
    rope_theta: float,
    out=None,
    lse=None,
):
    """One query token over contiguous ``k, v [L, Hkv, D]`` (NHD views, any strides but the last).

    Returns ``out [Hq, D]`` in q's dtype (times ``out_scale``) and the base-2 ``lse`` float32 ``[Hq]``;
    written into ``out`` / ``lse`` where given (``out`` may be float32).
    """
    args = (q, k, v, logit_scale.factor, logit_scale.tensor, out_scale.factor, out_scale.tensor,
            pos_encoding_mode, window_left, float(logits_soft_cap or 0.0), float(rope_scale), float(rope_theta),
            bool(use_tensor_cores))
    if out is None and lse is None and torch.compiler.is_compiling():
        return single_decode_op(*args)  # (traced: the functional op)
    if out is None:  # (eager: the output alone, no LSE the caller drops)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    # (no LSE asked for: the kernel stores none, and nothing is allocated with out given)
    entry(single_decode_into_op, single_decode_into_impl)(*args, out, lse)
    return out, lse


# ---------------------------------------------------------------------------------------------
# the torch.library op (traced by torch.compile) and the plain call (eager) it wraps
# ---------------------------------------------------------------------------------------------
def batch_decode_impl(
    query: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_table: torch.Tensor,
    v_table: torch.Tensor,
    k_sf: Optional[torch.Tensor],
    v_sf: Optional[torch.Tensor],
    seq_lens: torch.Tensor,
    mask: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    out: torch.Tensor,
    workspace: torch.Tensor,
    q_len: int,
    max_seq_len: int,
    window_left: int,
    max_programs: Optional[int],
    enable_pdl: bool,
    # No default for a mutated argument: torch 2.11's in-place bookkeeping indexes the boxed arguments,
    # from which trailing defaults are dropped (lab/notes/triton-versions.md, torch versions).
    lse: Optional[torch.Tensor],
    kv_start: Optional[torch.Tensor] = None,
) -> None:
    """Paged decode into ``out`` (and the base-2 LSE into ``lse``); split-KV partials live in
    ``workspace`` (see ops.decode)."""
    launch_decode(
        query, k, v, out, paged=True, k_sf=k_sf, v_sf=v_sf, k_table=k_table, v_table=v_table,
        seq_lens=seq_lens, max_seq_len=max_seq_len, q_len=q_len, mask=mask, sinks=sinks,
        logit_factor=logit_factor, logit_tensor=logit_tensor, out_factor=out_factor, out_tensor=out_tensor,
        window_left=window_left, workspace=workspace, max_programs=max_programs, enable_pdl=enable_pdl, lse=lse,
        kv_start=kv_start,
    )


batch_decode_op = torch.library.custom_op("kvattn::batch_decode", batch_decode_impl,
                                          mutates_args=("out", "workspace", "lse"))


@batch_decode_op.register_fake
def _batch_decode_fake(query, k, v, k_table, v_table, k_sf, v_sf, seq_lens, mask, sinks, logit_factor,
                       logit_tensor, out_factor, out_tensor, out, workspace, q_len, max_seq_len, window_left,
                       max_programs, enable_pdl, lse, kv_start=None) -> None:
    return None


def single_decode_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    pos_encoding_mode: str,
    window_left: int,
    soft_cap: float,
    rope_scale: float,
    rope_theta: float,
    use_tensor_cores: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query token over contiguous ``k, v [L, Hkv, D]``: ``(out [Hq, D], lse float32 [Hq])``."""
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[0], dtype=torch.float32, device=q.device)
    single_decode_into_impl(q, k, v, logit_factor, logit_tensor, out_factor, out_tensor, pos_encoding_mode,
                            window_left, soft_cap, rope_scale, rope_theta, use_tensor_cores, out, lse)
    return out, lse


single_decode_op = torch.library.custom_op("kvattn::single_decode", single_decode_impl, mutates_args=())


@single_decode_op.register_fake
def _single_decode_fake(q, k, v, logit_factor, logit_tensor, out_factor, out_tensor, pos_encoding_mode,
                        window_left, soft_cap, rope_scale, rope_theta, use_tensor_cores):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[0], dtype=torch.float32)


def single_decode_into_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    pos_encoding_mode: str,
    window_left: int,
    soft_cap: float,
    rope_scale: float,
    rope_theta: float,
    use_tensor_cores: bool,
    out: torch.Tensor,
    lse: Optional[torch.Tensor],
) -> None:
    """:func:`single_decode_impl` into given ``out [Hq, D]`` (q's dtype or float32) and ``lse [Hq]``
    (None: no LSE stored)."""
    length = k.shape[0]
    launch_decode(  # [Hq, D] tensors are one row of the launcher's [rows, Hq, D]
        q, k, v, out, paged=False, fixed_len=length, max_seq_len=length,
        logit_factor=logit_factor, logit_tensor=logit_tensor, out_factor=out_factor, out_tensor=out_tensor,
        lse=lse, window_left=window_left,
        rope=(rope_scale, rope_theta) if pos_encoding_mode == "ROPE_LLAMA" else None,
        alibi=pos_encoding_mode == "ALIBI", soft_cap=soft_cap, use_tensor_cores=use_tensor_cores,
    )


single_decode_into_op = torch.library.custom_op("kvattn::single_decode_into", single_decode_into_impl,
                                                mutates_args=("out", "lse"))


@single_decode_into_op.register_fake
def _single_decode_into_fake(q, k, v, logit_factor, logit_tensor, out_factor, out_tensor, pos_encoding_mode,
                             window_left, soft_cap, rope_scale, rope_theta, use_tensor_cores, out, lse) -> None:
    return None
