"""``torch.ops.kvattn.merge_states``: the merge launcher as a torch operator.

:mod:`kvattn.merge` validates and flattens its arguments to rows, then calls :func:`merge_states`
here. The operator is declared once (:func:`kvattn.runtime.opdecl.declare_op`: its fake and
exact ``mutates_args``, ``out`` and ``out_lse``), so ``torch.compile`` traces through the public
functions; eager calls skip the dispatcher, as the other families do.
"""

from __future__ import annotations

from ...runtime.opdecl import Arg, OptTensor, Tensor, declare_op
from .plan import launch_local_lengths, launch_merge

# States ``o [S, rows, D]``, ``lse [S, rows]`` (or the pair ``o, lse`` / ``o_b, lse_b``) merged
# into ``out [rows, D]`` and ``out_lse [rows]``. The names are launch_merge's keywords.
MERGE_STATES = declare_op(
    "kvattn::merge_states", launch_merge,
    Arg("o", Tensor),  # [S, rows, D], or [rows, D] (state a) with o_b
    Arg("lse", Tensor),  # [S, rows], or [rows] with lse_b
    Arg("o_b", OptTensor),  # [rows, D] state b, or None
    Arg("lse_b", OptTensor),  # [rows], or None
    Arg("sinks", OptTensor),  # [H] float32, or None
    Arg("out", Tensor, mutated=True),  # [rows, D]
    Arg("out_lse", OptTensor, mutated=True),  # [rows] float32, or None
)


def merge_states(o, lse, o_b, lse_b, sinks, out, out_lse) -> None:
    """The entry point (``kvattn.runtime.backend.TRITON_OPS["merge_states"]``): the operator while
    ``torch.compile`` traces, else the launcher itself."""
    MERGE_STATES.entry(o, lse, o_b, lse_b, sinks, out, out_lse)


def local_lengths(seq_lens, lens_out, start_out, **kw) -> None:
    """The entry point ``local_lengths``: a context-parallel rank's local lengths and window
    starts (:mod:`kvattn.distributed`), one launch (:func:`.plan.launch_local_lengths`)."""
    launch_local_lengths(seq_lens, lens_out, start_out, **kw)
