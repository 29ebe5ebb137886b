"""Launchers of the decode kernels: pick the config, size the grid and the KV split, launch.

Everything here reads host-side facts only (shapes, strides, dtypes, the SM count, the host bound
``max_seq_len``): nothing waits for the device, and with ``out`` and ``workspace`` given nothing
is allocated, so a call can be captured in a CUDA graph and replayed with new lengths and tables.
"""

from __future__ import annotations

import functools
import math

import torch
import triton

from .. import _device
from ..formats import FP8_DTYPE
from . import decode_configs
from .decode_kernels import decode_combine_kernel, decode_split_kernel

KV_FORMAT_CODE = {"float16": 0, "bfloat16": 0, "fp8": 1, "nvfp4": 2}
# The tile packs Q_LEN x GROUP query rows; a larger group is cut into several row blocks.
MIN_BLOCK_M = 16  # tl.dot's smallest M
_ALIGN = 16  # bytes: the partials' float32 views start on a 16-byte boundary


def _kv_format(t: torch.Tensor) -> str:
    return {torch.float16: "float16", torch.bfloat16: "bfloat16", FP8_DTYPE: "fp8", torch.uint8: "nvfp4"}[t.dtype]


def _arch(device: torch.device) -> str:
    if _device.is_interpreter():
        return "interpreter"
    return "sm90" if _device.is_hopper(device) else "default"


def _row_tiling(rows: int, head_dim: int, use_dot: bool) -> tuple[int, int]:
    """``(BLOCK_M, M_BLOCKS)`` for ``rows`` query rows per (request, KV head)."""
    if not use_dot:
        return 1, rows
    cap = 128 if head_dim <= 128 else 64
    block_m = min(max(MIN_BLOCK_M, triton.next_power_of_2(rows)), cap)
    return block_m, triton.cdiv(rows, block_m)


def _partials_from_workspace(workspace: torch.Tensor, numel_o: int, numel_lse: int):
    pad = (-workspace.data_ptr()) % _ALIGN
    ws = workspace[pad : pad + 4 * (numel_o + numel_lse)].view(torch.float32)
    return ws[:numel_o], ws[numel_o:]


def _strides(t: torch.Tensor | None, n: int) -> tuple:
    return tuple(t.stride()[:n]) if t is not None else (0,) * n


def on_query_device(launch):
    """Run ``launch`` with the query's GPU current: Triton launches on the current device, and a
    multi-GPU caller's tensors may live on another one."""

    @functools.wraps(launch)
    def wrapper(query, *args, **kwargs):
        index = query.device.index
        if query.device.type == "cuda" and index is not None and index != torch.cuda.current_device():
            with torch.cuda.device(index):
                return launch(query, *args, **kwargs)
        return launch(query, *args, **kwargs)

    return wrapper


@on_query_device
def launch_decode(
    query: torch.Tensor,  # [rows, Hq, D]
    k: torch.Tensor,  # [P, page, Hkv, Ds] (paged) or [L, Hkv, Ds]
    v: torch.Tensor,
    out: torch.Tensor,  # [rows, Hq, D]
    *,
    paged: bool,
    k_sf=None,
    v_sf=None,
    k_table=None,
    v_table=None,
    seq_lens=None,
    fixed_len: int = 0,
    max_seq_len: int,
    q_len: int = 1,
    mask=None,
    sinks=None,
    logit_factor: float = 1.0,
    logit_tensor=None,
    out_factor: float = 1.0,
    out_tensor=None,
    lse=None,
    window_left: int = -1,
    workspace=None,
    rope=None,  # (rope_scale, rope_theta)
    alibi: bool = False,
    soft_cap: float = 0.0,
    use_tensor_cores: bool | None = None,
    max_programs=None,
    enable_pdl: bool = False,
) -> None:
    device = query.device
    rows_total, num_heads, head_dim = query.shape
    batch = rows_total // q_len
    if paged:
        num_pages, page_size, num_kv_heads = k.shape[0], k.shape[1], k.shape[2]
    else:
        num_pages, page_size, num_kv_heads = 1, 1, k.shape[1]
    group = num_heads // num_kv_heads
    kv_format = _kv_format(k)
    rows = q_len * group
    use_dot = rows > 1
    arch = _arch(device)
    cfg0 = decode_configs.config(arch, kv_format, head_dim, 16, rope is not None)
    if rows == 1:
        # One query row: tensor cores (M padded to 16) are still the only path whose K/V loads
        # Triton pipelines, so the table may prefer them even when the caller did not ask.
        use_dot = cfg0.dot_single_row or bool(use_tensor_cores)
    block_m, m_blocks = _row_tiling(rows, head_dim, use_dot)
    cfg = decode_configs.config(arch, kv_format, head_dim, block_m, rope is not None)

    has_window = window_left >= 0
    span = min(max_seq_len, window_left + q_len) if has_window else max_seq_len
    items = batch * num_kv_heads * m_blocks
    per_split = rows_total * num_heads * (head_dim + 1)
    if workspace is not None:
        fit = max(0, workspace.numel() - _ALIGN) // (4 * per_split)
    else:
        fit = cfg.max_splits
    splits = decode_configs.num_splits(
        cfg, items=items, span=span, sm_count=_device.sm_count(device), fit=fit, max_programs=max_programs,
        kv_format=kv_format, head_dim=head_dim, rope_query=rope is not None and use_dot and rows == 1,
    )
    if splits > 1:
        numel_o, numel_lse = splits * rows_total * num_heads * head_dim, splits * rows_total * num_heads
        if workspace is not None:
            part_o, part_lse = _partials_from_workspace(workspace, numel_o, numel_lse)
        else:
            part_o = torch.empty(numel_o, dtype=torch.float32, device=device)
            part_lse = torch.empty(numel_lse, dtype=torch.float32, device=device)
    else:
        part_o = part_lse = out  # never written: every request fits one split
    num_items = items * splits
    persistent = max_programs is not None and num_items > max_programs
    grid = (max_programs if persistent else num_items,)
    gdc = cfg.pdl and not _device.is_interpreter()

    dummy = query
    if seq_lens is not None and seq_lens.dtype == torch.uint32:
        seq_lens = seq_lens.view(torch.int32)  # lengths < 2^31: same bits
    if mask is not None:
        mask = mask.view(torch.int16)
        if mask.stride(-1) != 1:
            mask = mask.contiguous()
    if sinks is not None and sinks.stride(-1) != 1:
        sinks = sinks.contiguous()
    if paged:
        sk, sv = k.stride()[:3], v.stride()[:3]
        sksf, svsf = _strides(k_sf, 3), _strides(v_sf, 3)
    else:  # [L, Hkv, D]: page 0, slot = token
        sk, sv = (0, k.stride(0), k.stride(1)), (0, v.stride(0), v.stride(1))
        sksf = svsf = (0, 0, 0)
    same_table = (not paged) or (k_table is v_table) or (
        k_table.data_ptr() == v_table.data_ptr() and k_table.stride() == v_table.stride()
    )
    rope_scale, rope_theta = rope if rope is not None else (1.0, 1e4)
    decode_split_kernel[grid](
        query, k, v,
        k_sf if k_sf is not None else dummy, v_sf if v_sf is not None else dummy,
        k_table if paged else dummy, v_table if paged else dummy,
        seq_lens if paged else dummy,
        mask if mask is not None else dummy,
        sinks if sinks is not None else dummy,
        logit_tensor if logit_tensor is not None else dummy,
        out_tensor if out_tensor is not None else dummy,
        out, lse if lse is not None else dummy, part_o, part_lse,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *sk, *sv, *sksf, *svsf,
        *(_strides(k_table, 2) if paged else (0, 0)), *(_strides(v_table, 2) if paged else (0, 0)),
        *(_strides(mask, 2) if mask is not None else (0, 0)),
        lse.stride(0) if lse is not None else 0,
        num_items, rows_total, splits, num_pages, fixed_len, window_left,
        float(logit_factor), float(out_factor), float(soft_cap), float(rope_theta), float(rope_scale),
        2 ** int(math.floor(math.log2(num_heads))),
        HEAD_DIM=head_dim, PAGE_SIZE=page_size, NUM_KV_HEADS=num_kv_heads, GROUP=group, Q_LEN=q_len,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, M_BLOCKS=m_blocks, KV_FORMAT=KV_FORMAT_CODE[kv_format],
        PAGED=paged, SAME_TABLE=same_table, HAS_WINDOW=has_window, HAS_MASK=mask is not None,
        HAS_SINKS=sinks is not None, LOGIT_PTR=logit_tensor is not None, OUT_PTR=out_tensor is not None,
        OUT_FP8=out.dtype == FP8_DTYPE, STORE_LSE=lse is not None, ROPE=rope is not None, ALIBI=alibi,
        SOFT_CAP=soft_cap > 0, USE_DOT=use_dot, PAGE_AHEAD=cfg.page_ahead, PERSISTENT=persistent, USE_PDL=gdc,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if gdc and enable_pdl else {}),
    )
    if splits > 1:
        block_s = min(triton.next_power_of_2(splits), max(1, 8192 // head_dim))
        decode_combine_kernel[(rows_total, num_heads)](
            part_o, part_lse, seq_lens if paged else dummy, sinks if sinks is not None else dummy,
            out_tensor if out_tensor is not None else dummy, out, lse if lse is not None else dummy,
            out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
            rows_total, splits, fixed_len, window_left, float(out_factor),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, Q_LEN=q_len, BLOCK_N=cfg.block_n, BLOCK_S=block_s,
            PAGED=paged, HAS_WINDOW=has_window, HAS_SINKS=sinks is not None, OUT_PTR=out_tensor is not None,
            OUT_FP8=out.dtype == FP8_DTYPE, STORE_LSE=lse is not None, USE_PDL=gdc,
            num_warps=4, num_stages=2,
            **({"launch_pdl": True} if gdc else {}),
        )
