"""Paged batch decode and single-request decode on the Triton kernels of :mod:`.decode_kernels`.

The public functions in :mod:`kvattn.decode` and :mod:`kvattn.xqa` validate and normalise their
arguments, then call these two functions; they unpack :class:`~kvattn._inputs.PagedKV` and
:class:`~kvattn._inputs.Scale` into the flat ``torch.ops.kvattn`` operators.
"""

from __future__ import annotations

import torch

from .. import _backend, _library
from .._inputs import PagedKV, Scale


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
    _library.entry(_library.batch_decode, _library.batch_decode_impl)(
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
    if out is None and lse is None:
        return _library.entry(_library.single_decode, _library.single_decode_impl)(*args)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty(q.shape[0], dtype=torch.float32, device=q.device)
    _library.entry(_library.single_decode_into, _library.single_decode_into_impl)(*args, out, lse)
    return out, lse


_backend.TRITON_OPS.update({"batch_decode", "single_decode"})
