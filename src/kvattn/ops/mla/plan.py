"""Launcher of the MLA decode kernel: pick the config, size the grid and the KV split, launch.

Host-side facts only (shapes, strides, dtypes, the SM count, the bound ``max_seq_len``): nothing
waits for the device, and with a large enough workspace nothing is allocated, so a call can be
captured in a CUDA graph and replayed with new lengths and tables. What a call derives from its
facts is a :class:`_Plan`, cached under them; the split count is memoised per ``max_seq_len``.
The partials are merged by the decode family's :func:`~..common.combine.decode_combine_kernel`,
or, for a launch that takes the balanced split of ragged batches (``configs.balanced``: the kernels'
``BALANCED``), by :func:`~..common.combine.balanced_combine_kernel`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...runtime import device as _device, env as _env, versions as _versions
from ..._formats_table import BY_DTYPE, BY_NAME
from ...formats import FP8_DTYPE
from . import configs as mla_configs
from ...runtime import fast_launch
from ..common.combine import balanced_combine_kernel, decode_combine_kernel
from ..common.splits import combine_block_s, invariant_span, invariant_splits
from ...runtime.common import arch, device_guard, int32_lengths, kv_format_code, next_power_of_2, words_allowed
from ...runtime.plans import cached_plan
from ...runtime.workspace import partials_fit, split_partials
from .kernels import mla_split_kernel

try:  # Gluon (Triton >= 3.5): the Hopper kernel for 16-bit caches
    from triton.experimental.gluon import language as _gl

    from .kernels_gluon import mla_gluon_kernel
    from .kernels_gluon_ws import MAXNREG as _WS_MAXNREG, NUM_WARPS as _WS_WARPS, mla_gluon_ws_kernel
except ImportError:  # pragma: no cover - older Triton: the Triton kernel everywhere
    mla_gluon_kernel = mla_gluon_ws_kernel = None

CKV_DIM = 512
KPE_DIM = 64
_MAX_SPANS = 4096

# The call's values by name (fast_launch.CallLayout); an absent scale tensor's parameter takes the
# query, which the kernels never read for it.
_LAYOUT = fast_launch.CallLayout(
    ("query", "kv", "table", "seq_lens", "out", "part_o", "part_lse", "logit", "out_scale", "lse"), ("capacity",),
    ("logit_factor", "out_factor"),
)


class MLAFacts(NamedTuple):
    """Every host fact an MLA plan reads: the key of the plan cache (built positionally from locals
    of the fields' names in :func:`launch_mla`, as :class:`..decode.launch.DecodeFacts`)."""

    device: torch.device
    interpreter: bool
    q_shape: tuple  # [B, Q * Hq, 576] (token-major rows)
    q_stride: tuple
    q_dtype: torch.dtype
    kv_shape: tuple  # [P, page, 576] or [P, page, 1, 576]
    kv_stride: tuple
    kv_dtype: torch.dtype
    table_stride: tuple
    out_stride: tuple
    ws_numel: int | None
    has_logit: bool  # a logit scale tensor
    has_out_scale: bool  # an output scale tensor
    aligned4: bool  # an fp8 cache 4-byte aligned (its words path)
    aligned16: bool  # the cache and the query laid out for the Gluon kernels (gluon_aligned)
    gluon_on: bool  # KVATTN_GLUON
    gluon_ws_on: bool  # KVATTN_GLUON_WS
    lse_stride: int | None = None  # the LSE's row stride (return_lse), None without one
    batch_invariant: bool = False  # kvattn.set_batch_invariant / KVATTN_BATCH_INVARIANT
    q_len: int = 1  # query tokens a request (their rows folded with the heads into q_shape[1])


class _Plan:
    """Everything a call derives from its host facts (:class:`MLAFacts`). ``narrow``: the plan
    without the padded 64-row programs, which a padded plan keeps as ``self.narrow`` for the spans
    whose programs would be too short for them (:meth:`for_span`)."""

    def __init__(self, facts: MLAFacts, narrow: bool = False):
        f = facts
        # num_heads counts rows: Q tokens x Hq heads, which the kernels take as one M axis (the
        # per-row key limit of a token derived from its row, see kernels.py "Multi-token prediction").
        self.batch, self.num_heads, self.q_len = f.q_shape[0], f.q_shape[1], f.q_len
        self.num_pages, self.page_size = f.kv_shape[0], f.kv_shape[1]
        self.kv_format = BY_DTYPE[f.kv_dtype].name
        q_fp8 = f.q_dtype == FP8_DTYPE
        family = arch(f.device, f.interpreter)
        # The warp-specialised kernel stores no final LSE: a call asking for one (return_lse) keeps
        # the Gluon kernel (16-bit caches) or the Triton kernel (fp8).
        ws_allowed = (f.gluon_on and f.gluon_ws_on and mla_gluon_ws_kernel is not None and f.lse_stride is None
                      and family == "sm90")
        cfg = mla_configs.config(family, self.kv_format, self.num_heads, q_fp8)
        # Fewer than 64 heads: the warp-specialised kernel's 64-head programs (rows past the heads
        # padded) where it takes the launch, not the Triton kernel's 16- or 32-head ones; an fp8
        # query over an fp8 cache only for programs of PADDED_MIN_KEYS keys or more (the narrow
        # plan below takes the shorter ones), and on GPUs where that was measured (an H200).
        # Batch-invariant mode keeps one kernel for every span there (a request's result must not
        # depend on the batch's longest): the unpadded one.
        self.sm_count = _device.sm_count(f.device)
        wide = mla_configs.padded_heads(family, self.kv_format, self.num_heads, q_fp8, sm_count=self.sm_count,
                                        bandwidth=_device.memory_bandwidth(f.device))
        min_keys = mla_configs.padded_min_keys(self.kv_format, q_fp8)
        fits = wide is not None and (
            _ws_fp8_fits(wide, f.q_dtype, f.kv_dtype, f.kv_shape, f.kv_stride, f.aligned16) if q_fp8
            else _gluon_fits(wide, self.kv_format, f.q_dtype, f.kv_dtype, f.kv_shape, f.kv_stride, f.aligned16))
        if fits and ws_allowed and mla_gluon_kernel is not None and not narrow and not (min_keys and f.batch_invariant):
            cfg = wide
        self.padded_min_keys = min_keys if cfg is wide else 0
        self.narrow = _Plan(facts, narrow=True) if self.padded_min_keys else None
        self.cfg = cfg
        # fp8 scores read the raw bytes (the tile feeds the fp8 wgmma from shared memory as copied)
        words_ok = words_allowed(f.device, f.interpreter, f.aligned4)
        self.kv_code = BY_NAME["fp8"].kernel_code if cfg.qk_fp8 else kv_format_code(
            self.kv_format, words_ok, (f.kv_stride[0], f.kv_stride[1]), CKV_DIM + KPE_DIM)
        self.h_blocks = -(-self.num_heads // cfg.block_h)
        self.items = self.batch * self.h_blocks
        per_split = self.batch * self.num_heads * (CKV_DIM + 1)
        self.fit = partials_fit(f.ws_numel, per_split, cfg.max_splits)
        self.strides = dict(  # the kernels' stride parameters, by name
            stride_q_b=f.q_stride[0], stride_q_h=f.q_stride[1], stride_o_b=f.out_stride[0],
            stride_o_h=f.out_stride[1], stride_kv_p=f.kv_stride[0], stride_kv_s=f.kv_stride[1],
            stride_t_b=f.table_stride[0], stride_t_p=f.table_stride[1],
        )
        self.has_logit, self.has_out_scale = f.has_logit, f.has_out_scale
        self.has_lse, self.lse_stride = f.lse_stride is not None, f.lse_stride or 0
        self.row_stride = f.kv_stride[1]
        self.kv_dtype = f.kv_dtype
        self.gluon = (f.gluon_on and mla_gluon_kernel is not None and family == "sm90"
                      and _gluon_fits(cfg, self.kv_format, f.q_dtype, f.kv_dtype, f.kv_shape, f.kv_stride,
                                      f.aligned16))
        ws_on = ws_allowed and mla_configs.warp_specialized("sm90", self.kv_format, cfg.block_h, q_fp8)
        # An fp8 query over an fp8 cache: the warp-specialised kernel's e4m3 form where it fits, else
        # the Triton kernel (mla/kernels_gluon.py takes 16-bit caches only).
        self.fp8_ws = ws_on and _ws_fp8_fits(cfg, f.q_dtype, f.kv_dtype, f.kv_shape, f.kv_stride, f.aligned16)
        self.ws = (self.gluon and ws_on) or self.fp8_ws
        if self.ws:  # its split plan: pieces of one tile pair (configs.SEESAW_PLAN)
            self.cfg = cfg = mla_configs.seesaw_plan(family, cfg)
        self.gluon = self.gluon or self.fp8_ws  # (a launch that takes a TMA descriptor of the cache)
        # bfloat16 split partials (with a bfloat16 output) where every row of a program is a head:
        # staged like the final rows, half the bytes of the float32 ones; with fewer rows than the
        # 64-row program the accumulator's stores write only the heads' rows, and staging all 64
        # cost 16- and 32-head ragged rows 0.5-1.3 us (lab/notes/mla-program-ends.md).
        self.partials16 = self.ws and self.num_heads >= cfg.block_h
        # Batch-invariant mode: fixed-span splits (the config depends on the shape class only).
        self.invariant = f.batch_invariant
        self.split_span = invariant_span(cfg) if self.invariant else 0
        self.has_workspace = f.ws_numel is not None
        # The combine as a programmatic dependent launch of the split kernel (Hopper): its launch and
        # prologue run under the split kernel's last programs, and it waits for their partials
        # (griddepcontrol.wait) before its first load, as decode's combine does.
        self.gdc = family == "sm90" and not f.interpreter
        self._by_span: dict[int, tuple] = {}
        self._by_splits: dict[tuple, tuple] = {}  # by (split count, balanced)

    def num_splits(self, span: int) -> int:
        if self.invariant:
            splits = invariant_splits(self.cfg, span)
            if self.has_workspace and splits > self.fit:
                per_split = self.batch * self.num_heads * (CKV_DIM + 1) * 4
                raise ValueError(
                    f"workspace_buffer: batch-invariant mode needs {splits} splits of {self.split_span} keys for "
                    f"max_seq_len={span}, at least {16 + 16384 + splits * per_split} bytes, got a workspace with "
                    f"room for {self.fit}")
            return splits
        return mla_configs.num_splits(self.cfg, items=self.items, span=span, sm_count=self.sm_count, fit=self.fit)

    def for_span(self, span: int) -> "_Plan":
        """The plan whose launches serve ``max_seq_len = span``: this one, or, where its padded programs
        would hold fewer than ``padded_min_keys`` keys each, the narrow (unpadded) plan."""
        if self.narrow is not None and span < self.padded_min_keys * self.num_splits(span):
            return self.narrow
        return self

    def launches(self, span: int) -> tuple:
        """``(split launch, combine launch or None, numel_o, numel_lse, partials16)`` for ``max_seq_len =
        span``; ``partials16``: the split kernel writes bfloat16 partials when the output is bfloat16
        (the warp-specialised kernel stages them like its final rows; ``kernels_gluon.store_rows``)."""
        hit = self._by_span.get(span)
        if hit is not None:
            return hit
        plan = self.for_span(span)
        if plan is not self:
            hit = plan.launches(span)
            self._memo(span, hit)
            return hit
        splits = self.num_splits(span)
        balanced = self.balanced(splits, span)
        hit = self._by_splits.get((splits, balanced))
        if hit is None:
            rows = self.batch * self.num_heads
            combine = self._combine(splits, balanced) if splits > 1 else None
            hit = (self._split(splits, balanced), combine, splits * rows * CKV_DIM, splits * rows, self.partials16)
            self._by_splits[splits, balanced] = hit
        self._memo(span, hit)
        return hit

    def _memo(self, span: int, hit: tuple) -> None:
        if len(self._by_span) >= _MAX_SPANS:
            self._by_span.clear()
        self._by_span[span] = hit

    def balanced(self, splits: int, span: int) -> bool:
        """Whether the launch of ``splits`` splits for ``max_seq_len = span`` takes the balanced split
        (``configs.balanced``; every MLA kernel has the ``BALANCED`` form, the Gluon ones by
        ``common.gluon_balance``)."""
        return mla_configs.balanced(splits=splits, batch=self.batch, invariant=self.invariant, span=span,
                                    min_chunk=self.cfg.min_chunk)

    def _balance_constexprs(self, balanced: bool) -> dict:
        """The balanced plan's constexprs (``common.balance.launch_unit``), or the uniform path's."""
        if not balanced:
            return dict(BALANCED=False, BLOCK_B=1, MIN_CHUNK=0, UNITS_CAP=1)
        return dict(BALANCED=True, BLOCK_B=next_power_of_2(self.batch), MIN_CHUNK=self.cfg.min_chunk,
                    UNITS_CAP=mla_configs.MAX_UNITS)

    def _split(self, splits: int, balanced: bool):
        cfg = self.cfg
        if self.gluon:
            return _gluon_split(self, splits, balanced)
        return fast_launch.Launch(
            mla_split_kernel, (self.items * splits,),
            layout=_LAYOUT,
            per_call=dict(q_ptr="query", kv_ptr="kv", table_ptr="table", seq_lens_ptr="seq_lens",
                          logit_scale_ptr="logit" if self.has_logit else "query",
                          out_scale_ptr="out_scale" if self.has_out_scale else "query", out_ptr="out",
                          part_o_ptr="part_o", part_lse_ptr="part_lse", lse_ptr="lse" if self.has_lse else "query",
                          logit_factor="logit_factor", out_factor="out_factor", capacity="capacity"),
            fixed=dict(self.strides, batch=self.batch, num_heads=self.num_heads, num_splits=splits,
                       num_pages=self.num_pages, stride_lse_b=self.lse_stride),
            constexprs=dict(
                CKV_DIM=CKV_DIM, KPE_DIM=KPE_DIM, PAGE_SIZE=self.page_size, BLOCK_H=cfg.block_h,
                BLOCK_N=cfg.block_n, H_BLOCKS=self.h_blocks, KV_FORMAT=self.kv_code, LOGIT_PTR=self.has_logit,
                OUT_PTR=self.has_out_scale, QK_FP8=cfg.qk_fp8, HEADS_AS_N=cfg.heads_as_n, SPLIT_SCORES=cfg.split_scores,
                STORE_LSE=self.has_lse, SPLIT_SPAN=self.split_span, Q_LEN=self.q_len,
                **self._balance_constexprs(balanced),
            ),
            options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        )

    def _combine(self, splits: int, balanced: bool) -> fast_launch.Launch:
        if balanced:
            return self._balanced_combine(splits)
        # The decode family's combine kernel; the query stands in for the absent sinks (and LSE).
        return fast_launch.Launch(
            decode_combine_kernel, (self.batch, self.num_heads),
            layout=_LAYOUT,
            per_call=dict(part_o_ptr="part_o", part_lse_ptr="part_lse", sinks_ptr="query",
                          out_scale_ptr="out_scale" if self.has_out_scale else "query", out_ptr="out",
                          lse_ptr="lse" if self.has_lse else "query", out_factor="out_factor"),
            fixed=dict(stride_o_t=self.strides["stride_o_b"], stride_o_h=self.strides["stride_o_h"],
                       stride_lse_t=self.lse_stride, num_rows=self.batch, num_splits=splits),
            constexprs=dict(
                NUM_HEADS=self.num_heads, HEAD_DIM=CKV_DIM, BLOCK_S=combine_block_s(splits, CKV_DIM, self.invariant),
                HAS_SINKS=False, OUT_PTR=self.has_out_scale, OUT_FP8=False, STORE_LSE=self.has_lse,
                USE_PDL=self.gdc,
            ),
            options=dict(num_warps=4, num_stages=2, **({"launch_pdl": True} if self.gdc else {})),
        )

    def _balanced_combine(self, splits: int) -> fast_launch.Launch:
        # A request's units: at most UNITS_CAP (ragged) or splits (equal lengths), in rounds of BLOCK_S.
        cx = self._balance_constexprs(True)
        most = max(splits, min(cx["UNITS_CAP"], self.batch * splits))
        wide, few = combine_block_s(most, CKV_DIM, False), combine_block_s(splits, CKV_DIM, False)
        if self.batch * self.num_heads > _WIDE_MERGE_PROGRAMS_PER_SM * self.sm_count:
            wide = min(wide, _MANY_PROGRAMS_BLOCK_S)
        return fast_launch.Launch(
            balanced_combine_kernel, (self.batch, self.num_heads),
            layout=_LAYOUT,
            per_call=dict(part_o_ptr="part_o", part_lse_ptr="part_lse", seq_lens_ptr="seq_lens",
                          out_scale_ptr="out_scale" if self.has_out_scale else "query", out_ptr="out",
                          lse_ptr="lse" if self.has_lse else "query", out_factor="out_factor", capacity="capacity"),
            fixed=dict(stride_o_t=self.strides["stride_o_b"], stride_o_h=self.strides["stride_o_h"],
                       stride_lse_t=self.lse_stride, batch=self.batch, num_splits=splits),
            constexprs=dict(
                NUM_HEADS=self.num_heads, HEAD_DIM=CKV_DIM, BLOCK_S=max(wide, few), BLOCK_S_FEW=few,
                OUT_PTR=self.has_out_scale, STORE_LSE=self.has_lse, MIN_CHUNK=cx["MIN_CHUNK"],
                BLOCK_N=GLUON_BLOCK_N if self.gluon else self.cfg.block_n, BLOCK_B=cx["BLOCK_B"],
                UNITS_CAP=cx["UNITS_CAP"], USE_PDL=self.gdc,
            ),
            options=dict(num_warps=4, num_stages=2, **({"launch_pdl": True} if self.gdc else {})),
        )


def gluon_aligned(query: torch.Tensor, kv: torch.Tensor) -> bool:
    """What the Gluon kernels need of the pointers: the cache's base 16-byte aligned (its TMA
    view), and the query's rows 16-byte pieces Triton can prove so (its ``cp.async`` staging, whose
    vector width comes from the specialisation: a 16-byte aligned base and every stride a multiple
    of 16 elements). Other queries (a view with odd strides, an offset base) take the Triton
    kernel, which loads any layout."""
    return (kv.data_ptr() % 16 == 0 and query.data_ptr() % 16 == 0
            and all(s % 16 == 0 for s in query.stride()[:-1]))


def _gluon_fits(cfg: mla_configs.MLAConfig, kv_format: str, q_dtype, kv_dtype, kv_shape, kv_stride,
                aligned16: bool) -> bool:
    """Whether a Gluon kernel (:mod:`.kernels_gluon`, or :mod:`.kernels_gluon_ws` where it takes the entry) runs
    a launch: 16-bit cache and query of one dtype on a Gluon tile and cache view (:func:`_gluon_tiles_fit`)."""
    return (BY_NAME[kv_format].element_bits == 16 and q_dtype == kv_dtype and not cfg.qk_fp8
            and _gluon_tiles_fit(cfg, kv_shape, kv_stride, aligned16, elem_bytes=2))


def _ws_fp8_fits(cfg: mla_configs.MLAConfig, q_dtype, kv_dtype, kv_shape, kv_stride, aligned16: bool) -> bool:
    """Whether the warp-specialised kernel's e4m3 form (:mod:`.kernels_gluon_ws`) runs an fp8 launch: an
    e4m3 query over an e4m3 cache on the fp8-score entry, on a Gluon tile and cache view
    (:func:`_gluon_tiles_fit`)."""
    return (q_dtype == FP8_DTYPE and kv_dtype == FP8_DTYPE and cfg.qk_fp8
            and _gluon_tiles_fit(cfg, kv_shape, kv_stride, aligned16, elem_bytes=1))


def _gluon_tiles_fit(cfg: mla_configs.MLAConfig, kv_shape, kv_stride, aligned16: bool, elem_bytes: int) -> bool:
    """What both Gluon kernels need of the entry and the cache: 64 heads a program in M (not heads in
    N), 64-key tiles of 8 warps over pages of a multiple of 64 tokens or of 16 or 32
    (:func:`_tile_pages`), and rows TMA can address as one ``[pages * page, 576]`` view (16-byte
    aligned base and row stride, pages back to back, row indices within int32)."""
    pages, page = kv_shape[0], kv_shape[1]
    return (cfg.block_h == 64 and cfg.block_n == 64 and cfg.num_warps == 8 and not cfg.heads_as_n
            and _tile_pages(page) and aligned16 and kv_stride[-1] == 1 and (kv_stride[1] * elem_bytes) % 16 == 0
            and kv_stride[0] == page * kv_stride[1] and pages * page < 2**31)


def _tile_pages(page: int) -> bool:
    """Whether the Gluon kernels' 64-key tile (``GLUON_BLOCK_N``) lies over whole pages of ``page``
    tokens: a page of a multiple of 64 holds whole tiles (one TMA box of 64 rows a 64-column piece),
    and a tile spans two pages of 32 or four of 16 (one box of ``page`` rows a page and piece, the
    kernels' ``PAGE_SIZE < BLOCK_N`` path). Smaller pages would take more boxes than the copies
    afford (lab/notes/mla.md "MLA: Gluon kernels over pages of 16 and 32")."""
    return page % GLUON_BLOCK_N == 0 or page in (16, 32)


GLUON_BLOCK_N = 64  # keys a Gluon program's tile holds (64 rows of the cache)


def _box_rows(page: int) -> int:
    """Rows of the Gluon kernels' TMA box: a tile's 64, or a whole page where a tile spans pages
    (:func:`_tile_pages`; the kernels issue one box a page into the tile's rows)."""
    return min(page, GLUON_BLOCK_N)


def _row_layout(kv_dtype):
    """The shared-memory layout of a TMA box ``[64 or page rows, 64 columns]`` of the cache: 128-byte
    swizzled 16-bit rows, or 64-byte swizzled e4m3 rows (a box's width; lab/notes/mla.md "MLA:
    fp8 on the seesaw")."""
    if kv_dtype == FP8_DTYPE:
        return _gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    return _gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)




def _gluon_split(plan: _Plan, splits: int, balanced: bool) -> fast_launch.Launch:
    """The split launch of a Gluon kernel: :func:`~.kernels_gluon_ws.mla_gluon_ws_kernel` (``plan.ws``:
    4 warps a partition, the registers a thread its ``warp_specialize`` redistributes, no final
    LSE) or :func:`~.kernels_gluon.mla_gluon_kernel`, each reading the cache through a TMA
    descriptor of its rows as one ``[pages * page, 576]`` view, which the launch builds on the
    call's cache (a call replayed from its metadata rebuilds it on the new pointer:
    lab/notes/host-path.md "Host path: calls replayed from their metadata")."""
    st = plan.strides
    per_call = dict(q_ptr="query", kv_desc="kv", table_ptr="table", seq_lens_ptr="seq_lens", logit_scale_ptr="logit",
                    out_scale_ptr="out_scale", out_ptr="out", part_o_ptr="part_o", part_lse_ptr="part_lse",
                    capacity="capacity", logit_factor="logit_factor", out_factor="out_factor")
    fixed = dict(stride_q_b=st["stride_q_b"], stride_q_h=st["stride_q_h"], stride_o_b=st["stride_o_b"],
                 stride_o_h=st["stride_o_h"], stride_t_b=st["stride_t_b"], stride_t_p=st["stride_t_p"],
                 batch=plan.batch, num_heads=plan.num_heads, num_splits=splits, num_pages=plan.num_pages)
    constexprs = dict(
        CKV_DIM=CKV_DIM, KPE_DIM=KPE_DIM, PAGE_SIZE=plan.page_size, BLOCK_H=plan.cfg.block_h, BLOCK_N=GLUON_BLOCK_N,
        H_BLOCKS=plan.h_blocks, LOGIT_PTR=plan.has_logit, OUT_PTR=plan.has_out_scale, SPLIT_SPAN=plan.split_span,
        Q_LEN=plan.q_len, **plan._balance_constexprs(balanced),
    )
    if plan.ws:
        kernel, options = mla_gluon_ws_kernel, dict(num_warps=_WS_WARPS.value, maxnreg=_WS_MAXNREG.value)
    else:  # the final LSE (return_lse); without one the partials' LSE stands in for the pointer, never read
        kernel, options = mla_gluon_kernel, dict(num_warps=8)
        per_call["lse_ptr"] = "lse" if plan.has_lse else "part_lse"
        fixed["stride_lse_b"] = plan.lse_stride
        constexprs["STORE_LSE"] = plan.has_lse
    rows = fast_launch.Descriptor("kv", (plan.num_pages * plan.page_size, CKV_DIM + KPE_DIM), (plan.row_stride, 1),
                                  (_box_rows(plan.page_size), 64), _row_layout(plan.kv_dtype))
    return fast_launch.Launch(kernel, (plan.items * splits,), layout=_LAYOUT, per_call=per_call, fixed=fixed,
                              constexprs=constexprs, options=options, descriptors=(rows,))


# The balanced combine's wide tile (a request of more units than the launch's split count) sets
# its registers for every program: 16 partials of 512 columns a round take 93 a thread (sm_90a,
# 4 warps), 5 programs an SM, against 32 (16 programs) at 4. A launch of more programs than the
# wide tile keeps resident merges at most 4 partials a round: an equal 64 x 4096 batch at 64 heads
# (4096 programs) spent 11.9-12.3 us in the combine against the uniform combine's 4.9
# (lab/notes/mla-ragged.md "The balanced combine's registers").
_WIDE_MERGE_PROGRAMS_PER_SM = 5
_MANY_PROGRAMS_BLOCK_S = 4

_PLANS: dict[MLAFacts, _Plan] = {}


def _plan(facts: MLAFacts) -> _Plan:
    return cached_plan(_PLANS, facts, _Plan, bool(mla_configs._override))


def launch_mla(
    query: torch.Tensor,  # [B, Q * Hq, 576]
    kv: torch.Tensor,  # [P, page, 576] or [P, page, 1, 576] latent rows
    table: torch.Tensor,  # [B, pages_per_seq] int32
    seq_lens: torch.Tensor,  # [B] int32 / uint32
    out: torch.Tensor,  # [B, Q * Hq, 512]
    *,
    max_seq_len: int,
    logit_factor: float = 1.0,
    logit_tensor=None,
    out_factor: float = 1.0,
    out_tensor=None,
    workspace=None,  # None: the split partials are allocated
    lse=None,  # [B, Q * Hq] float32 base-2 LSE (row stride 1)
    q_len: int = 1,  # query tokens a request: query / out / lse rows are Q * Hq, token-major
) -> None:
    """Launch MLA decode into ``out``, with the query's GPU current."""
    if not query.numel():  # an empty batch (validation rejects zero heads): nothing to write or plan
        return
    device_index = query.get_device()  # -1 on the CPU
    with device_guard(device_index):
        seq_lens = int32_lengths(seq_lens)
        # Every host fact the plan reads, each in a local of its MLAFacts field's name.
        device, interpreter = query.device, _env.triton_interpret()
        q_shape, q_stride, q_dtype = query.shape, query.stride(), query.dtype
        kv_shape, kv_stride, kv_dtype = kv.shape, kv.stride(), kv.dtype
        table_stride, out_stride = table.stride(), out.stride()
        ws_numel = workspace.numel() if workspace is not None else None
        has_logit, has_out_scale = logit_tensor is not None, out_tensor is not None
        aligned4 = kv.dtype == FP8_DTYPE and kv.data_ptr() % 4 == 0
        aligned16 = gluon_aligned(query, kv)
        gluon_on, gluon_ws_on = _versions.gluon_on(), _env.gluon_ws()
        lse_stride = lse.stride(0) if lse is not None else None
        batch_invariant = _env.batch_invariant()
        facts = MLAFacts._make((
            device, interpreter, q_shape, q_stride, q_dtype, kv_shape, kv_stride, kv_dtype, table_stride,
            out_stride, ws_numel, has_logit, has_out_scale, aligned4, aligned16, gluon_on, gluon_ws_on, lse_stride,
            batch_invariant, q_len,
        ))
        plan = _plan(facts)
        # The table's capacity in tokens: every kernel clamps the lengths to it
        # (lab/notes/robustness.md "Device-side clamps").
        capacity = table.shape[1] * kv.shape[1]
        split, combine, numel_o, numel_lse, partials16 = plan.launches(max_seq_len)
        part_o, part_lse = split_partials(combine is not None, workspace, numel_o, numel_lse, out)
        if partials16 and out.dtype == torch.bfloat16:
            part_o = part_o.view(torch.bfloat16)  # (the first numel_o of twice as many)
        call = fast_launch.call_args(  # in _LAYOUT's order
            (query, kv, table, seq_lens, out, part_o, part_lse,
             logit_tensor if logit_tensor is not None else query, out_tensor if out_tensor is not None else query,
             lse if lse is not None else query),
            (capacity,), (logit_factor, out_factor), device_index,
        )
        split(call)
        if combine is not None:
            combine(call)
