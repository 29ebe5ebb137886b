"""Launchers of the merge and local-lengths kernels: grid and block shape from host facts only
(shapes, strides, dtypes); nothing waits for the device and nothing is allocated, so a merge can
be captured in a CUDA graph.

What a call derives from its facts (a :class:`MergeFacts` / :class:`LocalLengthsFacts`) is one
:class:`~kvattn.runtime.fast_launch.Launch`, cached under them; a call then reads its data
pointers and launches, every kernel argument named once in :func:`_merge_launch` /
:func:`_local_lengths_launch`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...runtime import fast_launch
from ...runtime.common import cdiv, device_guard, next_power_of_2
from ...runtime.plans import cached_plan
from .kernels import local_lengths_kernel, merge_states_kernel

# Elements of the [BLOCK_R, BLOCK_D] tile a program folds per state: small, so that even a few
# hundred rows (a decode batch's heads) spread over many programs.
TILE_ELEMENTS = 2048
LENGTHS_BLOCK = 256  # requests a local-lengths program reads

# A merge's tensors by name (fast_launch.CallLayout). Absent ones: the LSE stands in for the sinks
# and the output LSE, the first state for the second (PAIR off), never read.
_MERGE_LAYOUT = fast_launch.CallLayout(("o", "lse", "o_b", "lse_b", "sinks", "out", "out_lse"))
_LENGTHS_LAYOUT = fast_launch.CallLayout(("seq_lens", "lens_out", "start_out"))


class MergeFacts(NamedTuple):
    """Every host fact a merge launch reads: the key of its plan cache (built positionally from
    locals of the fields' names in :func:`launch_merge`)."""

    out_shape: tuple  # [rows, D]
    out_stride: tuple
    o_shape: tuple  # [S, rows, D], or [rows, D] with a state b
    o_stride: tuple
    lse_stride: tuple
    o_b_stride: tuple | None  # state b [rows, D], or None
    lse_b_stride: tuple | None
    num_sinks: int | None  # sinks [H], or None
    out_lse_stride: tuple | None  # [rows], or None


def _merge_launch(f: MergeFacts) -> fast_launch.Launch:
    """The launch of :func:`~.kernels.merge_states_kernel` for a call with facts ``f``: one program
    a block of ``BLOCK_R`` rows."""
    rows, dim = f.out_shape
    pair = f.o_b_stride is not None
    block_d = next_power_of_2(dim)
    block_r = max(1, min(next_power_of_2(rows), TILE_ELEMENTS // block_d))
    if pair:
        so_s, so_r, sl_s, sl_r = 0, f.o_stride[0], 0, f.lse_stride[0]
        so2_r, sl2_r = f.o_b_stride[0], f.lse_b_stride[0]
    else:
        so_s, so_r, sl_s, sl_r = f.o_stride[0], f.o_stride[1], f.lse_stride[0], f.lse_stride[1]
        so2_r = sl2_r = 0
    return fast_launch.Launch(
        merge_states_kernel, (cdiv(rows, block_r),),
        layout=_MERGE_LAYOUT,
        per_call=dict(o_ptr="o", lse_ptr="lse", o2_ptr="o_b", lse2_ptr="lse_b", sinks_ptr="sinks", out_ptr="out",
                      out_lse_ptr="out_lse"),
        fixed=dict(
            stride_o_s=so_s, stride_o_r=so_r, stride_lse_s=sl_s, stride_lse_r=sl_r, stride_o2_r=so2_r,
            stride_lse2_r=sl2_r, stride_out_r=f.out_stride[0],
            stride_out_lse_r=f.out_lse_stride[0] if f.out_lse_stride is not None else 0,
            rows=rows, num_states=2 if pair else f.o_shape[0],
            num_heads=f.num_sinks if f.num_sinks is not None else 1, dim=dim,
        ),
        constexprs=dict(BLOCK_R=block_r, BLOCK_D=block_d, PAIR=pair, HAS_SINKS=f.num_sinks is not None,
                        STORE_LSE=f.out_lse_stride is not None),
        options=dict(num_warps=4),
    )


_MERGE_PLANS: dict[MergeFacts, fast_launch.Launch] = {}


def launch_merge(
    o: torch.Tensor,  # [S, rows, D], or [rows, D] (state a) with o_b
    lse: torch.Tensor,  # [S, rows], or [rows] with lse_b
    o_b,  # [rows, D] state b, or None
    lse_b,  # [rows], or None
    sinks,  # [H] float32, or None
    out: torch.Tensor,  # [rows, D]
    out_lse,  # [rows] float32, or None
) -> None:
    """Merge the states into ``out`` (and ``out_lse``), with the tensors' GPU current."""
    out_shape = out.shape
    if 0 in out_shape:
        return
    pair = o_b is not None
    # Every host fact the launch reads, each in a local of its MergeFacts field's name.
    out_stride, o_shape, o_stride, lse_stride = out.stride(), o.shape, o.stride(), lse.stride()
    o_b_stride = o_b.stride() if pair else None
    lse_b_stride = lse_b.stride() if pair else None
    num_sinks = sinks.shape[0] if sinks is not None else None
    out_lse_stride = out_lse.stride() if out_lse is not None else None
    facts = MergeFacts._make((out_shape, out_stride, o_shape, o_stride, lse_stride, o_b_stride, lse_b_stride,
                              num_sinks, out_lse_stride))
    launch = cached_plan(_MERGE_PLANS, facts, _merge_launch, False)
    device = out.get_device()  # -1 on the CPU (interpreter)
    with device_guard(device):
        launch(fast_launch.call_args(  # in _MERGE_LAYOUT's order
            (o, lse, o_b if pair else o, lse_b if pair else lse, sinks if sinks is not None else lse, out,
             out_lse if out_lse is not None else lse), (), (), device,
        ))


class LocalLengthsFacts(NamedTuple):
    """Every host fact a local-lengths launch reads (the key of its plan cache): the batch, the
    sharding of the pages over the ranks and the window."""

    batch: int
    window_left: int
    page: int
    world: int
    rank: int
    span_tokens: int
    round_robin: bool
    last: bool
    has_window: bool  # start_out given


def _local_lengths_launch(f: LocalLengthsFacts) -> fast_launch.Launch:
    """The launch of :func:`~.kernels.local_lengths_kernel`: one program a block of requests."""
    return fast_launch.Launch(
        local_lengths_kernel, (cdiv(f.batch, LENGTHS_BLOCK),),
        layout=_LENGTHS_LAYOUT,
        per_call=dict(seq_lens_ptr="seq_lens", lens_out_ptr="lens_out", start_out_ptr="start_out"),
        fixed=dict(batch=f.batch, window_left=f.window_left, page=f.page, world=f.world, rank=f.rank,
                   span_tokens=f.span_tokens),
        constexprs=dict(ROUND_ROBIN=f.round_robin, LAST=f.last, HAS_WINDOW=f.has_window, BLOCK=LENGTHS_BLOCK),
        options=dict(num_warps=4),
    )


_LENGTHS_PLANS: dict[LocalLengthsFacts, fast_launch.Launch] = {}


def launch_local_lengths(seq_lens: torch.Tensor, lens_out: torch.Tensor, start_out, *, window_left: int, page: int,
                         world: int, rank: int, span_tokens: int, round_robin: bool, last: bool) -> None:
    """Rank ``rank``'s local lengths of ``seq_lens [B]`` (int32, contiguous) into ``lens_out``, and
    with ``start_out`` the local index of each request's first key inside ``window_left``."""
    batch = seq_lens.shape[0]
    if batch == 0:
        return
    has_window = start_out is not None
    facts = LocalLengthsFacts._make((batch, window_left, page, world, rank, span_tokens, round_robin, last,
                                     has_window))
    launch = cached_plan(_LENGTHS_PLANS, facts, _local_lengths_launch, False)
    device = seq_lens.get_device()
    with device_guard(device):
        launch(fast_launch.call_args(  # (no window: the output stands in for the starts, never written)
            (seq_lens, lens_out, start_out if has_window else lens_out), (), (), device,
        ))
