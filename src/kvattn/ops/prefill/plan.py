"""Launcher of the prefill kernel: pick the config, size the grid, launch.

Everything here reads host-side facts only (shapes, strides, dtypes, the host bound
``max_q_len``): nothing waits for the device and nothing is allocated (but a copy of a
non-contiguous ``seq_lens``/``cum_seq_lens_q``/``sinks``), so a call can be captured in a CUDA graph
and replayed with new lengths, query offsets and tables written in place.
"""

from __future__ import annotations

import torch

from ...runtime import device as _device, env as _env
from ..._formats_table import BY_DTYPE
from ...formats import FP8_DTYPE
from . import configs as prefill_configs
from ...runtime import fast_launch
from ...runtime.common import arch, cdiv, device_guard, int32_lengths, kv_format_code, words_aligned, words_allowed
from .kernels import context_kernel

try:  # Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the gathers only
    TensorDescriptor = None
try:  # Gluon (Triton >= 3.6): the warp-specialised Hopper kernel for 16-bit caches
    from . import plan_gluon_ws as gluon_ws
except ImportError:  # pragma: no cover - older Triton: the Triton kernel everywhere
    gluon_ws = None
from . import staging


def plan(query: torch.Tensor, kv_dtype: torch.dtype, skip: bool, interpreter: bool):
    """``(config, QK_FP8, kind)`` for a call (gathered tiles; the launcher may take TMA's instead):
    fp8 tensor-core Q.K^T (kind ``"fp8qk"``) when the query and the cache are both fp8 and the
    kernels are compiled (the interpreter has no fp8 products); otherwise the cache format's
    ``config_key``."""
    qk_fp8 = query.dtype == FP8_DTYPE and kv_dtype == FP8_DTYPE and not interpreter
    kind = "fp8qk" if qk_fp8 else BY_DTYPE[kv_dtype].config_key
    cfg = prefill_configs.config(arch(query.device, interpreter), kind, query.shape[-1], skip)
    return cfg, qk_fp8, kind


def tma_views(k: torch.Tensor, v: torch.Tensor, block_n: int):
    """``(k_desc, v_desc, head_rows, head_cols)`` for TMA reads of 16-bit or fp8 K/V pages, or None.

    ``k``, ``v``: ``[P, page, Hkv, D]`` NHD views of any layout. A tile of ``block_n`` tokens of one
    head inside one page is a box of a ``[P, rows, cols]`` view: HND pages (each head's slots
    contiguous rows of D) as ``[P, Hkv * page, D]`` (``head_rows`` = page), NHD pages (heads side
    by side in a row) as ``[P, page, Hkv * D]`` (``head_cols`` = D). Both caches need the same
    form, 16-byte aligned bases and strides (TMA's rules), and pages holding whole tiles.
    """
    if TensorDescriptor is None:
        return None
    pages, page, heads, dim = k.shape
    if page % block_n:
        return None
    form = None
    for t in (k, v):
        sp, ss, sh, sd = t.stride()
        esize = t.element_size()
        if sd != 1 or t.data_ptr() % 16 or (sp * esize) % 16:
            return None
        this = "HND" if (ss == dim and sh == page * dim) else ("NHD" if (sh == dim and ss == heads * dim) else None)
        if this is None or (form is not None and this != form):
            return None
        form = this
    if form == "HND":
        shape, head_rows, head_cols = [pages, heads * page, dim], page, 0
    else:
        shape, head_rows, head_cols = [pages, page, heads * dim], 0, dim
    if (shape[2] * k.element_size()) % 16:
        return None
    descs = tuple(TensorDescriptor(t, shape, [t.stride(0), shape[2], 1], [1, block_n, dim]) for t in (k, v))
    return (*descs, head_rows, head_cols)


def _gluon_plan(query, k, v, k_table, v_table, out, workspace, max_q_len: int, max_kv_len: int, skip: bool,
                nvfp4_out: bool, interpreter: bool):
    """``(config, k_view, v_view, staged, k, v, k_table, v_table)`` of a launch the warp-specialised
    Gluon kernel takes (the caches and tables it reads), or None.

    A cache whose pages :mod:`.staging` copies (quantised caches, 16-bit pages under 64 tokens),
    where the copies fit the workspace and pay, is staged there first and the kernel reads the
    copies; otherwise the kernel reads the cache as it is (an fp8 one through its converter
    partition), or, where it cannot (NVFP4), the Triton kernel takes the launch (lab/notes/prefill.md
    "Prefill: pages dequantised once a call")."""
    staged = staging.plan(query, k, k_table, workspace, max_q_len, max_kv_len) if not interpreter else None
    if staged is not None:
        sk, skt = (staged.k, staged.table) if staged.k is not None else (k, k_table)
        got = gluon_ws.plan(query, sk, staged.v, out, skip=skip, nvfp4_out=nvfp4_out, interpreter=interpreter)
        if got is not None:
            return (*got, staged, sk, staged.v, skt, staged.table)
    got = gluon_ws.plan(query, k, v, out, skip=skip, nvfp4_out=nvfp4_out, interpreter=interpreter)
    return None if got is None else (*got, None, k, v, k_table, v_table)


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
    sum_q, num_heads, head_dim = query.shape
    num_kv_heads = k.shape[2]
    if batch == 0 or max_q_len == 0 or sum_q == 0 or num_heads == 0:
        return
    interpreter = _env.triton_interpret()
    skip = skip_factor > 0
    cfg, qk_fp8, kind = plan(query, k.dtype, skip, interpreter)
    device = query.get_device()  # -1 on the CPU
    with device_guard(device):
        seq_lens = int32_lengths(seq_lens)
        if not cum_seq_lens_q.is_contiguous():
            cum_seq_lens_q = cum_seq_lens_q.contiguous()
        if sinks is not None and sinks.stride(-1) != 1:
            sinks = sinks.contiguous()
        same_table = k_table is v_table or (
            k_table.data_ptr() == v_table.data_ptr() and k_table.stride() == v_table.stride()
        )
        nvfp4_out = out_sf is not None
        # 16-bit and fp8 pages TMA can address, on Hopper: the warp-specialised Gluon kernel (KVATTN_GLUON=0: off);
        # it stores no LSE, so a call that asks for one (return_lse) keeps the Triton kernel.
        if gluon_ws is not None and lse is None:
            capacity = k_table.shape[1] * k.shape[1]
            ws = _gluon_plan(query, k, v, k_table, v_table, out, workspace, max_q_len,
                             capacity if max_kv_len is None else max_kv_len, skip, nvfp4_out, interpreter)
            if ws is not None:
                ws_cfg, k_view, v_view, staged, ws_k, ws_v, ws_kt, ws_vt = ws
                if staged is not None:
                    staging.launch(staged, query, k, v, k_sf, v_sf, k_table, v_table, seq_lens, cum_seq_lens_q,
                                   window_left=window_left, interpreter=interpreter)
                    capacity = staged.capacity
                gluon_ws.launch(
                    ws_cfg, query, ws_k, ws_v, k_view, v_view, ws_kt, ws_vt, seq_lens, cum_seq_lens_q, sinks, out,
                    max_q_len=max_q_len, sm_count=_device.sm_count(query.device), logit_factor=logit_factor,
                    logit_tensor=logit_tensor, out_factor=out_factor, out_tensor=out_tensor, window_left=window_left,
                    capacity=capacity, causal=causal)
                return
        sf_flat = out_sf.view(torch.uint8).view(-1) if nvfp4_out else out
        sf_cols = out_sf.shape[1] if nvfp4_out else 4
        ksf_s = tuple(k_sf.stride()[:3]) if k_sf is not None else (0, 0, 0)
        vsf_s = tuple(v_sf.stride()[:3]) if v_sf is not None else (0, 0, 0)
        # fp8 / NVFP4 caches read as 32-bit words where every word is aligned, as decode reads them; not with
        # fp8 scores (QK_FP8), whose K tile goes to the tensor cores as the copied bytes (on words, Triton 3.6
        # compiles that product as float16: sm_90a SASS, lab/notes/formats.md "Formats: fp8 and NVFP4 caches in prefill").
        kv_format = BY_DTYPE[k.dtype].name
        words_ok = not qk_fp8 and words_allowed(query.device, interpreter, words_aligned(k, v, k_sf, v_sf))
        kv_code = kv_format_code(kv_format, words_ok, (*k.stride()[:3], *v.stride()[:3]), head_dim, (*ksf_s, *vsf_s))
        # K/V tiles by TMA where the table has a tile for the kind (16-bit caches, fp8 with fp8
        # scores) and the pages allow it: no per-token address math, no registers for it, so one
        # warpgroup a program and two programs an SM (lab/notes/prefill.md "Prefill: K/V tiles by TMA").
        head_rows, head_cols = 0, 0
        tma = None
        if not interpreter and _device.has_tma(query.device):
            tma_cfg = prefill_configs.config(arch(query.device, interpreter), kind, head_dim, skip, tma=True)
            tma = tma_views(k, v, tma_cfg.block_n) if tma_cfg is not None else None
            if tma is not None:
                cfg = tma_cfg
                head_rows, head_cols = tma[2], tma[3]
        grid = (num_heads, batch, cdiv(max_q_len, cfg.block_m))
        ks, vs = k.stride(), v.stride()
        # Through a fast_launch.Launch (the compiled kernel's launcher; a call replayed from its
        # metadata, kvattn.runtime.callcache, launches it again with new pointers and the TMA descriptors
        # rebuilt on them: lab/notes/host-path.md "Host path: calls replayed from their metadata").
        launch = fast_launch.launch_of(
            context_kernel, grid, layout=LAYOUT,
            per_call=_CONTEXT_PER_CALL,
            fixed=dict(
                stride_q_t=query.stride(0), stride_q_h=query.stride(1), stride_o_t=out.stride(0),
                stride_o_h=out.stride(1), stride_lse_t=lse.stride(0) if lse is not None else 0,
                stride_k_p=ks[0], stride_k_s=ks[1], stride_k_h=ks[2], stride_v_p=vs[0], stride_v_s=vs[1],
                stride_v_h=vs[2], stride_ksf_p=ksf_s[0], stride_ksf_s=ksf_s[1], stride_ksf_h=ksf_s[2],
                stride_vsf_p=vsf_s[0], stride_vsf_s=vsf_s[1], stride_vsf_h=vsf_s[2],
                stride_kt_b=k_table.stride(0), stride_kt_p=k_table.stride(1),
                stride_vt_b=v_table.stride(0), stride_vt_p=v_table.stride(1),
                num_rows=sum_q, num_pages=k.shape[0], capacity=k_table.shape[1] * k.shape[1],
                window_left=window_left, sf_cols=sf_cols, sf_row0=sf_start, head_rows=head_rows,
                head_cols=head_cols,
            ),
            constexprs=dict(
                HEAD_DIM=head_dim, PAGE_SIZE=k.shape[1], GROUP=num_heads // num_kv_heads,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, KV_FORMAT=kv_code,
                QK_FP8=qk_fp8, SAME_TABLE=same_table, HAS_WINDOW=window_left >= 0, HAS_SINKS=sinks is not None,
                SKIP=skip, LOGIT_PTR=logit_tensor is not None, OUT_PTR=out_tensor is not None,
                OUT_FP8=out.dtype == FP8_DTYPE, OUT_NVFP4=nvfp4_out, TMA=tma is not None,
                Q_SIGN=0 if logit_tensor is not None else (1 if logit_factor >= 0 else -1),
                STORE_LSE=lse is not None, CAUSAL=causal,
            ),
            options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        )
        # every tensor of LAYOUT (absent ones: the query, K/V or the output stand in, unread)
        call = fast_launch.call_args(
            (query, k, v, k_sf if k_sf is not None else k, v_sf if v_sf is not None else v, k_table, v_table,
             seq_lens, cum_seq_lens_q, sinks if sinks is not None else query,
             logit_tensor if logit_tensor is not None else query, out_tensor if out_tensor is not None else query,
             out, sf_flat, lse if lse is not None else out),
            (), (float(logit_factor), float(out_factor), 1.0 / float(o_sf_scale), float(skip_factor)), device,
        )
        if tma is not None:
            call = fast_launch.with_descriptors(call, {1: tma[0], 2: tma[1]})
        launch(call)


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
