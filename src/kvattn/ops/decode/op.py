"""Decode's torch operators: paged batch decode and single-request decode.

The public functions in :mod:`kvattn.decode` and :mod:`kvattn.xqa` validate and normalise their
arguments, then call :func:`batch_decode` or :func:`single_decode_into` (:func:`single_decode`
while ``torch.compile`` traces a call that gives neither ``out`` nor ``lse``): the entries of the
flat operators ``torch.ops.kvattn.batch_decode`` / ``single_decode_into`` / ``single_decode``, each
declared once below (:func:`kvattn.runtime.opdecl.declare_op`: the ``torch.library.custom_op``,
its fake and its exact ``mutates_args``). An entry takes :class:`~kvattn._inputs.PagedKV` and
:class:`~kvattn._inputs.Scale` as they are and reads the flat values from them (each ``Arg``'s
``source``), so ``torch.compile`` traces through the public functions (the kernels stay opaque
calls) and eager calls run the launcher without the dispatcher, one call from the public module.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...runtime.opdecl import PAGED_KV_ARGS, Arg, OptTensor, Tensor, declare_op
from . import ragged
from .plan import launch_decode

# Paged decode into ``out`` (and the base-2 LSE into ``lse``); split-KV partials live in
# ``workspace``. The names are launch_decode's keywords; the entry, :func:`batch_decode`, takes
# (query, kv, seq_lens, mask, sinks, logit_scale, out_scale, out, workspace, q_len, max_seq_len,
# window_left, max_programs=None, enable_pdl=False, lse=None, kv_start=None).
BATCH_DECODE = declare_op(
    "kvattn::batch_decode", launch_decode,
    Arg("query", Tensor),  # [B * q_len, Hq, D]
    *PAGED_KV_ARGS,
    Arg("seq_lens", Tensor),  # [B] int32 / uint32
    Arg("mask", OptTensor),  # packed draft-tree mask, or None
    Arg("sinks", OptTensor),  # [Hq] float32, or None
    Arg("logit_factor", float, source="logit_scale.factor"),
    Arg("logit_tensor", OptTensor, source="logit_scale.tensor"),  # device-side factor, or None
    Arg("out_factor", float, source="out_scale.factor"),
    Arg("out_tensor", OptTensor, source="out_scale.tensor"),
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
# ``out [B * q_len, Hq, D] = out_scale * softmax(logit_scale * q.k) v`` over each request's pages, the
# rows' base-2 LSE into ``lse [B * q_len, Hq]`` when given; no key before ``kv_start[b]``. Split-KV
# partials use ``workspace``; nothing is allocated and nothing waits for the device.
batch_decode = BATCH_DECODE.entry


def _single_decode_new(query, **args) -> tuple[torch.Tensor, torch.Tensor]:
    """The functional op's launch (traced calls only): new ``out [Hq, D]`` and ``lse float32 [Hq]``."""
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    lse = torch.empty(query.shape[0], dtype=torch.float32, device=query.device)
    launch_decode(query, out=out, lse=lse, paged=False, **args)
    return out, lse


def _single_decode_fake(query, **args) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty_like(query, memory_format=torch.contiguous_format),
            query.new_empty(query.shape[0], dtype=torch.float32))


# One query token over contiguous ``k, v [L, Hkv, D]`` (NHD views, any strides but the last): one
# row of launch_decode's ``[rows, Hq, D]``, one request of length ``L`` (its keywords). The entries
# take (query, k, v, logit_scale, out_scale, rope, alibi, window_left, soft_cap, rope_scale,
# rope_theta, use_tensor_cores), and ``single_decode_into`` then (out, lse).
_SINGLE_ARGS = (
    Arg("query", Tensor),  # [Hq, D]
    Arg("k", Tensor),  # [L, Hkv, D]
    Arg("v", Tensor),
    Arg("logit_factor", float, source="logit_scale.factor"),
    Arg("logit_tensor", OptTensor, source="logit_scale.tensor"),
    Arg("out_factor", float, source="out_scale.factor"),
    Arg("out_tensor", OptTensor, source="out_scale.tensor"),
    Arg("rope", bool),  # ROPE_LLAMA: q at position L - 1 and each key at its index rotated in the kernel
    Arg("alibi", bool),  # ALIBI: slope_h * j added to the logit of key j
    Arg("window_left", int),
    Arg("soft_cap", float),  # 0: none
    Arg("rope_scale", float),
    Arg("rope_theta", float),
    Arg("use_tensor_cores", bool),
)
# (out [Hq, D], lse float32 [Hq]), allocated: the functional form torch.compile traces
SINGLE_DECODE = declare_op("kvattn::single_decode", _single_decode_new, *_SINGLE_ARGS,
                           returns=tuple[torch.Tensor, torch.Tensor], fake=_single_decode_fake)
# into given out [Hq, D] (q's dtype or float32, times out_scale) and lse [Hq] (None: no LSE stored)
SINGLE_DECODE_INTO = declare_op("kvattn::single_decode_into", launch_decode, *_SINGLE_ARGS,
                                Arg("out", Tensor, mutated=True), Arg("lse", OptTensor, mutated=True),
                                fixed=dict(paged=False))
single_decode = SINGLE_DECODE.entry
single_decode_into = SINGLE_DECODE_INTO.entry

# Ragged drafts (``q_cu_seq_lens``) around batch_decode: the padded rows allocated, the packed rows
# padded (``ragged_pack``), the padded decode, its rows written back (``ragged_unpack``); the ops
# are declared in .ragged.
ragged_rows, ragged_pack, ragged_unpack = ragged.padded_rows, ragged.PACK.entry, ragged.UNPACK.entry
