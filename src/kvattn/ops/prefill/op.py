"""Prefill's torch operator: paged causal context attention.

The public function :func:`kvattn.prefill.trtllm_batch_context_with_kv_cache` validates and
normalises its arguments (an :class:`~kvattn.formats.FP4Tensor` output into its codes, scales and
first scale row), then calls :func:`context`, the entry of the flat operator
``torch.ops.kvattn.context`` (a ``torch.library.custom_op`` declared once below,
:func:`kvattn.runtime.opdecl.declare_op`, with its fake and exact ``mutates_args``): it takes
:class:`~kvattn._inputs.PagedKV` and :class:`~kvattn._inputs.Scale` as they are and reads the flat
values from them (each ``Arg``'s ``source``); eager calls run the launcher without the dispatcher.
"""

from __future__ import annotations

from ...runtime.opdecl import PAGED_KV_ARGS, Arg, OptTensor, Tensor, declare_op
from .plan import launch_context

# Paged causal (or, ``causal=False``, bidirectional) prefill into ``out`` (NVFP4: codes in ``out``,
# swizzled scales in ``out_sf``), and the rows' base-2 LSE into ``lse``. The workspace is written:
# pages of a quantised cache are staged there (ops.prefill.staging). The names are
# launch_context's keywords; the entry, :func:`context`, takes (query, kv, seq_lens, cum_seq_lens_q,
# sinks, logit_scale, out_scale, out, out_sf, workspace, max_q_len, max_kv_len, window_left,
# o_sf_scale, sf_start, skip_factor, lse=None, causal=True).
CONTEXT = declare_op(
    "kvattn::context", launch_context,
    Arg("query", Tensor),  # [sum_q, Hq, D]
    *PAGED_KV_ARGS,
    Arg("seq_lens", Tensor),  # [B] int32 / uint32
    Arg("cum_seq_lens_q", Tensor),  # [B + 1] int32 / int64
    Arg("sinks", OptTensor),  # [Hq] float32, or None
    Arg("logit_factor", float, source="logit_scale.factor"),
    Arg("logit_tensor", OptTensor, source="logit_scale.tensor"),
    Arg("out_factor", float, source="out_scale.factor"),
    Arg("out_tensor", OptTensor, source="out_scale.tensor"),
    Arg("out", Tensor, mutated=True),  # [sum_q, Hq, D], or NVFP4 codes uint8 [sum_q, Hq, D/2]
    Arg("out_sf", OptTensor, mutated=True),  # NVFP4 output's swizzled block scales, or None
    Arg("workspace", Tensor, mutated=True),  # uint8 scratch (staged pages)
    Arg("max_q_len", int),
    Arg("max_kv_len", int),
    Arg("window_left", int),
    Arg("o_sf_scale", float),  # NVFP4 output's global scale (1.0 otherwise)
    Arg("sf_start", int),  # NVFP4 output: the first scale row it writes (0 otherwise)
    Arg("skip_factor", float),  # skip-softmax threshold scale factor, 0: off
    Arg("lse", OptTensor, None, mutated=True),  # [sum_q, Hq] float32 base-2 LSE, or None
    Arg("causal", bool, True),
)


# ``out [sum_q, Hq, D] = out_scale * softmax(logit_scale * q.k) v`` over each request's pages
# (causal, the queries being each request's last tokens; ``causal=False``: every row sees all its
# request's keys); an NVFP4 output gets its codes in ``out`` and swizzled block scales in ``out_sf``;
# ``lse [sum_q, Hq]`` (optional) the rows' base-2 LSE. ``workspace`` may hold a quantised cache's
# pages, dequantised once a call (``ops.prefill.staging``).
context = CONTEXT.entry
