"""Launcher of the prefill kernels: pick the kernel and its config, size the grid, launch.

Everything here reads host-side facts only (shapes, strides, dtypes, the host bounds
``max_q_len`` / ``max_kv_len``): nothing waits for the device and nothing is allocated (but a copy
of a non-contiguous ``seq_lens``/``cum_seq_lens_q``/``sinks``), so a call can be captured in a CUDA
graph and replayed with new lengths, query offsets and tables written in place.

Host time. What a call derives from its host facts (a :class:`PrefillFacts`: config, format code,
TMA geometry) is a :class:`_Plan`, built by a function of those facts alone and cached under them;
per pair of host bounds the plan keeps its route (:meth:`_Plan.route`): the warp-specialised Gluon
kernel (:mod:`.plan_gluon_ws`), after a staging pass (:mod:`.staging`) where the pages are staged,
or the Triton kernel, each one :class:`~kvattn.runtime.fast_launch.Launch`. A call then reads its
data pointers and launches, every kernel argument named once in :func:`_context_launch` /
:func:`.plan_gluon_ws.launch`. A plan holds the config tables as they were when it was made:
code that edits them (tuning) clears ``_PLANS``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ...runtime import device as _device, env as _env, versions as _versions
from ..._formats_table import BY_DTYPE
from ...formats import FP8_DTYPE
from . import configs as prefill_configs
from ...runtime import fast_launch
from ...runtime.common import (
    Pages, arch, cdiv, device_guard, int32_lengths, kv_format_code, pages_of, words_aligned, words_allowed,
)
from ...runtime.plans import cached_plan
from .kernels import CONTEXT_TUPLES, context_kernel

try:  # Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the gathers only
    TensorDescriptor = None
try:  # Gluon (Triton >= 3.6): the warp-specialised Hopper kernel for 16-bit caches
    from . import plan_gluon_ws as gluon_ws
except ImportError:  # pragma: no cover - older Triton: the Triton kernel everywhere
    gluon_ws = None
from . import staging

_MAX_ROUTES = 4096  # routes a plan keeps (per pair of host bounds)


class PrefillFacts(NamedTuple):
    """Every host fact a prefill plan reads: the key of the plan cache. ``launch_context``
    computes each into a local of the field's name and builds the record from them, positionally."""

    device: torch.device
    interpreter: bool  # TRITON_INTERPRET
    q_shape: tuple  # [sum_q, Hq, D]
    q_stride: tuple
    q_dtype: torch.dtype
    k_shape: tuple  # [P, page, Hkv, Ds] NHD view of the K pages
    k_stride: tuple
    v_shape: tuple
    v_stride: tuple
    kv_dtype: torch.dtype
    v_dtype: torch.dtype
    k_aligned16: bool  # K's and V's bases 16-byte aligned (TMA)
    v_aligned16: bool
    kv_aligned4: bool  # the words formats' base pointers 4-byte aligned (words_aligned)
    q_copyable: bool  # the query's rows copy in 16-byte pieces (q_copies_whole)
    ksf_stride: tuple | None  # NVFP4 block scales
    vsf_stride: tuple | None
    kt_shape: tuple  # [B, pages_per_seq]
    kt_stride: tuple
    vt_stride: tuple
    same_table: bool  # K and V read one page table
    batch: int  # requests (seq_lens' length)
    has_sinks: bool
    has_logit: bool  # a logit scale tensor
    has_out_scale: bool  # an output scale tensor
    q_sign: int  # the logit factor's sign without a logit tensor (0 with one)
    out_stride: tuple
    out_dtype: torch.dtype
    sf_cols: int | None  # NVFP4 output: the block scales' columns; None otherwise
    sf_start: int
    lse_stride: tuple | None
    window_left: int
    skip: bool  # skip_factor > 0
    causal: bool
    gluon_on: bool  # KVATTN_GLUON (versions.gluon_on)
    ws_usable: int | None  # workspace bytes past the counters (staging.usable_bytes), None without one


def q_copies_whole(query: torch.Tensor) -> bool:
    """Whether the Gluon kernel's ``cp.async`` copies of query rows get 16-byte pieces: Triton
    sizes them from what it knows of the base and the token / head strides (a base 16-byte
    aligned, a stride a multiple of 16 elements), and a copy it can only prove 2-byte aligned (a
    16-bit query whose rows are padded by 8 elements) does not lower at all (``cp.async`` moves
    4, 8 or 16 bytes). Such a query takes the Triton kernel."""
    t, h = query.stride()[:2]
    return query.data_ptr() % 16 == 0 and t % 16 == 0 and h % 16 == 0


def config_of(q_dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int, skip: bool, device: torch.device,
              interpreter: bool):
    """``(config, QK_FP8, kind)`` of the Triton kernel for a call (gathered tiles; the plan may take
    TMA's instead): fp8 tensor-core Q.K^T (kind ``"fp8qk"``) when the query and the cache are both
    fp8 and the kernels are compiled (the interpreter has no fp8 products); otherwise the cache
    format's ``config_key``."""
    qk_fp8 = q_dtype == FP8_DTYPE and kv_dtype == FP8_DTYPE and not interpreter
    kind = "fp8qk" if qk_fp8 else BY_DTYPE[kv_dtype].config_key
    cfg = prefill_configs.config(arch(device, interpreter), kind, head_dim, skip)
    return cfg, qk_fp8, kind


def tma_views(k, v, block_n: int):
    """``(k_desc, v_desc, head_rows, head_cols)`` of TMA reads of 16-bit or fp8 K/V pages by the
    Triton kernel (each a :class:`~kvattn.runtime.fast_launch.Descriptor` the launch builds on the
    call's K or V), or None.

    ``k``, ``v``: the ``Pages`` (or tensors) of ``[P, page, Hkv, D]`` NHD views of any layout.
    A tile of ``block_n`` tokens of one head inside one page is a box of a ``[P, rows, cols]`` view:
    HND pages (each head's slots contiguous rows of D) as ``[P, Hkv * page, D]`` (``head_rows`` =
    page), NHD pages (heads side by side in a row) as ``[P, page, Hkv * D]`` (``head_cols`` = D).
    Both caches need the same form, 16-byte aligned bases and strides (TMA's rules), and pages
    holding whole tiles.
    """
    if TensorDescriptor is None:
        return None
    k, v = pages_of(k), pages_of(v)
    pages, page, heads, dim = k.shape
    if page % block_n:
        return None
    form = None
    for t in (k, v):
        sp, ss, sh, sd = t.stride
        esize = t.dtype.itemsize
        if sd != 1 or not t.aligned16 or (sp * esize) % 16:
            return None
        this = "HND" if (ss == dim and sh == page * dim) else ("NHD" if (sh == dim and ss == heads * dim) else None)
        if this is None or (form is not None and this != form):
            return None
        form = this
    if form == "HND":
        shape, head_rows, head_cols = (pages, heads * page, dim), page, 0
    else:
        shape, head_rows, head_cols = (pages, page, heads * dim), 0, dim
    if (shape[2] * k.dtype.itemsize) % 16:
        return None
    descs = tuple(fast_launch.Descriptor(name, shape, (t.stride[0], shape[2], 1), (1, block_n, dim))
                  for name, t in (("k", k), ("v", v)))
    return (*descs, head_rows, head_cols)


class _Route(NamedTuple):
    """A call's launches for its host bounds: the attention launch, the staging (its
    :class:`.staging.Geometry`, or None) and whether the launch is the Gluon kernel's
    (:data:`.plan_gluon_ws.LAYOUT`'s tensors) rather than the Triton kernel's (:data:`LAYOUT`'s)."""

    launch: fast_launch.Launch
    staging: staging.Geometry | None
    gluon: bool


class _Plan:
    """Everything a call derives from its host facts (:class:`PrefillFacts`); the routes per pair of
    host bounds (:meth:`route`)."""

    def __init__(self, facts: PrefillFacts):
        f = self.facts = facts
        self.head_dim = f.q_shape[2]
        self.k_pages = Pages(f.k_shape, f.k_stride, f.kv_dtype, f.k_aligned16)
        self.v_pages = Pages(f.v_shape, f.v_stride, f.v_dtype, f.v_aligned16)
        self.capacity = f.kt_shape[1] * f.k_shape[1]  # the table's, in tokens
        # 16-bit and fp8 pages TMA can address, on Hopper: the warp-specialised Gluon kernel (KVATTN_GLUON=0:
        # off); it stores no LSE, so a call that asks for one (return_lse) keeps the Triton kernel.
        self.gluon_ok = gluon_ws is not None and f.lse_stride is None and f.q_copyable
        cfg, self.qk_fp8, kind = config_of(f.q_dtype, f.kv_dtype, self.head_dim, f.skip, f.device, f.interpreter)
        ksf = tuple(f.ksf_stride[:3]) if f.ksf_stride is not None else (0, 0, 0)
        vsf = tuple(f.vsf_stride[:3]) if f.vsf_stride is not None else (0, 0, 0)
        self.sf_strides = ksf, vsf
        # fp8 / NVFP4 caches read as 32-bit words where every word is aligned, as decode reads them; not with
        # fp8 scores (QK_FP8), whose K tile goes to the tensor cores as the copied bytes (on words, Triton 3.6
        # compiles that product as float16: sm_90a SASS, lab/notes/formats.md "Formats: fp8 and NVFP4 caches in prefill").
        words_ok = not self.qk_fp8 and words_allowed(f.device, f.interpreter, f.kv_aligned4)
        self.kv_code = kv_format_code(BY_DTYPE[f.kv_dtype].name, words_ok, (*f.k_stride[:3], *f.v_stride[:3]),
                                      self.head_dim, (*ksf, *vsf))
        # K/V tiles by TMA where the table has a tile for the kind (16-bit caches, fp8 with fp8
        # scores) and the pages allow it: no per-token address math, no registers for it, so one
        # warpgroup a program and two programs an SM (lab/notes/prefill.md "Prefill: K/V tiles by TMA").
        self.tma = None
        if not f.interpreter and _device.has_tma(f.device):
            tma_cfg = prefill_configs.config(arch(f.device, f.interpreter), kind, self.head_dim, f.skip, tma=True)
            self.tma = tma_views(self.k_pages, self.v_pages, tma_cfg.block_n) if tma_cfg is not None else None
            if self.tma is not None:
                cfg = tma_cfg
        self.cfg = cfg
        self._routes: dict[tuple, _Route] = {}
        self._launches: dict[tuple, fast_launch.Launch] = {}  # routes' launches, by what sets them apart

    def route(self, max_q_len: int, max_kv_len: int) -> _Route:
        """The route of a call with these host bounds (memoised)."""
        key = (max_q_len, max_kv_len)
        hit = self._routes.get(key)
        if hit is None:
            if len(self._routes) >= _MAX_ROUTES:
                self._routes.clear()
                self._launches.clear()
            hit = self._routes[key] = self._gluon_route(max_q_len, max_kv_len) or _Route(
                self._launch(("context", cdiv(max_q_len, self.cfg.block_m)), _context_launch, self, max_q_len),
                None, False)
        return hit

    def _launch(self, key: tuple, build, *args) -> fast_launch.Launch:
        launch = self._launches.get(key)
        if launch is None:
            launch = self._launches[key] = build(*args)
        return launch

    def _gluon_route(self, max_q_len: int, max_kv_len: int) -> _Route | None:
        """The warp-specialised Gluon kernel's route, or None where it does not take the launch.

        A cache whose pages :mod:`.staging` copies (quantised caches, 16-bit pages under 64 tokens),
        where the copies fit the workspace and pay, is staged there first and the kernel reads the
        copies; otherwise the kernel reads the cache as it is (an fp8 one through its converter
        partition), or, where it cannot (NVFP4), the Triton kernel takes the launch (lab/notes/prefill.md
        "Prefill: pages dequantised once a call")."""
        if not self.gluon_ok:
            return None
        f = self.facts
        geometry = None if f.interpreter else staging.geometry(
            f.q_dtype, f.q_shape[1], self.head_dim, f.k_shape, f.k_stride, f.kv_dtype, f.kt_shape, f.ws_usable,
            max_q_len, max_kv_len)
        if geometry is not None:
            staged = Pages(geometry.page_shape(), geometry.page_stride(), geometry.dtype, True)  # (STAGE_ALIGN)
            table = (geometry.dst_pages, 1)
            k, kt = (staged, table) if geometry.both else (self.k_pages, f.kt_stride)
            got = self._gluon_plan(k, staged)
            if got is not None:
                spec = ("gluon", got, k, staged, kt, table, max_q_len, geometry.capacity)
                return _Route(self._launch(spec, self._gluon_launch, *spec[1:]), geometry, True)
        got = self._gluon_plan(self.k_pages, self.v_pages)
        if got is None:
            return None
        spec = ("gluon", got, self.k_pages, self.v_pages, f.kt_stride, f.vt_stride, max_q_len, self.capacity)
        return _Route(self._launch(spec, self._gluon_launch, *spec[1:]), None, True)

    def _gluon_plan(self, k: Pages, v: Pages):
        f = self.facts
        return gluon_ws.plan(device=f.device, gluon_on=f.gluon_on, q_dtype=f.q_dtype, head_dim=self.head_dim, k=k,
                             v=v, out_dtype=f.out_dtype, skip=f.skip, nvfp4_out=f.sf_cols is not None,
                             interpreter=f.interpreter)

    def _gluon_launch(self, got, k: Pages, v: Pages, kt_stride, vt_stride, max_q_len: int, capacity: int):
        cfg, k_view, v_view = got
        return gluon_ws.launch(cfg, self.facts, k, v, k_view, v_view, kt_stride=kt_stride, vt_stride=vt_stride,
                               max_q_len=max_q_len, sm_count=_device.sm_count(self.facts.device), capacity=capacity)


def _context_launch(plan: _Plan, max_q_len: int) -> fast_launch.Launch:
    """The Triton kernel's launch (:func:`~.kernels.context_kernel`), every argument by its
    parameter's name (the kernel's tuples by their members'); with TMA geometry, the launch builds
    K's and V's descriptors on each call's pages (a call replayed from its metadata,
    kvattn.runtime.callcache, rebuilds them on the new pointers: lab/notes/host-path.md "Host path:
    calls replayed from their metadata")."""
    f, cfg = plan.facts, plan.cfg
    sum_q, num_heads, head_dim = f.q_shape
    ks, vs = f.k_stride, f.v_stride
    ksf_s, vsf_s = plan.sf_strides
    descriptors, (head_rows, head_cols) = (plan.tma[:2], plan.tma[2:]) if plan.tma is not None else ((), (0, 0))
    return fast_launch.Launch(
        context_kernel, (num_heads, f.batch, cdiv(max_q_len, cfg.block_m)), layout=LAYOUT,
        per_call=_CONTEXT_PER_CALL,
        fixed=dict(
            stride_q_t=f.q_stride[0], stride_q_h=f.q_stride[1], stride_o_t=f.out_stride[0],
            stride_o_h=f.out_stride[1], stride_lse_t=f.lse_stride[0] if f.lse_stride is not None else 0,
            stride_k_p=ks[0], stride_k_s=ks[1], stride_k_h=ks[2], stride_v_p=vs[0], stride_v_s=vs[1],
            stride_v_h=vs[2], stride_ksf_p=ksf_s[0], stride_ksf_s=ksf_s[1], stride_ksf_h=ksf_s[2],
            stride_vsf_p=vsf_s[0], stride_vsf_s=vsf_s[1], stride_vsf_h=vsf_s[2],
            stride_kt_b=f.kt_stride[0], stride_kt_p=f.kt_stride[1],
            stride_vt_b=f.vt_stride[0], stride_vt_p=f.vt_stride[1],
            num_rows=sum_q, num_pages=f.k_shape[0], capacity=plan.capacity,
            window_left=f.window_left, sf_cols=f.sf_cols if f.sf_cols is not None else 4, sf_row0=f.sf_start,
            head_rows=head_rows, head_cols=head_cols,
        ),
        constexprs=dict(
            HEAD_DIM=head_dim, PAGE_SIZE=f.k_shape[1], GROUP=num_heads // f.k_shape[2],
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, KV_FORMAT=plan.kv_code,
            QK_FP8=plan.qk_fp8, SAME_TABLE=f.same_table, HAS_WINDOW=f.window_left >= 0, HAS_SINKS=f.has_sinks,
            SKIP=f.skip, LOGIT_PTR=f.has_logit, OUT_PTR=f.has_out_scale,
            OUT_FP8=f.out_dtype == FP8_DTYPE, OUT_NVFP4=f.sf_cols is not None, TMA=plan.tma is not None,
            Q_SIGN=f.q_sign, STORE_LSE=f.lse_stride is not None, CAUSAL=f.causal,
        ),
        options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        descriptors=descriptors,
        tuples=CONTEXT_TUPLES,
    )


_PLANS: dict[PrefillFacts, _Plan] = {}


def _plan(facts: PrefillFacts) -> _Plan:
    return cached_plan(_PLANS, facts, _Plan, False)


def launch_context(
    query: torch.Tensor,  # [sum_q, Hq, D]
    k: torch.Tensor,  # [P, page, Hkv, Ds] (NHD view of any layout)
    v: torch.Tensor,
    k_table: torch.Tensor,  # [B, pages_per_seq] int32
    v_table: torch.Tensor,
    k_sf,  # NVFP4 block scales [P, page, Hkv, D/16] or None
    v_sf,
    seq_lens: torch.Tensor,  # [B] int32 / uint32
    cum_seq_lens_q: torch.Tensor,  # [B + 1] int32 / int64
    sinks,  # [Hq] float32 or None
    out: torch.Tensor,  # [sum_q, Hq, D] fp16/bf16/fp8, or NVFP4 codes uint8 [sum_q, Hq, D/2]
    out_sf,  # NVFP4 output: [rows, cols] e4m3 (or uint8) swizzled block scales; else None
    *,
    max_q_len: int,
    logit_factor: float = 1.0,
    logit_tensor=None,
    out_factor: float = 1.0,
    out_tensor=None,
    window_left: int = -1,
    o_sf_scale: float = 1.0,
    sf_start: int = 0,
    skip_factor: float = 0.0,
    lse=None,  # [sum_q, Hq] float32 base-2 LSE (head stride 1), or None
    workspace=None,  # uint8 scratch (pages of a quantised cache staged in it, see staging), or None
    max_kv_len: int | None = None,  # host bound of seq_lens (None: the table's capacity)
    causal: bool = True,  # False: each row sees all its request's keys (no window then)
) -> None:
    """Launch paged context attention (causal, or bidirectional with ``causal=False``) into ``out``,
    with the query's GPU current."""
    batch = seq_lens.shape[0]
    q_shape = query.shape
    if batch == 0 or max_q_len == 0 or q_shape[0] == 0 or q_shape[1] == 0:
        return
    interpreter = _env.triton_interpret()
    device_index = query.get_device()  # -1 on the CPU
    with device_guard(device_index):
        seq_lens = int32_lengths(seq_lens)
        if not cum_seq_lens_q.is_contiguous():
            cum_seq_lens_q = cum_seq_lens_q.contiguous()
        if sinks is not None and sinks.stride(-1) != 1:
            sinks = sinks.contiguous()
        # Every host fact the plan reads, each in a local of its PrefillFacts field's name.
        device = query.device
        q_stride, q_dtype = query.stride(), query.dtype
        k_shape, k_stride, v_shape, v_stride = k.shape, k.stride(), v.shape, v.stride()
        kv_dtype, v_dtype = k.dtype, v.dtype
        k_aligned16, v_aligned16 = k.data_ptr() % 16 == 0, v.data_ptr() % 16 == 0
        kv_aligned4 = words_aligned(k, v, k_sf, v_sf)
        q_copyable = q_copies_whole(query)
        ksf_stride = k_sf.stride() if k_sf is not None else None
        vsf_stride = v_sf.stride() if v_sf is not None else None
        kt_shape, kt_stride, vt_stride = k_table.shape, k_table.stride(), v_table.stride()
        same_table = k_table is v_table or (
            k_table.data_ptr() == v_table.data_ptr() and kt_stride == vt_stride
        )
        has_sinks, has_logit, has_out_scale = sinks is not None, logit_tensor is not None, out_tensor is not None
        q_sign = 0 if has_logit else (1 if logit_factor >= 0 else -1)
        out_stride, out_dtype = out.stride(), out.dtype
        sf_cols = out_sf.shape[1] if out_sf is not None else None
        lse_stride = lse.stride() if lse is not None else None
        skip = skip_factor > 0
        gluon_on = _versions.gluon_on()
        ws_usable = staging.usable_bytes(workspace)
        facts = PrefillFacts._make((
            device, interpreter, q_shape, q_stride, q_dtype, k_shape, k_stride, v_shape, v_stride, kv_dtype, v_dtype,
            k_aligned16, v_aligned16, kv_aligned4, q_copyable, ksf_stride, vsf_stride, kt_shape, kt_stride, vt_stride, same_table,
            batch, has_sinks, has_logit, has_out_scale, q_sign, out_stride, out_dtype, sf_cols, sf_start, lse_stride,
            window_left, skip, causal, gluon_on, ws_usable,
        ))
        plan = _plan(facts)
        route = plan.route(max_q_len, plan.capacity if max_kv_len is None else max_kv_len)
        sinks_arg = sinks if has_sinks else query
        logit_arg = logit_tensor if has_logit else query
        out_scale_arg = out_tensor if has_out_scale else query
        if route.gluon:
            if route.staging is not None:
                staged = staging.views(workspace, route.staging)
                stage, stage_call = staging.launch(staged, query, k, v, k_sf, v_sf, k_table, v_table, seq_lens,
                                                   cum_seq_lens_q, window_left=window_left, interpreter=interpreter)
                stage(stage_call)
                if staged.k is not None:
                    k, k_table = staged.k, staged.table
                v, v_table = staged.v, staged.table
            route.launch(fast_launch.call_args(  # gluon_ws.LAYOUT's tensors (absent ones: the query, unread)
                (query, out, k, v, k_table, v_table, seq_lens, cum_seq_lens_q, sinks_arg, logit_arg, out_scale_arg),
                (), (float(logit_factor), float(out_factor)), device_index,
            ))
            return
        # every tensor of LAYOUT (absent ones: the query, K/V or the output stand in, unread)
        route.launch(fast_launch.call_args(
            (query, k, v, k_sf if k_sf is not None else k, v_sf if v_sf is not None else v, k_table, v_table,
             seq_lens, cum_seq_lens_q, sinks_arg, logit_arg, out_scale_arg, out,
             out_sf.view(torch.uint8).view(-1) if sf_cols is not None else out, lse if lse is not None else out),
            (), (float(logit_factor), float(out_factor), 1.0 / float(o_sf_scale), float(skip_factor)), device_index,
        ))


# The per-call values of a launch by name (fast_launch.CallLayout): the tensors of launch_context in
# this order, then the scalars that change with the call's values rather than its shapes.
LAYOUT = fast_launch.CallLayout(
    ("query", "k", "v", "k_sf", "v_sf", "k_table", "v_table", "seq_lens", "cum_q", "sinks", "logit", "out_scale",
     "out", "out_sf", "lse"),
    (), ("logit_factor", "out_factor", "sf_div", "skip_factor"),
)
_CONTEXT_PER_CALL = dict(
    q_ptr="query", k_ptr="k", v_ptr="v", k_sf_ptr="k_sf", v_sf_ptr="v_sf", k_table_ptr="k_table",
    v_table_ptr="v_table", seq_lens_ptr="seq_lens", cum_q_ptr="cum_q", sinks_ptr="sinks", logit_scale_ptr="logit",
    out_scale_ptr="out_scale", out_ptr="out", out_sf_ptr="out_sf", lse_ptr="lse", logit_factor="logit_factor",
    out_factor="out_factor", sf_div="sf_div", skip_factor="skip_factor",
)
