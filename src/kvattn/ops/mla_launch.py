"""Launcher of the MLA decode kernel: pick the config, size the grid and the KV split, launch.

Host-side facts only (shapes, strides, dtypes, the SM count, the bound ``max_seq_len``): nothing
waits for the device, and with a large enough workspace nothing is allocated, so a call can be
captured in a CUDA graph and replayed with new lengths and tables. What a call derives from its
facts is a :class:`_Plan`, cached under them; the split count is memoised per ``max_seq_len``.
The partials are merged by the decode family's :func:`~.decode_kernels.decode_combine_kernel`.
"""

from __future__ import annotations

import torch

from .. import _device, _env
from .._inputs import KV_FORMATS
from ..formats import FP8_DTYPE
from . import fast_launch, mla_configs
from .decode_kernels import decode_combine_kernel
from .launch_common import (
    KV_FORMAT_CODE, arch, cached_plan, device_guard, int32_lengths, kv_format_code, next_power_of_2, partials_fit,
    split_partials, words_allowed,
)
from .mla_kernels import mla_split_kernel

try:  # Gluon (Triton >= 3.5): the Hopper kernel for 16-bit caches
    from triton.experimental.gluon import language as _gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonDescriptor

    from .mla_gluon import mla_gluon_kernel
    from .mla_ws import MAXNREG as _WS_MAXNREG, NUM_WARPS as _WS_WARPS, mla_ws_kernel
except ImportError:  # pragma: no cover - older Triton: the Triton kernel everywhere
    mla_gluon_kernel = mla_ws_kernel = None

CKV_DIM = 512
KPE_DIM = 64
_MAX_SPANS = 4096

# Order of the call's tensors (fast_launch.call_args); an absent scale tensor is replaced by the
# query, which the kernels never read for it.
_Q, _KV, _TABLE, _LENS, _OUT, _PART_O, _PART_LSE, _LOGIT, _OUT_SCALE = range(9)


class _Plan:
    """Everything a call derives from its host facts (see :func:`launch_mla` for the tuple)."""

    def __init__(self, facts: tuple):
        (device, interpreter, q_shape, q_stride, q_dtype, kv_shape, kv_stride, kv_dtype, table_stride, out_stride,
         ws_numel, has_logit, has_out_scale, aligned4, aligned16, gluon_on, gluon_ws_on) = facts
        self.batch, self.num_heads = q_shape[0], q_shape[1]
        self.num_pages, self.page_size = kv_shape[0], kv_shape[1]
        self.kv_format = KV_FORMATS[kv_dtype]
        self.cfg = cfg = mla_configs.config(arch(device, interpreter), self.kv_format, self.num_heads,
                                            q_dtype == FP8_DTYPE)
        # fp8 scores read the raw bytes (the tile feeds the fp8 wgmma from shared memory as copied)
        words_ok = words_allowed(device, interpreter, aligned4)
        self.kv_code = KV_FORMAT_CODE["fp8"] if cfg.qk_fp8 else kv_format_code(
            self.kv_format, words_ok, (kv_stride[0], kv_stride[1]), CKV_DIM + KPE_DIM)
        self.h_blocks = -(-self.num_heads // cfg.block_h)
        self.items = self.batch * self.h_blocks
        self.sm_count = _device.sm_count(device)
        per_split = self.batch * self.num_heads * (CKV_DIM + 1)
        self.fit = partials_fit(ws_numel, per_split, cfg.max_splits)
        self.head = (q_stride[0], q_stride[1], out_stride[0], out_stride[1], kv_stride[0], kv_stride[1],
                     table_stride[0], table_stride[1], self.batch, self.num_heads)
        self.has_logit, self.has_out_scale = has_logit, has_out_scale
        self.row_stride = kv_stride[1]
        self.gluon = (gluon_on and mla_gluon_kernel is not None and arch(device, interpreter) == "sm90"
                      and _gluon_fits(cfg, self.kv_format, q_dtype, kv_dtype, kv_shape, kv_stride, aligned16))
        self.ws = (self.gluon and gluon_ws_on and mla_ws_kernel is not None
                   and mla_configs.warp_specialized(arch(device, interpreter), self.kv_format, cfg.block_h))
        self._by_span: dict[int, tuple] = {}
        self._by_splits: dict[int, tuple] = {}

    def launches(self, span: int) -> tuple:
        """``(split launch, combine launch or None, numel_o, numel_lse)`` for ``max_seq_len = span``."""
        hit = self._by_span.get(span)
        if hit is not None:
            return hit
        splits = mla_configs.num_splits(self.cfg, items=self.items, span=span, sm_count=self.sm_count,
                                        fit=self.fit)
        hit = self._by_splits.get(splits)
        if hit is None:
            rows = self.batch * self.num_heads
            combine = self._combine(splits) if splits > 1 else None
            hit = self._by_splits[splits] = (self._split(splits), combine, splits * rows * CKV_DIM, splits * rows)
        if len(self._by_span) >= _MAX_SPANS:
            self._by_span.clear()
        self._by_span[span] = hit
        return hit

    def _split(self, splits: int):
        cfg = self.cfg
        if self.ws:
            return _WarpSpecializedSplit(self, splits)
        if self.gluon:
            return _GluonSplit(self, splits)
        return fast_launch.Launch(
            mla_split_kernel, (self.items * splits,),
            slots=(_Q, _KV, _TABLE, _LENS, _LOGIT if self.has_logit else _Q,
                   _OUT_SCALE if self.has_out_scale else _Q, _OUT, _PART_O, _PART_LSE),
            head=(*self.head, splits, self.num_pages), num_floats=2,
            constexprs=dict(
                CKV_DIM=CKV_DIM, KPE_DIM=KPE_DIM, PAGE_SIZE=self.page_size, BLOCK_H=cfg.block_h,
                BLOCK_N=cfg.block_n, H_BLOCKS=self.h_blocks, KV_FORMAT=self.kv_code, LOGIT_PTR=self.has_logit,
                OUT_PTR=self.has_out_scale, QK_FP8=cfg.qk_fp8, HEADS_AS_N=cfg.heads_as_n, SPLIT_SCORES=cfg.split_scores,
            ),
            options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        )

    def _combine(self, splits: int) -> fast_launch.Launch:
        # decode_combine_kernel's pointers: part_o, part_lse, sinks, out_scale, out, lse (the query
        # stands in for the absent sinks and LSE).
        return fast_launch.Launch(
            decode_combine_kernel, (self.batch, self.num_heads),
            slots=(_PART_O, _PART_LSE, _Q, _OUT_SCALE if self.has_out_scale else _Q, _OUT, _Q),
            head=(self.head[2], self.head[3], 0, self.batch, splits), num_floats=1,
            constexprs=dict(
                NUM_HEADS=self.num_heads, HEAD_DIM=CKV_DIM, BLOCK_S=min(next_power_of_2(splits), 8192 // CKV_DIM),
                HAS_SINKS=False, OUT_PTR=self.has_out_scale, OUT_FP8=False, STORE_LSE=False, USE_PDL=False,
            ),
            options=dict(num_warps=4, num_stages=2),
        )


def _gluon_fits(cfg: mla_configs.MLAConfig, kv_format: str, q_dtype, kv_dtype, kv_shape, kv_stride,
                aligned16: bool) -> bool:
    """Whether :mod:`.mla_gluon` runs a launch: 16-bit cache and query of one dtype, 64 heads a
    program, 64-key tiles inside pages of a multiple of 64 tokens, and rows TMA can address as one
    ``[pages * page, 576]`` view (16-byte aligned base and row stride, pages back to back)."""
    pages, page = kv_shape[0], kv_shape[1]
    return (kv_format in ("float16", "bfloat16") and q_dtype == kv_dtype and cfg.block_h == 64
            and cfg.block_n == 64 and cfg.num_warps == 8 and not cfg.heads_as_n and not cfg.qk_fp8
            and page % 64 == 0 and aligned16 and kv_stride[-1] == 1 and (kv_stride[1] * 2) % 16 == 0
            and kv_stride[0] == page * kv_stride[1] and pages * page < 2**31)


class _GluonSplit:
    """The split launch of :func:`~.mla_gluon.mla_gluon_kernel` (through the Gluon JIT: its TMA
    descriptor of the cache is built for each call from the cache's pointer)."""

    BLOCK_N = 64

    @staticmethod
    def kernel():
        return mla_gluon_kernel

    def __init__(self, plan: _Plan, splits: int):
        self.grid = (plan.items * splits,)
        self.splits = splits
        self.plan = plan
        self.layout = _gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    def run(self, query, kv, table, seq_lens, out, part_o, part_lse, logit_tensor, out_tensor, logit_factor,
            out_factor):
        plan = self.plan
        desc = _GluonDescriptor(kv, [plan.num_pages * plan.page_size, CKV_DIM + KPE_DIM], [plan.row_stride, 1],
                                [self.BLOCK_N, 64], self.layout)
        h = plan.head  # (q_b, q_h, o_b, o_h, kv_p, kv_s, t_b, t_p, batch, heads)
        self.kernel()[self.grid](
            query, desc, table, seq_lens, logit_tensor if logit_tensor is not None else query,
            out_tensor if out_tensor is not None else query, out, part_o, part_lse,
            h[0], h[1], h[2], h[3], h[6], h[7], h[8], h[9], self.splits, plan.num_pages,
            logit_factor, out_factor,
            CKV_DIM=CKV_DIM, KPE_DIM=KPE_DIM, PAGE_SIZE=plan.page_size, BLOCK_H=plan.cfg.block_h,
            BLOCK_N=self.BLOCK_N, H_BLOCKS=plan.h_blocks, LOGIT_PTR=plan.has_logit, OUT_PTR=plan.has_out_scale,
            **self.launch_kwargs(),
        )

    def launch_kwargs(self) -> dict:
        return dict(num_warps=8)


class _WarpSpecializedSplit(_GluonSplit):
    """The same launch on :func:`~.mla_ws.mla_ws_kernel` (its arguments are the Gluon kernel's;
    4 warps a partition and the register split its ``warp_specialize`` asks for)."""

    # Schedule switches of the kernel replacing its defaults (tuning and timing floors:
    # benchmarks/tune_mla.py's ws_* variants); empty in the library.
    CONSTEXPRS: dict = {}

    @staticmethod
    def kernel():
        return mla_ws_kernel

    def launch_kwargs(self) -> dict:
        return dict(num_warps=_WS_WARPS.value, maxnreg=_WS_MAXNREG.value, **self.CONSTEXPRS)


_PLANS: dict[tuple, _Plan] = {}


def _plan(facts: tuple) -> _Plan:
    return cached_plan(_PLANS, facts, _Plan, bool(mla_configs._override))


def launch_mla(
    query: torch.Tensor,  # [B, Hq, 576]
    kv: torch.Tensor,  # [P, page, 576] or [P, page, 1, 576] latent rows
    table: torch.Tensor,  # [B, pages_per_seq] int32
    seq_lens: torch.Tensor,  # [B] int32 / uint32
    out: torch.Tensor,  # [B, Hq, 512]
    *,
    max_seq_len: int,
    logit_factor: float = 1.0,
    logit_tensor=None,
    out_factor: float = 1.0,
    out_tensor=None,
    workspace=None,  # None: the split partials are allocated
) -> None:
    """Launch MLA decode into ``out``, with the query's GPU current."""
    device = query.get_device()  # -1 on the CPU
    with device_guard(device):
        seq_lens = int32_lengths(seq_lens)
        facts = (
            query.device, _env.triton_interpret(), query.shape, query.stride(), query.dtype, kv.shape, kv.stride(), kv.dtype,
            table.stride(), out.stride(), workspace.numel() if workspace is not None else None,
            logit_tensor is not None, out_tensor is not None,
            kv.dtype == FP8_DTYPE and kv.data_ptr() % 4 == 0, kv.data_ptr() % 16 == 0, _env.gluon(),
            _env.gluon_ws(),
        )
        plan = _plan(facts)
        split, combine, numel_o, numel_lse = plan.launches(max_seq_len)
        part_o, part_lse = split_partials(combine is not None, workspace, numel_o, numel_lse, out)
        call = fast_launch.call_args(
            (query, kv, table, seq_lens, out, part_o, part_lse,
             logit_tensor if logit_tensor is not None else query, out_tensor if out_tensor is not None else query),
            (), device,
        )
        if plan.gluon:
            split.run(query, kv, table, seq_lens, out, part_o, part_lse, logit_tensor, out_tensor, logit_factor,
                      out_factor)
        else:
            split(call, (logit_factor, out_factor))
        if combine is not None:
            combine(call, (out_factor,))
