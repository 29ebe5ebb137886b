"""MLA decode's torch operator.

:func:`kvattn.mla.xqa_batch_decode_with_kv_cache_mla` validates and normalises its arguments, then
calls :func:`mla_decode`, the entry of the flat operator ``torch.ops.kvattn.mla_decode`` (a
``torch.library.custom_op`` declared once below, :func:`kvattn.runtime.opdecl.declare_op`, with
its fake and exact ``mutates_args``): it takes :class:`~kvattn._inputs.PagedKV` and
:class:`~kvattn._inputs.Scale` as they are and reads the flat values from them (each ``Arg``'s
``source``); eager calls run the launcher without the dispatcher.
"""

from __future__ import annotations

from ...runtime.opdecl import Arg, OptTensor, Tensor, declare_op
from .plan import launch_mla

# MLA decode into ``out`` (and the base-2 LSE into ``lse``) over latent rows, ``Q = q_len`` tokens
# a request. The names are launch_mla's keywords; the entry, :func:`mla_decode`, takes (query, kv,
# seq_lens, logit_scale, out_scale, out, workspace, max_seq_len, q_len=1, lse=None).
MLA_DECODE = declare_op(
    "kvattn::mla_decode", launch_mla,
    Arg("query", Tensor),  # [B, Q * Hq, 576]
    Arg("kv", Tensor, source="kv.k"),  # [P, page, 1, 576] latent rows (kv.v is a view of them)
    Arg("table", Tensor, source="kv.k_table"),  # [B, pages_per_seq] int32
    Arg("seq_lens", Tensor),  # [B] int32 / uint32
    Arg("logit_factor", float, source="logit_scale.factor"),
    Arg("logit_tensor", OptTensor, source="logit_scale.tensor"),
    Arg("out_factor", float, source="out_scale.factor"),
    Arg("out_tensor", OptTensor, source="out_scale.tensor"),
    Arg("out", Tensor, mutated=True),  # [B, Q * Hq, 512]
    Arg("workspace", Tensor, mutated=True),  # uint8 split partials
    Arg("max_seq_len", int),
    Arg("q_len", int, 1),
    Arg("lse", OptTensor, None, mutated=True),  # [B, Q * Hq] float32 base-2 LSE, or None
)


# ``out [B, Q * Hq, 512] = out_scale * softmax(logit_scale * q.kv) ckv`` over each request's pages:
# ``query [B, Q * Hq, 576]``, token-major rows (row ``r * Hq + h``: token ``r``, head ``h``; ``Q =
# q_len``, token ``r`` seeing keys ``0 .. L - Q + r``); split-KV partials use ``workspace``; the
# base-2 LSE goes to ``lse [B, Q * Hq]`` when given. Nothing waits for the device.
mla_decode = MLA_DECODE.entry
