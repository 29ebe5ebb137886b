"""Ragged speculative decode (``q_cu_seq_lens``) on the padded decode kernels.

Request ``b`` brings ``q_b = cu[b + 1] - cu[b]`` query rows (0 .. ``Q``, ``Q`` = ``q_len_per_req``),
packed ``[total_q, Hq, D]``; its row ``r`` sits at position ``L - q_b + r`` (docs/semantics.md,
"Ragged drafts"). The padded kernels take ``Q`` rows a request, row ``r'`` at ``L - Q + r'``. Placing
the ``q_b`` rows at the END of the request's ``Q`` slots (``r' = Q - q_b + r``) gives every packed
row its own position, so the padded kernels compute the ragged result unchanged: the slots before
them (``r' < Q - q_b``) are computed and dropped. A ragged mask row (bits over the request's own
``q_b`` drafts) becomes a padded row whose first ``Q - q_b`` draft columns, which are older keys of
the request, are visible and whose bits follow, shifted by ``Q - q_b``.

The kernels' path (:func:`padded_rows`, then ``PACK``, the padded decode, ``UNPACK``) is two small
launches around the padded decode, one program a (padded slot, block of heads):
:func:`.kernels_ragged.ragged_pack_kernel` fills the padded query (and mask) rows,
:func:`.kernels_ragged.ragged_unpack_kernel` writes the packed output (and LSE) rows back; every index comes from
the offsets on the device, of sizes fixed by the host-known ``B``, ``Q`` and ``total_q``, so a call
can be captured in a CUDA graph and replayed with new offsets. :func:`row_maps` and
:func:`padded_mask` are the same mapping in elementwise torch (``kvattn.distributed`` runs its
padded call through them). Offsets the caller got wrong (unchecked without ``KVATTN_DEBUG=1``)
give wrong rows, never an access outside the tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...runtime import fast_launch
from ...runtime.common import cdiv, device_guard, next_power_of_2
from ...runtime.opdecl import Arg, OptTensor, Tensor, declare_op
from ...runtime.plans import cached_plan
from .kernels_ragged import ragged_pack_kernel, ragged_unpack_kernel


def row_maps(q_cu: torch.Tensor, batch: int, q_max: int, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` int64: ``src [B * Q]`` the packed row each padded slot reads (any row for a
    slot before the request's rows), ``dst [total]`` the padded slot each packed row comes from.
    ``total > 0``."""
    device = q_cu.device
    cu = q_cu.to(torch.int64)
    shift = q_max - (cu[1:] - cu[:-1])  # [B]: the slots before each request's rows
    slots = torch.arange(q_max, device=device)
    src = (cu[:-1, None] + slots[None, :] - shift[:, None]).clamp_(0, total - 1).reshape(-1)
    rows = torch.arange(total, device=device)
    owner = torch.searchsorted(cu[1:].contiguous(), rows, right=True).clamp_(0, batch - 1)
    dst = (owner * q_max + shift[owner] + rows - cu[owner]).clamp_(0, batch * q_max - 1)
    return src, dst


def padded_mask(mask: torch.Tensor | None, q_cu: torch.Tensor, src: torch.Tensor, batch: int, q_max: int,
                window_left: int) -> torch.Tensor:
    """uint16 ``[B, Q, W]`` padded mask (``W = 2 * ceil(Q / 32)``) of a ragged one (uint16
    ``[total_q, W]``, bit ``c % 16`` of word ``c // 16`` of a row: its request's draft ``c``
    visible), or of the causal rule among each request's drafts (``mask`` None).

    The padded kernels apply the window to keys before the ``Q`` draft columns only; the columns
    before a request's own drafts are older keys of the request, so their bits carry the window
    (``r' - c' <= window_left``), as the ragged rule does."""
    device = q_cu.device
    words = 2 * ((q_max + 31) // 32)
    bit = torch.arange(16, device=device, dtype=torch.int32)
    cu = q_cu.to(torch.int64)
    shift = q_max - (cu[1:] - cu[:-1])  # [B]
    slot = torch.arange(q_max, device=device)
    col = slot[None, None, :] - shift[:, None, None]  # [B, 1, Q]: the draft each padded column is
    if mask is None:
        taken = (slot[None, None, :] <= slot[None, :, None]).to(torch.int32).expand(batch, q_max, q_max)
    else:
        bits = (mask.view(torch.int16).to(torch.int32)[:, :, None] >> bit) & 1  # [total, W, 16]
        bits = bits.reshape(mask.shape[0], -1)[:, :q_max]  # [total, Q]: column c, draft c
        rows = bits[src].view(batch, q_max, q_max)  # [B, Q slots, Q columns]
        taken = torch.gather(rows, 2, col.clamp(0, q_max - 1).expand(batch, q_max, q_max))
    older = torch.ones_like(taken)
    if window_left >= 0:  # row r' sees column c' (an older key) when r' - c' <= window_left
        older = (slot[None, :, None] - slot[None, None, :] <= window_left).to(torch.int32).expand_as(taken)
    padded = torch.where(col < 0, older, taken)
    padded = torch.nn.functional.pad(padded, (0, words * 16 - q_max)).view(batch, q_max, words, 16)
    value = (padded << bit).sum(-1, dtype=torch.int32)  # [B, Q, W] in [0, 65535]
    return torch.where(value >= 32768, value - 65536, value).to(torch.int16).view(torch.uint16)


# ---------------------------------------------------------------------------------------------
# the kernels' path: two launches, each program one (padded slot, block of heads), each a Launch
# cached under its host facts
# ---------------------------------------------------------------------------------------------
TILE_ELEMENTS = 4096  # elements a program moves a step (a [BLOCK_H, D] tile, 4 warps)
NUM_WARPS = 4

_PACK_LAYOUT = fast_launch.CallLayout(("query", "q_cu", "mask", "q_pad", "mask_pad"))
_UNPACK_LAYOUT = fast_launch.CallLayout(("out_pad", "lse_pad", "q_cu", "out", "lse"))


def _head_block(heads: int, dim: int) -> int:
    return max(1, min(next_power_of_2(heads), TILE_ELEMENTS // dim))


class PackFacts(NamedTuple):
    """Every host fact a pack launch reads (the key of its plan cache)."""

    q_shape: tuple  # [total, Hq, D] packed rows
    q_stride: tuple
    slots: int  # B * Q padded rows
    mask_stride: tuple | None  # [total, W] ragged mask, or None
    make_mask: bool  # a padded mask to fill
    q_len: int
    window_left: int


class UnpackFacts(NamedTuple):
    """Every host fact an unpack launch reads (the key of its plan cache)."""

    out_shape: tuple  # [total, Hq, D] packed rows
    out_stride: tuple
    slots: int
    lse_stride: tuple | None  # [total, Hq], or None
    q_len: int


def _pack_launch(f: PackFacts) -> fast_launch.Launch:
    rows, heads, dim = f.q_shape
    words = 2 * ((f.q_len + 31) // 32)
    block_h = _head_block(heads, dim)
    return fast_launch.Launch(
        ragged_pack_kernel, (f.slots, cdiv(heads, block_h)), layout=_PACK_LAYOUT,
        per_call=dict(q_ptr="query", cu_ptr="q_cu", mask_ptr="mask", q_pad_ptr="q_pad", mask_pad_ptr="mask_pad"),
        fixed=dict(stride_q_t=f.q_stride[0], stride_q_h=f.q_stride[1],
                   stride_m_t=f.mask_stride[0] if f.mask_stride is not None else 0, total=rows, num_heads=heads,
                   window_left=f.window_left),
        constexprs=dict(Q_LEN=f.q_len, HEAD_DIM=dim, BLOCK_H=block_h, WORDS=words, BLOCK_W=next_power_of_2(words),
                        HAS_MASK=f.mask_stride is not None, MAKE_MASK=f.make_mask, HAS_WINDOW=f.window_left >= 0),
        options=dict(num_warps=NUM_WARPS),
    )


def _unpack_launch(f: UnpackFacts) -> fast_launch.Launch:
    rows, heads, dim = f.out_shape
    block_h = _head_block(heads, dim)
    return fast_launch.Launch(
        ragged_unpack_kernel, (f.slots, cdiv(heads, block_h)), layout=_UNPACK_LAYOUT,
        per_call=dict(out_pad_ptr="out_pad", lse_pad_ptr="lse_pad", cu_ptr="q_cu", out_ptr="out", lse_ptr="lse"),
        fixed=dict(stride_o_t=f.out_stride[0], stride_o_h=f.out_stride[1],
                   stride_l_t=f.lse_stride[0] if f.lse_stride is not None else 0, total=rows, num_heads=heads),
        constexprs=dict(Q_LEN=f.q_len, HEAD_DIM=dim, BLOCK_H=block_h, HAS_LSE=f.lse_stride is not None),
        options=dict(num_warps=NUM_WARPS),
    )


_PACK_PLANS: dict[PackFacts, fast_launch.Launch] = {}
_UNPACK_PLANS: dict[UnpackFacts, fast_launch.Launch] = {}


def pack(query, q_cu, mask, q_pad, mask_pad, q_len: int, window_left: int) -> None:
    """Padded rows (and mask rows, ``mask_pad`` given) of the packed ``query`` / ``mask``: one launch."""
    q_shape = query.shape
    slots = q_pad.shape[0]
    if slots == 0 or q_shape[1] == 0:
        return
    if mask is not None:
        mask = mask.view(torch.int16)
    if mask_pad is not None:
        mask_pad = mask_pad.view(torch.int16)
    # Every host fact the launch reads, each in a local of its PackFacts field's name.
    q_stride = query.stride()
    mask_stride = mask.stride() if mask is not None else None
    make_mask = mask_pad is not None
    facts = PackFacts._make((q_shape, q_stride, slots, mask_stride, make_mask, q_len, window_left))
    launch = cached_plan(_PACK_PLANS, facts, _pack_launch, False)
    device = query.get_device()
    with device_guard(device):
        launch(fast_launch.call_args(  # (absent masks: the query and the padded query stand in, never read)
            (query, q_cu, mask if mask is not None else query, q_pad, mask_pad if make_mask else q_pad), (), (),
            device,
        ))


def unpack(out_pad, lse_pad, q_cu, out, lse, q_len: int) -> None:
    """The packed rows of ``out`` (and ``lse``) from the padded ones: one launch."""
    out_shape = out.shape
    slots = out_pad.shape[0]
    if slots == 0 or out_shape[1] == 0 or out_shape[0] == 0:
        return
    # Every host fact the launch reads, each in a local of its UnpackFacts field's name.
    out_stride = out.stride()
    lse_stride = lse.stride() if lse is not None else None
    facts = UnpackFacts._make((out_shape, out_stride, slots, lse_stride, q_len))
    launch = cached_plan(_UNPACK_PLANS, facts, _unpack_launch, False)
    device = out.get_device()
    with device_guard(device):
        launch(fast_launch.call_args(  # (no LSE: the outputs stand in, never read)
            (out_pad, lse_pad if lse_pad is not None else out_pad, q_cu, out, lse if lse is not None else out), (), (),
            device,
        ))


# the two launches as torch ops (torch.compile traces through a ragged call)
PACK = declare_op(
    "kvattn::ragged_pack", pack,
    Arg("query", Tensor),  # [total_q, Hq, D] packed rows
    Arg("q_cu", Tensor),  # [B + 1] offsets
    Arg("mask", OptTensor),  # packed rows' mask, or None
    Arg("q_pad", Tensor, mutated=True),  # [B * Q, Hq, D]
    Arg("mask_pad", OptTensor, mutated=True),  # [B, Q, words] uint16, or None
    Arg("q_len", int),
    Arg("window_left", int),
)
UNPACK = declare_op(
    "kvattn::ragged_unpack", unpack,
    Arg("out_pad", Tensor),  # [B * Q, Hq, Dv]
    Arg("lse_pad", OptTensor),  # [B * Q, Hq] float32, or None
    Arg("q_cu", Tensor),  # [B + 1] offsets
    Arg("out", Tensor, mutated=True),  # [total_q, Hq, Dv]
    Arg("lse", OptTensor, mutated=True),  # [total_q, Hq] float32, or None
    Arg("q_len", int),
)


def padded_rows(query, q_cu, mask, out, lse, q_len: int, window_left: int) -> tuple | None:
    """The padded decode's rows of a ragged call, allocated: ``(q_pad, mask_pad, out_pad, lse_pad)``
    (``mask_pad`` None without a mask or a window, ``lse_pad`` None without ``lse``), or None for a
    call with no row or no request (nothing to launch). The public modules then launch in turn
    ``PACK`` (the packed rows into ``q_pad``, ``mask_pad``), the padded decode and ``UNPACK`` (its
    rows back into ``out``, ``lse``), each op a call from the public module."""
    rows, heads, dim = query.shape
    batch = q_cu.shape[0] - 1
    if rows == 0 or batch == 0:
        return None
    slots = batch * q_len
    device = query.device
    q_pad = torch.empty((slots, heads, dim), dtype=query.dtype, device=device)
    # (a window needs the padded mask even without one: the padded kernels do not window the
    # columns before a request's own drafts)
    mask_pad = None
    if mask is not None or window_left >= 0:
        mask_pad = torch.empty((batch, q_len, 2 * ((q_len + 31) // 32)), dtype=torch.uint16, device=device)
    out_pad = torch.empty((slots, heads, out.shape[2]), dtype=out.dtype, device=device)
    lse_pad = torch.empty((slots, heads), dtype=torch.float32, device=device) if lse is not None else None
    return q_pad, mask_pad, out_pad, lse_pad
