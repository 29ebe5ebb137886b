"""The merge across ranks: every rank's partial state ``(o, lse)`` exchanged in one collective
(all-gather, or all-to-all by head with ``scatter_heads``) and merged exactly
(:func:`kvattn.merge_states`), into float32 buffers carved from the end of the workspace."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.distributed as dist

from .._inputs import cached_aliases, check_tensor
from ..merge import merge_states
from .sharding import PageSharding

_ALIGN = 256  # bytes: every buffer carved from a workspace starts on such a boundary


def _group_info(group) -> Tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("kvattn.distributed: torch.distributed is not initialised (init_process_group first)")
    return dist.get_world_size(group), dist.get_rank(group)


_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _carve(workspace: torch.Tensor, sizes: tuple) -> tuple:
    """Byte ranges ``sizes`` (in order) cut from the end of ``workspace``, each ``_ALIGN``-aligned,
    and the part before them; views kept per workspace tensor (building them costs host time)."""
    return cached_aliases(workspace, ("kvattn.distributed",) + sizes, _carve_views, sizes)


def _carve_views(workspace: torch.Tensor, sizes: tuple) -> tuple:
    end = workspace.numel()
    base = workspace.data_ptr()
    views = []
    for size in sizes:
        start = end - size
        start -= (base + start) % _ALIGN
        if start < 0:
            raise ValueError(f"workspace_buffer: too small for the context-parallel buffers "
                             f"({sum(sizes)} bytes after the local call's own; got {workspace.numel()})")
        views.append(workspace[start : start + size])
        end = start
    return (workspace[:end], *views)


def _exchange_and_merge(local: torch.Tensor, send: torch.Tensor, recv: torch.Tensor, group, world: int, rows: int,
                        heads: int, dim: int, sinks, out: torch.Tensor, out_lse, scatter_heads: bool):
    """All-gather of the packed local state ``local`` (float32 ``[rows * heads * dim | rows * heads]``)
    or, with ``scatter_heads``, all-to-all of ``send`` (the state laid out by destination, see
    :func:`_pack_for_heads`); then the exact merge into ``out`` / ``out_lse``."""
    if not scatter_heads:
        _ALL_GATHER(recv, local, group=group)
        per, hr = local.numel(), heads
    else:
        dist.all_to_all_single(recv, send, group=group)
        per, hr = send.numel() // world, heads // world
    o_all = recv.as_strided((world, rows, hr, dim), (per, hr * dim, dim, 1))
    lse_all = recv.as_strided((world, rows, hr), (per, hr, 1), recv.storage_offset() + rows * hr * dim)
    return merge_states(o_all, lse_all, out=out, out_lse=out_lse, sinks=sinks)


def _pack_for_heads(part_o: torch.Tensor, part_lse: torch.Tensor, send: torch.Tensor, world: int) -> None:
    """Lay the local state out by destination rank: segment ``j`` holds heads ``j * H/R ..`` of
    every row, outputs then LSEs (the all-to-all sends segment ``j`` to rank ``j``)."""
    rows, heads, dim = part_o.shape
    hr = heads // world
    per = send.numel() // world
    send.as_strided((world, rows, hr, dim), (per, hr * dim, dim, 1)).copy_(
        part_o.view(rows, world, hr, dim).transpose(0, 1))
    send.as_strided((world, rows, hr), (per, hr, 1), send.storage_offset() + rows * hr * dim).copy_(
        part_lse.view(rows, world, hr).transpose(0, 1))


class _Buffers:
    """The float32 buffers of one call: ``local`` (the local state, ``part_o [rows, heads, dim]``
    then ``part_lse [rows, heads]``; sent as is by the all-gather), ``send`` (the state by
    destination, with ``scatter_heads``), ``recv`` (every rank's states), and ``extra`` byte
    buffers; carved from the end of a workspace (``rest``: what precedes them), or allocated."""

    def __init__(self, workspace, device, world: int, rows: int, heads: int, dim: int, scatter: bool,
                 extra: tuple = ()):
        n = rows * heads * (dim + 1)
        sizes = (4 * n, 4 * n if scatter else 0, 4 * n * (1 if scatter else world), *extra)
        if workspace is None:
            self.rest = None
            views = [torch.empty(size, dtype=torch.uint8, device=device) for size in sizes]
        else:
            self.rest, *views = _carve(workspace, sizes)
        local, send, recv, *self.extra = views
        self.local = local.view(torch.float32)
        self.part_o = self.local[: rows * heads * dim].view(rows, heads, dim)
        self.part_lse = self.local[rows * heads * dim :].view(rows, heads)
        self.send = send.view(torch.float32)
        self.recv = recv.view(torch.float32)


def _check_out(out, shape: tuple, dtype, device, name: str = "out"):
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_tensor(out, name, dtypes=(dtype, torch.float32), device=device, contiguous_last=True)
    if tuple(out.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(out.shape)}")
    return out


def _check_group(group, sharding, scatter_heads: bool, heads: int) -> Tuple[int, int]:
    world, rank = _group_info(group)
    if sharding is not None:
        if not isinstance(sharding, PageSharding):
            raise TypeError(f"sharding: expected a PageSharding, got {type(sharding).__name__}")
        if sharding.world_size != world:
            raise ValueError(f"sharding: expected world_size {world} (the group's), got {sharding.world_size}")
    if not isinstance(scatter_heads, bool):
        raise TypeError(f"scatter_heads: expected a bool, got {type(scatter_heads).__name__}")
    if scatter_heads and heads % world:
        raise ValueError(f"scatter_heads: the {heads} heads must split evenly over the {world} ranks")
    return world, rank


def _merge(bufs: _Buffers, group, world: int, rank: int, sinks, out, lse, scatter_heads: bool, return_lse: bool):
    rows, heads, dim = bufs.part_o.shape
    if scatter_heads:
        _pack_for_heads(bufs.part_o, bufs.part_lse, bufs.send, world)
        if sinks is not None:
            hr = heads // world
            sinks = sinks[rank * hr : (rank + 1) * hr]
    out, lse_out = _exchange_and_merge(bufs.local, bufs.send, bufs.recv, group, world, rows, heads, dim, sinks, out,
                                       lse, scatter_heads)
    return (out, lse_out) if return_lse else out
