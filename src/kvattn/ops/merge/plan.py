"""Launcher of the merge kernel: grid and block shape from host facts only (shapes, strides,
dtypes); nothing waits for the device and nothing is allocated, so a merge can be captured in a
CUDA graph."""

from __future__ import annotations

import contextlib

import torch

from .kernels import local_lengths_kernel, merge_states_kernel

# Elements of the [BLOCK_R, BLOCK_D] tile a program folds per state: small, so that even a few
# hundred rows (a decode batch's heads) spread over many programs.
TILE_ELEMENTS = 2048
_NO_GUARD = contextlib.nullcontext()


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


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
    pair = o_b is not None
    rows, dim = out.shape
    if rows == 0 or dim == 0:
        return
    num_states = 2 if pair else o.shape[0]
    block_d = _next_power_of_2(dim)
    block_r = max(1, min(_next_power_of_2(rows), TILE_ELEMENTS // block_d))
    if pair:
        so_s, so_r, sl_s, sl_r = 0, o.stride(0), 0, lse.stride(0)
        so2_r, sl2_r = o_b.stride(0), lse_b.stride(0)
    else:
        so_s, so_r, sl_s, sl_r = o.stride(0), o.stride(1), lse.stride(0), lse.stride(1)
        so2_r = sl2_r = 0
    device = out.get_device()  # -1 on the CPU (interpreter)
    guard = torch.cuda.device(device) if device >= 0 and device != torch.cuda.current_device() else _NO_GUARD
    with guard:
        merge_states_kernel[(-(-rows // block_r),)](
            o, lse, o_b if pair else o, lse_b if pair else lse, sinks if sinks is not None else lse,
            out, out_lse if out_lse is not None else lse,
            so_s, so_r, sl_s, sl_r, so2_r, sl2_r, out.stride(0), out_lse.stride(0) if out_lse is not None else 0,
            rows, num_states, sinks.shape[0] if sinks is not None else 1, dim,
            BLOCK_R=block_r, BLOCK_D=block_d, PAIR=pair, HAS_SINKS=sinks is not None,
            STORE_LSE=out_lse is not None, num_warps=4,
        )


def launch_local_lengths(seq_lens: torch.Tensor, lens_out: torch.Tensor, start_out, *, window_left: int, page: int,
                         world: int, rank: int, span_tokens: int, round_robin: bool, last: bool) -> None:
    """Rank ``rank``'s local lengths of ``seq_lens [B]`` (int32, contiguous) into ``lens_out``, and
    with ``start_out`` the local index of each request's first key inside ``window_left``."""
    batch = seq_lens.shape[0]
    if batch == 0:
        return
    device = seq_lens.get_device()
    guard = torch.cuda.device(device) if device >= 0 and device != torch.cuda.current_device() else _NO_GUARD
    with guard:
        local_lengths_kernel[(-(-batch // 256),)](
            seq_lens, lens_out, start_out if start_out is not None else lens_out,
            batch, window_left, page, world, rank, span_tokens,
            ROUND_ROBIN=round_robin, LAST=last, HAS_WINDOW=start_out is not None, BLOCK=256, num_warps=4,
        )
