"""Masks that every supported Triton's loads and stores take (``@triton.jit``).

A kernel often widens a scalar condition into a tile's mask (``row_ok & (num_splits == 1)``: the
rows a one-split launch writes). Compiled, that is an ``i1`` splat, whatever the Triton. Triton
3.9's interpreter (the CPU tier's newest release) keeps a scalar comparison's data in its operands'
integer type, so the splat carries int32 data, and its ``tl.load`` / ``tl.store`` reject such a
mask ("mask has unsupported dtype"; 3.6 and 3.7 take it). :func:`as_mask` gives the interpreter
boolean data; compiled, its comparison of an ``i1`` with ``false`` folds away (TTGIR and PTX are
those of the bare mask: ``tests/ops/common/test_predicates.py``; ``lab/notes/triton-versions.md``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def as_mask(cond):
    """bool ``cond`` (any shape) as a load / store mask: the same bits, boolean data in the interpreter."""
    return cond != False  # noqa: E712  (an i1 compared with false: the compiler folds it to cond)

