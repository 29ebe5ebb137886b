"""The host side of the warp-specialised Gluon prefill kernel (:mod:`.kernels_gluon_ws`): which
launches may take it (:func:`eligible`, :func:`plan`), the TMA views of the caches
(:func:`tma_view`), and its launch (:func:`launch`), all from host facts: the
prefill plan (:mod:`.plan`) builds the launch once for a call's facts and keeps it. A cache's
pages are a :class:`~kvattn.runtime.common.Pages`."""

from __future__ import annotations

import torch
import triton

from ...runtime import fast_launch
from ...runtime.common import Pages, pages_of
from ..common.gluon_dequant import row_smem
from .configs import ws_config
from .kernels_gluon_ws import _box_cols, prefill_ws_kernel

TRITON_VERSION = tuple(int(x) for x in triton.__version__.split(".")[:2])

# Ring depths a converted (fp8, not staged) launch may take: more buffers gave NaN rows on the H100,
# not understood yet (lab/notes/prefill.md "Prefill: fp8 caches in the warp-specialised kernel");
# a diagnostic may widen it.
CONVERTED_RING_STAGES = (2,)
MAXNREG = 168  # 12 warps: 3 warpgroups x 128 threads x 168 = 64512 of the 65536 registers
HEAD_DIMS = (64, 128, 256)


def tma_view(t, page: int):
    """``(rows_per_page, total_rows, head_rows, head_cols, cols, row_stride)`` of a 16-bit or fp8 cache
    ``t [P, page, Hkv, D]`` (an NHD view of any layout) as the 2-D ``[total_rows, cols]`` view the
    kernel's TMA boxes read, or None where TMA cannot address it.

    HND pages (each head's slots consecutive rows of D): row stride D, a page ``rows_per_page =
    stride_page / D`` rows apart, head ``h`` at row ``h * page`` of its page (``head_rows`` =
    page). NHD pages (heads side by side in a row): row stride Hkv * D, head ``h`` at column
    ``h * D`` (``head_cols`` = D). The view ends with the last page's last row, so a box at row
    ``total_rows`` reads zeros. TMA's rules: 16-byte aligned base and strides; coordinates int32.
    ``t``: the cache's ``Pages`` (or the tensor).
    """
    t = pages_of(t)
    pages, page_, heads, dim = t.shape
    sp, ss, sh, sd = t.stride
    esize = t.dtype.itemsize
    if sd != 1 or page_ != page or not t.aligned16 or pages == 0:
        return None
    if ss == dim and sh == page * dim:  # HND
        row_stride, cols, head_rows, head_cols, last = dim, dim, page, 0, heads * page
    elif sh == dim and ss == heads * dim:  # NHD
        row_stride, cols, head_rows, head_cols, last = heads * dim, heads * dim, 0, dim, page
    else:
        return None
    if sp % row_stride or (row_stride * esize) % 16:
        return None
    rows_per_page = sp // row_stride
    total_rows = (pages - 1) * rows_per_page + last
    if rows_per_page < last or total_rows >= 2**31 - 1:
        return None
    return rows_per_page, total_rows, head_rows, head_cols, cols, row_stride


def kind_of(q_dtype, kv_dtype, v_dtype=None) -> str | None:
    """The operand kind (the cache format's ``config_key``, or ``"fp8qk"``, as the Triton kernel's
    tables name them) of a query and cache this kernel reads, or None: ``"half"`` (16-bit query
    and cache of one dtype), ``"fp8"`` (16-bit query over an fp8 cache), ``"fp8qk"`` (fp8 query
    and cache), ``"fp8qk-staged"`` (the same with V as float16 pages, ``v_dtype``: see
    :func:`values_fit`)."""
    import torch

    from ..._formats_table import BY_DTYPE
    from ...formats import FP8_DTYPE

    fmt = BY_DTYPE.get(kv_dtype)
    key = fmt.config_key if fmt is not None else None
    if q_dtype == FP8_DTYPE:
        if key != "fp8":
            return None
        return "fp8qk-staged" if v_dtype is not None and v_dtype != kv_dtype else "fp8qk"
    if q_dtype not in (torch.float16, torch.bfloat16) or (key == "half" and kv_dtype != q_dtype):
        return None
    return key


def config_for(q_dtype, kv_dtype, head_dim: int, v_dtype=None):
    """This kernel's tiles (``configs.WSConfig``) for a query, a cache (V's pages of ``v_dtype``
    where they differ from K's) and a head_dim, or None where it has none (NVFP4 caches, D256
    under a 16-bit query over fp8, other head dims)."""
    kind = kind_of(q_dtype, kv_dtype, v_dtype)
    return ws_config(head_dim, kind) if kind is not None and head_dim in HEAD_DIMS else None


def eligible(*, hopper: bool, gluon_on: bool, q_dtype, kv_dtype, out_dtype, head_dim: int, page: int,
             skip: bool, nvfp4_out: bool) -> bool:
    """Whether a launch may take this kernel (the views must be TMA-addressable too, see
    :func:`tma_view`): host-known facts only. Every other launch takes the Triton kernel."""
    import torch

    cfg = config_for(q_dtype, kv_dtype, head_dim)
    return (hopper and gluon_on and TRITON_VERSION >= (3, 6) and cfg is not None
            and out_dtype in (torch.float16, torch.bfloat16) and not nvfp4_out and not skip
            and pages_tile(page, cfg.block_n))


def pages_tile(page: int, block_n: int) -> bool:
    """Whether key tiles of ``block_n`` tokens are made of whole boxes of ``min(page, block_n)``
    rows, each inside one page: a tile of several whole pages, or a page of several whole tiles.
    A page of 192 tokens under 128-key tiles is neither (its second tile would run past the page).
    Boxes of fewer than 8 rows would split the 128-byte swizzle's 8-row pattern."""
    return page >= 8 and (block_n % page == 0 or page % block_n == 0)


def values_fit(q_dtype, k_dtype, v_dtype) -> bool:
    """Whether V's type goes with K's: the same, or float16 pages staged for an fp8 query over an
    fp8 cache (:mod:`.staging`; its P.V product is float16)."""
    import torch

    from ...formats import FP8_DTYPE

    return v_dtype == k_dtype or (q_dtype == FP8_DTYPE and k_dtype == FP8_DTYPE and v_dtype == torch.float16)


def plan(*, device: torch.device, gluon_on: bool, q_dtype, head_dim: int, k: Pages, v: Pages, out_dtype,
         skip: bool, nvfp4_out: bool, interpreter: bool):
    """``(config, k_view, v_view)`` (:func:`config_for`, :func:`tma_view`) where this kernel takes
    the launch of a query of ``q_dtype`` and ``head_dim`` over the pages ``k``, ``v`` on
    ``device`` (``gluon_on``: ``versions.gluon_on()``), else None."""
    from ...runtime import device as _device

    if interpreter or device.type != "cuda":
        return None
    if not eligible(hopper=_device.is_hopper(device), gluon_on=gluon_on, q_dtype=q_dtype, kv_dtype=k.dtype,
                    out_dtype=out_dtype, head_dim=head_dim, page=k.shape[1], skip=skip,
                    nvfp4_out=nvfp4_out) or not values_fit(q_dtype, k.dtype, v.dtype):
        return None
    k_view, v_view = tma_view(k, k.shape[1]), tma_view(v, v.shape[1])
    if k_view is None or v_view is None or k_view[2:4] != v_view[2:4]:  # K and V in one form
        return None
    return config_for(q_dtype, k.dtype, head_dim, v.dtype), k_view, v_view


def launch(cfg, f, k: Pages, v: Pages, k_view, v_view, *, kt_stride: tuple, vt_stride: tuple, max_q_len: int,
           sm_count: int, capacity: int) -> fast_launch.Launch:
    """The launch of :func:`prefill_ws_kernel` (``cfg``: ``configs.WSConfig``; views from
    :func:`tma_view`) for a call of host facts ``f`` (the prefill plan's ``PrefillFacts``) over the
    pages ``k``, ``v`` and tables of strides ``kt_stride``, ``vt_stride`` (the cache's, or staged
    copies: :mod:`.staging`), every kernel parameter by its name. The launch builds the two TMA
    descriptors on each call's K/V (a call replayed from its metadata rebuilds them on the new
    pointers: lab/notes/host-path.md "Host path: calls replayed from their metadata").
    ``capacity``: the tokens a request may hold, where its lengths are clamped (the table's, or
    the staged room, :mod:`.staging`). The call's tensors: :data:`LAYOUT`."""
    sum_q, num_heads, head_dim = f.q_shape
    batch = f.batch
    page = k.shape[1]
    sub = min(page, cfg.block_n)
    kv_fp8 = k.dtype.itemsize == 1  # fp8 K pages (16-bit V pages with them: V staged, see values_fit)
    v_staged = kv_fp8 and v.dtype.itemsize == 2
    if kv_fp8 and not v_staged and cfg.stages not in CONVERTED_RING_STAGES:
        raise ValueError(f"fp8 caches take 2 buffers a ring in the Gluon prefill kernel, got {cfg.stages}")
    # (boxes of 128 bytes of a row, in the layout of the kernel's buffers they land in)
    descriptors = tuple(
        fast_launch.Descriptor(name, (view[1], view[4]), (view[5], 1), (sub, _box_cols(head_dim, p.dtype.itemsize)),
                               row_smem(head_dim, p.dtype.itemsize))
        for name, p, view in (("k", k, k_view), ("v", v, v_view)))
    m_tiles = -(-max_q_len // 128)
    num_tiles = num_heads * batch * m_tiles
    grid = (max(1, min(num_tiles, sm_count)),)
    return fast_launch.Launch(  # every kernel parameter by its name
        prefill_ws_kernel, grid, layout=LAYOUT, per_call=_PER_CALL,
        fixed=dict(
            stride_q_t=f.q_stride[0], stride_q_h=f.q_stride[1], stride_o_t=f.out_stride[0],
            stride_o_h=f.out_stride[1], stride_kt_b=kt_stride[0], stride_kt_p=kt_stride[1],
            stride_vt_b=vt_stride[0], stride_vt_p=vt_stride[1],
            num_rows=sum_q, num_heads=num_heads, batch=batch, m_tiles=m_tiles, num_tiles=num_tiles,
            k_num_pages=k.shape[0], v_num_pages=v.shape[0], capacity=capacity, window_left=f.window_left,
            k_page_rows=k_view[0], v_page_rows=v_view[0], k_total_rows=k_view[1], v_total_rows=v_view[1],
            head_rows=k_view[2], head_cols=k_view[3],
        ),
        constexprs=dict(
            HEAD_DIM=head_dim, PAGE_SIZE=page, GROUP=num_heads // k.shape[2], BLOCK_N=cfg.block_n,
            STAGES=cfg.stages, HAS_WINDOW=f.window_left >= 0, HAS_SINKS=f.has_sinks,
            LOGIT_PTR=f.has_logit, OUT_PTR=f.has_out_scale, PINGPONG=cfg.pingpong,
            KV_FP8=kv_fp8, V_STAGED=v_staged, CAUSAL=f.causal,
        ),
        options=dict(num_warps=4, maxnreg=MAXNREG),
        descriptors=descriptors,
    )


# The per-call values of a launch by name (fast_launch.CallLayout), and the kernel parameters that
# take them; every other parameter is fixed by the call's shapes (``launch``). K and V: the pages
# the kernel reads (the launch's descriptors are built on them).
LAYOUT = fast_launch.CallLayout(
    ("query", "out", "k", "v", "k_table", "v_table", "seq_lens", "cum_q", "sinks", "logit", "out_scale"), (),
    ("logit_factor", "out_factor"),
)
_PER_CALL = dict(
    q_ptr="query", out_ptr="out", k_desc="k", v_desc="v", k_table_ptr="k_table", v_table_ptr="v_table",
    seq_lens_ptr="seq_lens", cum_q_ptr="cum_q", sinks_ptr="sinks", logit_scale_ptr="logit",
    out_scale_ptr="out_scale", logit_factor="logit_factor", out_factor="out_factor",
)


__all__ = ["HEAD_DIMS", "eligible", "launch", "pages_of", "plan", "tma_view"]
