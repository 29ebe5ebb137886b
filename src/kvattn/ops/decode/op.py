"""Decode's entry points and torch operators: paged batch decode and single-request decode.

The public functions in :mod:`kvattn.decode` and :mod:`kvattn.xqa` validate and normalise their
arguments, then call :func:`batch_decode` or :func:`single_decode`, which unpack
:class:`~kvattn._inputs.PagedKV` and :class:`~kvattn._inputs.Scale` into the flat operators
``torch.ops.kvattn.batch_decode`` / ``single_decode`` / ``single_decode_into``, each declared once
below (:func:`kvattn.runtime.opdecl.declare_op`: the ``torch.library.custom_op``, its fake and its
exact ``mutates_args``), so ``torch.compile`` traces through the public functions (the kernels
stay opaque calls); eager calls run the same launcher without the dispatcher.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._inputs import PagedKV, Scale
from ...runtime.opdecl import Arg, OptTensor, Tensor, declare_op
from .plan import launch_decode

# Paged decode into ``out`` (and the base-2 LSE into ``lse``); split-KV partials live in
# ``workspace``. The names are launch_decode's keywords.
BATCH_DECODE = declare_op(
    "kvattn::batch_decode", launch_decode,
    Arg("query", Tensor),  # [B * q_len, Hq, D]
    Arg("k", Tensor),  # [P, page, Hkv, Ds] NHD view of the K pages
    Arg("v", Tensor),
    Arg("k_table", Tensor),  # [B, pages_per_seq] int32
    Arg("v_table", Tensor),
    Arg("k_sf", OptTensor),  # NVFP4 block scales [P, page, Hkv, D/16], or None
    Arg("v_sf", OptTensor),
    Arg("seq_lens", Tensor),  # [B] int32 / uint32
    Arg("mask", OptTensor),  # packed draft-tree mask, or None
    Arg("sinks", OptTensor),  # [Hq] float32, or None
    Arg("logit_factor", float),
    Arg("logit_tensor", OptTensor),  # device-side factor, or None
    Arg("out_factor", float),
    Arg("out_tensor", OptTensor),
    Arg("out", Tensor, mutated=True),  # the query's shape
    Arg("workspace", Tensor, mutated=True),  # uint8 split partials and counters
    Arg("q_len", int),
    Arg("max_seq_len", int),
    Arg("window_left", int),
    Arg("max_programs", Optional[int], None),
    Arg("enable_pdl", bool, False),
    Arg("lse", OptTensor, None, mutated=True),  # [B * q_len, Hq] float32 base-2 LSE, or None
    Arg("kv_start", OptTensor, None),  # [B] int32 first key each request may see, or None
    fixed=dict(paged=True),
)


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
    BATCH_DECODE.entry(  # (positionally, in the declaration's order: binding keywords costs microseconds)
        query, kv.k, kv.v, kv.k_table, kv.v_table, kv.k_sf, kv.v_sf, seq_lens, mask, sinks, logit_scale.factor,
        logit_scale.tensor, out_scale.factor, out_scale.tensor, out, workspace, q_len, max_seq_len, window_left,
        max_programs, enable_pdl, lse, kv_start,
    )


def _launch_single(q, k, v, logit_factor: float, logit_tensor, out_factor: float, out_tensor, pos_encoding_mode: str,
                   window_left: int, soft_cap: float, rope_scale: float, rope_theta: float, use_tensor_cores: bool,
                   out, lse) -> None:
    """The single-request op's launch (parameters in the declaration's order): ``[Hq, D]`` tensors
    are one row of the launcher's ``[rows, Hq, D]``, the contiguous ``k, v`` one request of length
    ``L``."""
    length = k.shape[0]
    launch_decode(
        q, k, v, out, paged=False, fixed_len=length, max_seq_len=length,
        logit_factor=logit_factor, logit_tensor=logit_tensor, out_factor=out_factor, out_tensor=out_tensor,
        lse=lse, window_left=window_left,
        rope=(rope_scale, rope_theta) if pos_encoding_mode == "ROPE_LLAMA" else None,
        alibi=pos_encoding_mode == "ALIBI", soft_cap=soft_cap, use_tensor_cores=use_tensor_cores,
    )


def _single_decode_new(q, **args) -> tuple[torch.Tensor, torch.Tensor]:
    """The functional op's launch (traced calls only): new ``out [Hq, D]`` and ``lse float32 [Hq]``."""
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[0], dtype=torch.float32, device=q.device)
    _launch_single(q, out=out, lse=lse, **args)
    return out, lse


def _single_decode_fake(q, **args) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[0], dtype=torch.float32)


# One query token over contiguous ``k, v [L, Hkv, D]`` (NHD views, any strides but the last).
_SINGLE_ARGS = (
    Arg("q", Tensor),  # [Hq, D]
    Arg("k", Tensor),  # [L, Hkv, D]
    Arg("v", Tensor),
    Arg("logit_factor", float),
    Arg("logit_tensor", OptTensor),
    Arg("out_factor", float),
    Arg("out_tensor", OptTensor),
    Arg("pos_encoding_mode", str),  # "NONE", "ROPE_LLAMA" or "ALIBI"
    Arg("window_left", int),
    Arg("soft_cap", float),
    Arg("rope_scale", float),
    Arg("rope_theta", float),
    Arg("use_tensor_cores", bool),
)
# (out [Hq, D], lse float32 [Hq]), allocated: the functional form torch.compile traces
SINGLE_DECODE = declare_op("kvattn::single_decode", _single_decode_new, *_SINGLE_ARGS,
                           returns=tuple[torch.Tensor, torch.Tensor], fake=_single_decode_fake)
# into given out [Hq, D] (q's dtype or float32) and lse [Hq] (None: no LSE stored)
SINGLE_DECODE_INTO = declare_op("kvattn::single_decode_into", _launch_single, *_SINGLE_ARGS,
                                Arg("out", Tensor, mutated=True), Arg("lse", OptTensor, mutated=True))


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
    args = (q, k, v, logit_scale.factor, logit_scale.tensor, out_scale.factor, out_scale.tensor, pos_encoding_mode,
            window_left, float(logits_soft_cap or 0.0), float(rope_scale), float(rope_theta), bool(use_tensor_cores))
    if out is None and lse is None and torch.compiler.is_compiling():
        return SINGLE_DECODE.entry(*args)  # (traced: the functional op)
    if out is None:  # (eager: the output alone, no LSE the caller drops)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    # (no LSE asked for: the kernel stores none, and nothing is allocated with out given)
    SINGLE_DECODE_INTO.entry(*args, out, lse)  # (_SINGLE_ARGS' order)
    return out, lse
