"""Tile products (``@triton.jit``): ``q . k^T`` and ``p . v`` on tensor cores or CUDA cores, a
tile's diagonal, and the logit soft cap."""

from __future__ import annotations

import triton
import triton.language as tl

from .softmax_merge import LOG2E


@triton.jit
def tile_scores(q, k, USE_DOT: tl.constexpr):
    """float32 ``[M, N]`` = ``q [M, W] . k [N, W]^T``.

    USE_DOT: tensor cores (M >= 16, operands in float16/bfloat16). Otherwise CUDA-core FMAs in
    float32 for a single query row (M == 1), where a padded MMA would waste 15/16 of its work.
    """
    if USE_DOT:
        return tl.dot(q, tl.trans(k))
    else:
        return tl.sum(q.to(tl.float32) * k.to(tl.float32), axis=1)[None, :]


@triton.jit
def tile_diagonal(s):
    """``[N]`` diagonal of a square ``[N, N]`` tile, laid out along its columns: a tensor-core
    tile splits columns across warps and rows within one, so the sum stays inside each warp and
    its result broadcasts over the rows of another tile of the same layout without a conversion."""
    offs = tl.arange(0, s.shape[0])
    return tl.sum(tl.where(offs[:, None] == offs[None, :], s, 0.0), 0)


@triton.jit
def tile_pv(p, v, USE_DOT: tl.constexpr):
    """float32 ``[M, W]`` = ``p [M, N] . v [N, W]`` (p rounded to v's dtype on the tensor-core path,
    as every flash-attention kernel does)."""
    if USE_DOT:
        return tl.dot(p.to(v.dtype), v)
    else:
        return tl.sum(tl.trans(p) * v.to(tl.float32), axis=0)[None, :]


@triton.jit
def soft_cap(s, cap):
    """``cap * tanh(s / cap)``, written with exp2 so large |s| saturate to +-cap without NaN."""
    # The tensor on the left: Triton 3.7's interpreter cannot multiply a constexpr expression by a
    # tensor from the constexpr's side (same arithmetic compiled).
    t = tl.exp2(s * (2.0 * LOG2E / cap))  # exp(2 s / cap)
    return cap * (1.0 - 2.0 / (t + 1.0))
