"""Pages staged once a call into the workspace, in the form the warp-specialised kernel reads best.

Why. Inside :mod:`.kernels_gluon_ws` an fp8 page is converted to float16 by a converter partition every
time a query tile reads it: at 1 x 8192 (Hq 32, Hkv 8, 64 query tiles) each page about 130 times,
and two converter warps cannot keep up with the tensor cores (+15-17 % over a bf16 cache on the
H100); NVFP4 pages have no converter at all (the Triton kernel, ~2x the bf16 time); and pages of
fewer than 64 tokens make the kernel copy a key tile in many small boxes (~10 % slower at page 16).
Staging each page the call reads once, in a pass at copy bandwidth before the attention kernel
(~23 us at 1 x 8192, H100), leaves the attention kernel 16-bit pages of 64 tokens or more
(lab/notes/prefill.md "Prefill: pages dequantised once a call").

What is staged, where. Each request's keys from the first its first query tile can see (the
window's start, rounded down to 128 keys) to its last, as the pages of a cache ``[B * dst_pages,
DST_PAGE, Hkv, D]`` in the workspace (request ``b``'s tokens in order from page ``b * dst_pages``;
``DST_PAGE`` the cache's page, at least 64 tokens), in the query's 16-bit type (fp8 and NVFP4
values are exact in either), and a page table pointing at them. Tokens past ``seq_lens[b]`` and
tokens whose page id lies outside the cache are staged as zeros, so the attention kernel never
meets a NaN the cache held in an unused slot. An fp8 query keeps its scores on e4m3 products over
the cache's own K pages; only V is staged (float16, in the cache's page size).

The staged cache sits in the workspace after the decode kernels' merge counters
(:mod:`..launch.workspace`), which stay zero at rest. A call whose copies do not fit, or for which
the pass does not pay (:func:`pays`), reads the cache as it is.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ..._formats_table import BY_DTYPE
from ..._inputs import cached_aliases
from ...formats import FP8_DTYPE
from ...runtime import fast_launch
from ...runtime.common import kv_format_code, words_aligned, words_allowed
from ...runtime.plans import cached_plan
from ...runtime.workspace import scratch_start
from . import configs as prefill_configs
from .kernels_staging import stage_pages_kernel

STAGE_ALIGN = 1024  # bytes: each staged cache starts on a 1024-byte boundary (TMA wants 16)
KEY_ALIGN = 128  # keys: a query tile's first key tile starts on a multiple of its BLOCK_N (64 or 128)
TOKENS = 64  # tokens a program stages (at most; a divisor of the staged page)
MIN_DST_PAGE = 64  # tokens a staged page holds at least
NUM_WARPS = 4


class Staged(NamedTuple):
    """Where a call's staged pages live: ``k`` (None for an fp8 query: its scores read the cache's
    own K) and ``v`` ``[B * dst_pages, DST_PAGE, Hkv, D]`` (an NHD view, laid out as the cache's K:
    HND or NHD, so the attention kernel reads both in one form), and ``table [B, dst_pages]``;
    ``capacity``: the keys a request may hold, where its length is clamped by the staging and the
    attention kernel alike (the cache table's, or the staged room if less)."""

    k: torch.Tensor | None
    v: torch.Tensor
    table: torch.Tensor
    capacity: int


def staged_dtype(q_dtype: torch.dtype) -> torch.dtype:
    """The staged pages' type: the query's 16-bit type, float16 under an fp8 query (its P.V product)."""
    return torch.float16 if q_dtype == FP8_DTYPE else q_dtype


def staged_page(page: int, both: bool) -> int:
    """Tokens a staged page holds. K and V both staged (``both``): the cache's page, or
    ``MIN_DST_PAGE`` for smaller pages (the attention kernel then copies key tiles in boxes of 64
    rows instead of a box a page). V alone (an fp8 query): the cache's page, as its K, read from the
    cache, must have the same."""
    return max(page, MIN_DST_PAGE) if both else page


def stages(q_dtype: torch.dtype, kv_dtype: torch.dtype, page: int) -> bool:
    """Whether a call of this query over this cache may stage its pages: a quantised cache (fp8,
    NVFP4) under a 16-bit query, an fp8 cache under an fp8 query (V only), a 16-bit cache of the
    query's type in pages smaller than ``MIN_DST_PAGE``."""
    fmt = BY_DTYPE.get(kv_dtype)
    if fmt is None:
        return False
    if fmt.config_key == "half":
        return kv_dtype == q_dtype and page < MIN_DST_PAGE
    if q_dtype == FP8_DTYPE:
        return kv_dtype == FP8_DTYPE
    return q_dtype in (torch.float16, torch.bfloat16)


def pays(q_dtype: torch.dtype, kv_dtype: torch.dtype, max_q_len: int, group: int) -> bool:
    """Whether staging is worth its pass: always for NVFP4 (the alternative is the Triton kernel);
    for fp8 (the alternative: the converter partition) and small 16-bit pages (boxes of a page),
    only where the query rows a key serves (``max_q_len`` x the GQA group, host-known) are enough
    to spread the pass's traffic over (``configs.STAGE_MIN_ROWS``; lab/notes/prefill.md "Prefill:
    pages dequantised once a call")."""
    fmt = BY_DTYPE[kv_dtype]
    if fmt.scale_block:  # NVFP4
        return True
    key = "half" if fmt.config_key == "half" else ("fp8q" if q_dtype == FP8_DTYPE else "fp8")
    return max_q_len * group >= prefill_configs.STAGE_MIN_ROWS[key]


def staged_bytes(batch: int, dst_pages: int, dst_page: int, heads: int, head_dim: int, both: bool) -> int:
    """Workspace bytes a staging needs past the counters: the staged caches (2-byte elements, each
    from a ``STAGE_ALIGN`` boundary) and the table."""
    return STAGE_ALIGN + (2 if both else 1) * _plane_bytes(batch * dst_pages, dst_page, heads, head_dim) + \
        batch * dst_pages * 4


def _plane_bytes(pages: int, dst_page: int, heads: int, head_dim: int) -> int:
    """Bytes one staged cache takes, to the next ``STAGE_ALIGN`` boundary."""
    return -(-pages * dst_page * heads * head_dim * 2 // STAGE_ALIGN) * STAGE_ALIGN


class Geometry(NamedTuple):
    """What a call stages, from its host facts alone (:func:`geometry`): ``batch`` requests of
    ``dst_pages`` pages of ``dst_page`` tokens, ``heads`` x ``head_dim`` each, of ``dtype``, HND
    (``hnd``) or NHD, K and V (``both``) or V alone; ``capacity`` as :class:`Staged`'s."""

    batch: int
    dst_pages: int
    dst_page: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    hnd: bool
    both: bool
    capacity: int

    def page_stride(self) -> tuple:
        """Strides of a staged cache ``[batch * dst_pages, dst_page, heads, head_dim]`` (elements)."""
        d, page, heads = self.head_dim, self.dst_page, self.heads
        if self.hnd:  # [n, Hkv, page, D] seen as [n, page, Hkv, D]
            return (heads * page * d, d, page * d, 1)
        return (page * heads * d, heads * d, d, 1)

    def page_shape(self) -> tuple:
        return (self.batch * self.dst_pages, self.dst_page, self.heads, self.head_dim)


def geometry(q_dtype: torch.dtype, q_heads: int, head_dim: int, k_shape: tuple, k_stride: tuple,
             kv_dtype: torch.dtype, table_shape: tuple, usable: int | None, max_q_len: int,
             max_kv_len: int) -> Geometry | None:
    """The staging of a call (see :func:`plan`) from its host facts: the query's dtype and heads,
    the cache's K pages ``[P, page, Hkv, D]`` (shape, strides, dtype), the K table's shape, the
    workspace bytes past the counters (``usable``; None without a workspace) and the host bounds;
    None where the call does not stage."""
    _, page, heads, _ = k_shape
    if usable is None or not stages(q_dtype, kv_dtype, page) or heads == 0 or \
            not pays(q_dtype, kv_dtype, max_q_len, q_heads // heads):
        return None
    batch, pages_per_seq = table_shape
    both = q_dtype != FP8_DTYPE
    dst_page = staged_page(page, both)
    dst_pages = -(-min(pages_per_seq * page, max(max_kv_len, 0)) // dst_page)
    if batch * dst_pages == 0 or staged_bytes(batch, dst_pages, dst_page, heads, head_dim, both) > usable:
        return None
    # Both staged under a 16-bit query: HND (a head's slots of a page are one TMA box); an fp8
    # query's V takes K's form.
    hnd = True if both else (k_stride[1] == k_shape[3] and k_stride[2] == page * k_shape[3])
    return Geometry(batch, dst_pages, dst_page, heads, head_dim, staged_dtype(q_dtype), hnd, both,
                    min(pages_per_seq * page, dst_pages * dst_page))


def usable_bytes(workspace) -> int | None:
    """Workspace bytes past the counters a staging may take (None without a workspace)."""
    return None if workspace is None else workspace.numel() - scratch_start(workspace)


def views(workspace: torch.Tensor, g: Geometry) -> Staged:
    """The staged caches of :class:`Geometry` ``g`` in ``workspace`` (views kept per workspace tensor)."""
    v, table, *k = cached_aliases(workspace, ("prefill-staged",), _views, g.batch, g.dst_pages, g.dst_page, g.heads,
                                  g.head_dim, g.dtype, g.hnd, g.both)
    return Staged(k[0] if k else None, v, table, g.capacity)


def _views(workspace, batch, dst_pages, dst_page, heads, head_dim, dtype, hnd, both):
    start = scratch_start(workspace)
    start += (-(workspace.data_ptr() + start)) % STAGE_ALIGN
    n = batch * dst_pages
    cache = _plane_bytes(n, dst_page, heads, head_dim)

    def plane(offset):
        flat = workspace[offset: offset + n * dst_page * heads * head_dim * 2].view(dtype)
        if hnd:  # [n, Hkv, page, D] seen as [n, page, Hkv, D]
            return flat.view(n, heads, dst_page, head_dim).transpose(1, 2)
        return flat.view(n, dst_page, heads, head_dim)

    table_at = start + (2 if both else 1) * cache
    table = workspace[table_at: table_at + n * 4].view(torch.int32).view(batch, dst_pages)
    return (plane(start), table) + ((plane(start + cache),) if both else ())


def plan(query: torch.Tensor, k: torch.Tensor, k_table: torch.Tensor, workspace, max_q_len: int,
         max_kv_len: int) -> Staged | None:
    """The staged caches of a call in ``workspace`` (views kept per workspace tensor), or None
    where the call does not stage (:func:`stages`, :func:`pays`) or its copies do not fit the
    workspace. Each request gets room for ``max_kv_len`` keys (the caller's bound: an engine's
    table is often as wide as the longest context it serves), and its keys are clamped there
    (``Staged.capacity``). The form (HND or NHD) is K's: an fp8 query reads K from the cache and V
    from the workspace in one form. (:func:`geometry` then :func:`views`.)"""
    g = geometry(query.dtype, query.shape[1], query.shape[-1], tuple(k.shape), k.stride(), k.dtype,
                 tuple(k_table.shape), usable_bytes(workspace), max_q_len, max_kv_len)
    return None if g is None else views(workspace, g)


_LAYOUT = fast_launch.CallLayout(
    ("k", "v", "k_sf", "v_sf", "k_table", "v_table", "seq_lens", "cum_q", "k_dst", "v_dst", "dst_table"), (), (),
)


class StageFacts(NamedTuple):
    """Every host fact a staging launch reads: the key of its plan cache (built positionally from
    locals of the fields' names in :func:`launch`)."""

    table_shape: tuple  # the staged table [B, dst_pages]
    dst_shape: tuple  # the staged V [B * dst_pages, DST_PAGE, Hkv, D]
    dst_stride: tuple
    stage_k: bool  # K staged too (a 16-bit query)
    k_shape: tuple  # [P, page, Hkv, Ds] NHD view of the cache's K pages
    k_stride: tuple
    v_stride: tuple
    kv_dtype: torch.dtype
    ksf_stride: tuple | None  # NVFP4 block scales
    vsf_stride: tuple | None
    kt_stride: tuple
    vt_stride: tuple
    capacity: int
    window_left: int
    head_dim: int
    words_ok: bool  # the cache read as 32-bit words (runtime.common.words_allowed)


def _stage_launch(f: StageFacts) -> fast_launch.Launch:
    """The launch of :func:`~.kernels_staging.stage_pages_kernel`: one program a (chunk of
    ``TOKENS`` tokens, KV head, request), sized from the table's shape (host-known); chunks past a
    request's length return at once."""
    batch, dst_pages = f.table_shape
    _, page, heads, _ = f.k_shape
    dst_page = f.dst_shape[1]
    tokens = math.gcd(dst_page, TOKENS)
    ksf_s = tuple(f.ksf_stride[:3]) if f.ksf_stride is not None else (0, 0, 0)
    vsf_s = tuple(f.vsf_stride[:3]) if f.vsf_stride is not None else (0, 0, 0)
    kv_code = kv_format_code(BY_DTYPE[f.kv_dtype].name, f.words_ok, (*f.k_stride[:3], *f.v_stride[:3]), f.head_dim,
                             (*ksf_s, *vsf_s))
    ks, vs, ds = f.k_stride, f.v_stride, f.dst_stride
    return fast_launch.Launch(
        stage_pages_kernel, (dst_pages * dst_page // tokens, heads, batch), layout=_LAYOUT,
        per_call=dict(k_ptr="k", v_ptr="v", k_sf_ptr="k_sf", v_sf_ptr="v_sf", k_table_ptr="k_table",
                      v_table_ptr="v_table", seq_lens_ptr="seq_lens", cum_q_ptr="cum_q", k_dst_ptr="k_dst",
                      v_dst_ptr="v_dst", dst_table_ptr="dst_table"),
        fixed=dict(
            stride_k_p=ks[0], stride_k_s=ks[1], stride_k_h=ks[2], stride_v_p=vs[0], stride_v_s=vs[1],
            stride_v_h=vs[2], stride_ksf_p=ksf_s[0], stride_ksf_s=ksf_s[1], stride_ksf_h=ksf_s[2],
            stride_vsf_p=vsf_s[0], stride_vsf_s=vsf_s[1], stride_vsf_h=vsf_s[2],
            stride_kt_b=f.kt_stride[0], stride_kt_p=f.kt_stride[1], stride_vt_b=f.vt_stride[0],
            stride_vt_p=f.vt_stride[1], stride_d_p=ds[0], stride_d_s=ds[1], stride_d_h=ds[2],
            dst_pages=dst_pages, num_pages=f.k_shape[0], capacity=f.capacity,
            window_left=f.window_left,
        ),
        constexprs=dict(HEAD_DIM=f.head_dim, PAGE_SIZE=page, DST_PAGE=dst_page, TOKENS=tokens, KV_FORMAT=kv_code,
                        STAGE_K=f.stage_k, HAS_WINDOW=f.window_left >= 0, KEY_ALIGN=KEY_ALIGN),
        options=dict(num_warps=NUM_WARPS),
    )


_PLANS: dict[StageFacts, fast_launch.Launch] = {}


def launch(staged: Staged, query, k, v, k_sf, v_sf, k_table, v_table, seq_lens, cum_seq_lens_q, *,
           window_left: int, interpreter: bool) -> tuple[fast_launch.Launch, fast_launch.CallArgs]:
    """The launch that stages the pages a call reads into ``staged`` (:func:`plan`), and the call's
    values for it: ``run(call)`` launches it, with the query's GPU current (the caller launches,
    so that the staging pass is as few calls from the public function as the attention it feeds)."""
    # Every host fact the launch reads, each in a local of its StageFacts field's name.
    table_shape, dst_shape, dst_stride = staged.table.shape, staged.v.shape, staged.v.stride()
    stage_k = staged.k is not None
    k_shape, k_stride, v_stride, kv_dtype = k.shape, k.stride(), v.stride(), k.dtype
    ksf_stride = k_sf.stride() if k_sf is not None else None
    vsf_stride = v_sf.stride() if v_sf is not None else None
    kt_stride, vt_stride, capacity, head_dim = k_table.stride(), v_table.stride(), staged.capacity, query.shape[-1]
    words_ok = words_allowed(query.device, interpreter, words_aligned(k, v, k_sf, v_sf))
    facts = StageFacts._make((table_shape, dst_shape, dst_stride, stage_k, k_shape, k_stride, v_stride, kv_dtype,
                              ksf_stride, vsf_stride, kt_stride, vt_stride, capacity, window_left, head_dim,
                              words_ok))
    run = cached_plan(_PLANS, facts, _stage_launch, False)
    return run, fast_launch.call_args(  # in _LAYOUT's order (absent scales: the pages stand in, never read)
        (k, v, k_sf if k_sf is not None else k, v_sf if v_sf is not None else v, k_table, v_table, seq_lens,
         cum_seq_lens_q, staged.k if stage_k else staged.v, staged.v, staged.table),
        (), (), query.get_device(),
    )


__all__ = ["Geometry", "Staged", "geometry", "launch", "pays", "plan", "staged_bytes", "stages", "usable_bytes",
           "views"]
