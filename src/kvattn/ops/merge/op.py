"""``torch.ops.kvattn.merge_states``: the merge launcher as a torch operator.

:mod:`kvattn.merge` validates and flattens its arguments to rows, then calls :func:`merge_states`
here. Registered with a fake implementation and its exact ``mutates_args`` (``out``,
``out_lse``), so ``torch.compile`` traces through the public functions; eager calls skip the
dispatcher (:func:`kvattn.runtime.common.entry`), as the other families do.
"""

from __future__ import annotations

from typing import Optional

import torch

from ...runtime.common import entry
from .plan import launch_local_lengths, launch_merge


def merge_states_impl(
    o: torch.Tensor,
    lse: torch.Tensor,
    o_b: Optional[torch.Tensor],
    lse_b: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    out: torch.Tensor,
    out_lse: Optional[torch.Tensor],
) -> None:
    """States ``o [S, rows, D]``, ``lse [S, rows]`` (or the pair ``o, lse`` / ``o_b, lse_b`` of
    ``[rows, D]`` / ``[rows]``) merged into ``out [rows, D]`` and ``out_lse [rows]``."""
    launch_merge(o, lse, o_b, lse_b, sinks, out, out_lse)


merge_states_op = torch.library.custom_op("kvattn::merge_states", merge_states_impl, mutates_args=("out", "out_lse"))


@merge_states_op.register_fake
def _merge_states_fake(o, lse, o_b, lse_b, sinks, out, out_lse) -> None:
    return None


def merge_states(o, lse, o_b, lse_b, sinks, out, out_lse) -> None:
    """The entry point (``kvattn.runtime.backend.TRITON_OPS["merge_states"]``): the operator while
    ``torch.compile`` traces, else the launcher itself."""
    entry(merge_states_op, merge_states_impl)(o, lse, o_b, lse_b, sinks, out, out_lse)


def local_lengths(seq_lens, lens_out, start_out, **kw) -> None:
    """The entry point ``local_lengths``: a context-parallel rank's local lengths and window
    starts (:mod:`kvattn.distributed`), one launch (:func:`.plan.launch_local_lengths`)."""
    launch_local_lengths(seq_lens, lens_out, start_out, **kw)
