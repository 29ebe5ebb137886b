"""The balanced split's unit decode in Gluon (:mod:`.balance`'s ``launch_unit``, the plan of a
launch whose grid holds ``batch * num_splits`` units, one program group each), for the Gluon MLA
kernels: their ``split_work``'s balanced twin.

:mod:`.balance`'s ``triton.jit`` functions build their ``[BLOCK_B]`` vector of lengths with
``tl.arange``, which has no layout in a Gluon kernel; this port gives it one (the lengths in one
warp's registers, repeated in each of the calling context's warps) and scans with
``associative_scan`` (Gluon has no ``cumsum``).
The rule is :func:`.balance.unit_counts`'s, line for line: ``tests/ops/mla/test_codegen.py``
compiles both kernels with it and the GPU tests compare them with the Triton kernel's oracle.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .softmax_merge import split_bounds


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def balanced_split_work(seq_lens_ptr, capacity, batch, num_splits, H_BLOCKS: gl.constexpr, BLOCK_N: gl.constexpr,
                        MIN_CHUNK: gl.constexpr, BLOCK_B: gl.constexpr, UNITS_CAP: gl.constexpr):
    """``(b, hb, slot, start, end, num_tiles)``: the program's request and head block, the slot of
    its partial (its unit; ``batch * num_splits``, past the partials, for a unit past the plan's
    last, which reads and writes nothing) and its keys ``[start, end)`` in ``num_tiles`` tiles of
    ``BLOCK_N`` (``mla/kernels_gluon.split_work`` for the balanced plan: an equal batch gets the
    uniform split, unit ``b * num_splits + split``). Head blocks vary fastest, as there."""
    # (RAGGED: the longest request holds more than 5/4 of the mean's keys; balance.unit_counts.)
    RAGGED_NUM: gl.constexpr = 5
    RAGGED_DEN: gl.constexpr = 4
    # The lengths in one warp's registers, repeated in every warp: its sums, maximum and scan are
    # then warp shuffles, where lengths spread over the warps crossed them through shared memory
    # (19 barriers before the program's first copy; lab/notes/mla-program-ends.md).
    lay: gl.constexpr = gl.BlockedLayout([max(BLOCK_B // 32, 1)], [32], [gl.num_warps()], [0])
    pid = gl.program_id(0)
    hb = pid % H_BLOCKS
    unit = pid // H_BLOCKS

    offs_b = gl.arange(0, BLOCK_B, layout=lay)
    b_ok = offs_b < batch
    lens = gl.load(seq_lens_ptr + offs_b, mask=b_ok, other=0)
    lens = gl.minimum(gl.maximum(lens, 0), capacity)
    total = gl.sum(lens.to(gl.int64), 0)
    longest = gl.max(lens, 0)
    ragged = longest.to(gl.int64) * batch * RAGGED_DEN > RAGGED_NUM * total
    # Units counted for the grid: sum_b ceil(L_b / chunk) <= total / chunk + batch <= batch * num_splits.
    unit_target = gl.maximum(batch * (num_splits - 1), 1)
    chunk = gl.maximum(gl.cdiv(total, unit_target), gl.cdiv(longest, UNITS_CAP)).to(gl.int32)
    chunk = gl.maximum(gl.cdiv(chunk, BLOCK_N) * BLOCK_N, MIN_CHUNK)
    n = gl.where(ragged, gl.maximum(gl.cdiv(lens, chunk), 1), num_splits)
    n = gl.where(b_ok, n, 0)
    ends = gl.associative_scan(n, 0, _add)

    b = gl.minimum(gl.sum((ends <= unit).to(gl.int32), 0), batch - 1)  # requests wholly before this unit
    mine = offs_b == b
    n_b = gl.sum(gl.where(mine, n, 0), 0)
    split = unit - (gl.sum(gl.where(mine, ends, 0), 0) - n_b)
    live = unit < gl.sum(n, 0)

    kv_len = gl.sum(gl.where(mine, lens, 0), 0)
    piece = split_bounds(kv_len, 0, n_b, BLOCK_N, 0)
    start = split * piece
    end = gl.where(live, gl.minimum(start + piece, kv_len), start)
    num_tiles = gl.maximum(gl.cdiv(end - start, BLOCK_N), 0)
    slot = gl.where(live, unit, batch * num_splits)
    return b, hb, slot, start, end, num_tiles
