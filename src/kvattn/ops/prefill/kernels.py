"""Paged causal context attention (prefill): one program per (query head, request, query tile).

A program holds ``BLOCK_M`` consecutive query rows of one request and one query head (rows at
positions ``p = L - Lq + i``) and streams the request's keys in ``BLOCK_N`` tiles aligned at key 0,
FlashAttention-2 style: ``S = Q K^T`` and ``P V`` on tensor cores (wgmma on Hopper), the softmax
state in registers. K/V tiles come one of two ways, both software-pipelined by Triton
(``num_stages``):

* ``TMA`` (16-bit caches, and fp8 caches under fp8 scores, whose pages hold whole tiles, Hopper):
  a tensor descriptor over the pages (see :func:`_tma_tile`), one page's slice a tile; no
  per-token addresses, so a 128-row program fits one warpgroup and two programs share an SM
  (``lab/notes/prefill.md`` "Prefill: K/V tiles by TMA"); an fp8 K tile feeds the fp8 score product as it lands,
  the V tile converts once to float16;
* gathered otherwise (one table entry a page: a scalar page id when a tile lies inside one page,
  one per page selected per token when it holds up to 4 whole pages, per-token ids otherwise),
  as pointer loads (cp.async); fp8 / NVFP4 caches read as 32-bit words where aligned.

Full tiles keep the logits unscaled and fold scale and max shift into one FMA before ``exp2``; the
logit scale's sign goes into q once per program, only where it may be negative (``Q_SIGN``: an
elementwise op on q would move it from shared memory into registers for the whole loop).

The keys a tile can see are cut into three runs, visited in increasing key order:

* ``[start, full_lo)``: tiles the window's left edge cuts (masked),
* ``[full_lo, full_hi)``: tiles every row sees whole (no mask arithmetic at all),
* ``[full_hi, hi)``: the causal diagonal (masked).

Why one query head per program (no GQA row packing): a 128-row tile of one head already gives
wgmma its full M, and the K/V tile is shared by the group's programs through L2 (the launch
orders heads fastest, so a group's programs run side by side). The grid runs the query tiles
from the last (the most keys) to the first, heads fastest: the long programs start in the first
waves and the short ones fill the tail.

Skip-softmax (``SKIP``): the launcher sets ``BLOCK_M = BLOCK_N = 128``, so a program's query tile
and key tiles are exactly those of ``kvattn.reference.prefill`` (SKIP_SOFTMAX_TILE_M/N); after
``S`` of a tile other than the first, the tile is dropped (no exp, no V load, no P.V, running max
unchanged) when every row of the tile has ``exp(tile_max - running_max) < f / L``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import (
    causal_key_ranges,
    full_tile_softmax,
    KV_HALF,
    LOG2E,
    as_mask,
    float16_operand,
    kv_token_offsets,
    load_kv_tile,
    load_page_ids,
    online_softmax_step,
    quantize_nvfp4_rows,
    sink_logits2,
    softmax_finalize,
    store_scaled,
    token_pages,
)


@triton.jit
def _tile_pages(table_row_ptr, stride_table_p, n0, offs_n, hi, num_pages, MASKED: tl.constexpr,
                PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(page, slot, ok)`` of the tile's tokens ``offs_n = n0 + [0, BLOCK_N)``: int64 page (a scalar
    when the tile lies inside one page), int64 slot, bool ``ok`` (token below ``hi`` with a page id
    inside ``[0, num_pages)``; the others load as zeros).

    The table is read once per page, not once per token: a scalar entry when a tile lies inside one
    page (``PAGE_SIZE % BLOCK_N == 0``; tiles start at multiples of BLOCK_N), one scalar per page
    selected per token when a tile holds a few whole pages. Entries of pages at or past ``hi`` are
    never read. Not MASKED: every token of the tile is below ``hi`` (the caller's full tiles).
    """
    if PAGE_SIZE % BLOCK_N == 0:
        pid = tl.load(table_row_ptr + (n0 // PAGE_SIZE) * stride_table_p)
        ok = as_mask(tl.broadcast_to((pid >= 0) & (pid < num_pages), offs_n.shape))
        if MASKED:
            ok = ok & (offs_n < hi)
        page = tl.maximum(pid, 0).to(tl.int64)
        slot = (n0 % PAGE_SIZE + offs_n - n0).to(tl.int64)
        return page, slot, ok
    else:
        if BLOCK_N % PAGE_SIZE == 0 and BLOCK_N // PAGE_SIZE <= 4:
            which = (offs_n - n0) // PAGE_SIZE
            ids = tl.zeros(offs_n.shape, dtype=tl.int32)
            for r in tl.static_range(BLOCK_N // PAGE_SIZE):
                pid = tl.load(table_row_ptr + (n0 // PAGE_SIZE + r) * stride_table_p, mask=n0 + r * PAGE_SIZE < hi,
                              other=-1)
                ids = tl.where(which == r, pid, ids)
            ok = (ids >= 0) & (ids < num_pages)
            if MASKED:
                ok = ok & (offs_n < hi)
            ids = tl.where(ok, ids, -1)
        else:
            ids = load_page_ids(table_row_ptr, stride_table_p, offs_n, offs_n < hi, num_pages, PAGE_SIZE, True)
        return token_pages(ids, offs_n, True, PAGE_SIZE, True)


@triton.jit
def _tma_page(table_row_ptr, stride_table_p, n0, offs_n, hi, PAGE_SIZE: tl.constexpr):
    """``(page, slot, ok)`` of a tile read by TMA (it lies inside one page): the raw int32 page id
    (an id outside the cache is a coordinate outside the descriptor, which TMA reads as zeros,
    as the gathers read an invalid page), the scalar slot of its first token, and ``offs_n < hi``."""
    page = tl.load(table_row_ptr + (n0 // PAGE_SIZE) * stride_table_p)
    return page, n0 % PAGE_SIZE, offs_n < hi


@triton.jit
def _tma_tile(desc, page, slot, kvh, head_rows, head_cols, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """``[BLOCK_N, HEAD_DIM]`` tile of one page by TMA. ``desc`` views the cache as ``[pages, rows,
    cols]`` with a ``[1, BLOCK_N, HEAD_DIM]`` box: HND rows = head x slot (``head_rows`` = page
    size, ``head_cols`` = 0), NHD rows = slots and columns = head x D (``head_rows`` = 0,
    ``head_cols`` = D)."""
    t = desc.load([page, kvh * head_rows + slot, kvh * head_cols])
    return tl.reshape(t, (BLOCK_N, HEAD_DIM))


@triton.jit
def _tile_scores(
    q, k_ptr, k_sf_ptr, kt_row, stride_kt_p, stride_k_p, stride_k_s, stride_k_h,
    stride_ksf_p, stride_ksf_s, stride_ksf_h, kvh, num_pages, n0, hi, head_rows, head_cols,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
    MASKED: tl.constexpr, QK_FP8: tl.constexpr, CDT: tl.constexpr, TMA: tl.constexpr,
):
    """Unscaled logits ``q K^T`` of the key tile at ``n0`` (float32 ``[BLOCK_M, BLOCK_N]``) and the
    tile's ``(page, slot, ok)``. TMA: ``k_ptr`` is a tensor descriptor of a 16-bit cache, or of an
    fp8 cache under fp8 scores (the tile feeds the product as it lands)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if TMA:
        k_page, k_slot, k_ok = _tma_page(kt_row, stride_kt_p, n0, offs_n, hi, PAGE_SIZE)
        k = _tma_tile(k_ptr, k_page, k_slot, kvh, head_rows, head_cols, BLOCK_N, HEAD_DIM)
    else:
        k_page, k_slot, k_ok = _tile_pages(kt_row, stride_kt_p, n0, offs_n, hi, num_pages, MASKED, PAGE_SIZE, BLOCK_N)
        k_off, ksf_off = kv_token_offsets(k_page, k_slot, kvh, stride_k_p, stride_k_s, stride_k_h,
                                          stride_ksf_p, stride_ksf_s, stride_ksf_h, KV_FORMAT)
        if QK_FP8:  # fp8 query and fp8 keys: an fp8 tensor-core product, raw bytes straight in
            k = tl.load(k_ptr + k_off[:, None] + tl.arange(0, HEAD_DIM)[None, :], mask=k_ok[:, None], other=0.0)
        else:
            k = load_kv_tile(k_ptr, k_sf_ptr, k_off, ksf_off, k_ok, 0, HEAD_DIM, KV_FORMAT, CDT)
    return tl.dot(q, tl.trans(k)), k_page, k_slot, k_ok


@triton.jit
def _fold_values(
    acc, p, alpha, v_ptr, v_sf_ptr, v_page, v_slot, v_ok, kvh,
    stride_v_p, stride_v_s, stride_v_h, stride_vsf_p, stride_vsf_s, stride_vsf_h, head_rows, head_cols,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr, CDT: tl.constexpr,
    MASKED: tl.constexpr, TMA: tl.constexpr,
):
    """``acc * alpha + P V`` for the V tile at ``(v_page, v_slot)``."""
    if TMA:
        v = _tma_tile(v_ptr, v_page, v_slot, kvh, head_rows, head_cols, BLOCK_N, HEAD_DIM)
        if KV_FORMAT != KV_HALF:  # fp8 pages (fp8 scores): the P.V operand in float16 (exact)
            v = v.to(CDT)
        if MASKED:  # a page's slots past the request hold anything (NaN too): 0 * NaN is NaN
            v = tl.where(v_ok[:, None], v, 0.0)
    else:
        v_off, vsf_off = kv_token_offsets(v_page, v_slot, kvh, stride_v_p, stride_v_s, stride_v_h,
                                          stride_vsf_p, stride_vsf_s, stride_vsf_h, KV_FORMAT)
        v = load_kv_tile(v_ptr, v_sf_ptr, v_off, vsf_off, v_ok, 0, HEAD_DIM, KV_FORMAT, CDT, PV_OPERAND=True)
    return tl.dot(p.to(v.dtype), v, acc * alpha[:, None])


@triton.jit
def _context_run(
    acc, m_i, l_i, q,
    k_ptr, v_ptr, k_sf_ptr, v_sf_ptr, kt_row, vt_row,
    stride_kt_p, stride_vt_p, stride_kv, stride_sf,
    kvh, num_pages, n_lo, n_hi, hi, first_n, row_pos, row_ok, qk_scale, window_left, skip_lambda,
    head_rows, head_cols,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr,
    SAME_TABLE: tl.constexpr, MASKED: tl.constexpr, HAS_WINDOW: tl.constexpr, SKIP: tl.constexpr,
    QK_FP8: tl.constexpr, CDT: tl.constexpr, TMA: tl.constexpr,
):
    """Fold the key tiles ``n0 = n_lo, n_lo + BLOCK_N, .. < n_hi`` into ``(acc, m_i, l_i)``.

    MASKED: apply the causal/window rule (keys past ``hi`` are masked by it too); otherwise every
    row sees every key of these tiles (all below ``hi``), and the logits stay unscaled until the
    exponent's FMA (``qk_scale >= 0``). Tokens whose page id is invalid load as zeros (finite),
    whatever the table holds. ``stride_kv`` / ``stride_sf``: as :func:`context_kernel`'s.
    """
    stride_k_p, stride_k_s, stride_k_h, stride_v_p, stride_v_s, stride_v_h = stride_kv
    stride_ksf_p, stride_ksf_s, stride_ksf_h, stride_vsf_p, stride_vsf_s, stride_vsf_h = stride_sf
    for n0 in range(n_lo, n_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        s, k_page, k_slot, k_ok = _tile_scores(
            q, k_ptr, k_sf_ptr, kt_row, stride_kt_p, stride_k_p, stride_k_s, stride_k_h,
            stride_ksf_p, stride_ksf_s, stride_ksf_h, kvh, num_pages, n0, hi, head_rows, head_cols,
            HEAD_DIM, PAGE_SIZE, BLOCK_N, KV_FORMAT, MASKED, QK_FP8, CDT, TMA)
        keep = True
        if MASKED or SKIP:
            s = s * qk_scale
            if MASKED:
                dist = row_pos[:, None] - offs_n[None, :]
                allowed = dist >= 0
                if HAS_WINDOW:
                    allowed = allowed & (dist <= window_left)
                s = tl.where(allowed, s, float("-inf"))
            if SKIP:
                # One decision for the whole tile: every row must find it negligible (rows past the
                # request and rows without a key in the tile agree to skip; a row that has seen no
                # key yet never does: exp2(finite - -inf) = inf).
                t_max = tl.max(s, 1)
                ratio = tl.where(t_max == float("-inf"), 0.0, tl.exp2(t_max - m_i))
                vote = ((ratio < skip_lambda) | (row_ok == 0)).to(tl.int32)
                keep = (tl.min(vote, 0) == 0) | (n0 == first_n)
        if keep:
            if MASKED or SKIP:
                m_i, l_i, p, alpha = online_softmax_step(m_i, l_i, s)
            else:
                m_i, l_i, p, alpha = full_tile_softmax(m_i, l_i, s, qk_scale)
            if SAME_TABLE:
                v_page, v_slot, v_ok = k_page, k_slot, k_ok
            elif TMA:
                v_page, v_slot, v_ok = _tma_page(vt_row, stride_vt_p, n0, offs_n, hi, PAGE_SIZE)
            else:
                v_page, v_slot, v_ok = _tile_pages(vt_row, stride_vt_p, n0, offs_n, hi, num_pages, MASKED, PAGE_SIZE,
                                                   BLOCK_N)
            acc = _fold_values(acc, p, alpha, v_ptr, v_sf_ptr, v_page, v_slot, v_ok, kvh,
                               stride_v_p, stride_v_s, stride_v_h, stride_vsf_p, stride_vsf_s, stride_vsf_h,
                               head_rows, head_cols, HEAD_DIM, BLOCK_N, KV_FORMAT, CDT, MASKED, TMA)
    return acc, m_i, l_i


# context_kernel's tuple parameters and their members, in order. The kernel takes them apart under
# these names; a launch names each member (fast_launch.Launch's ``tuples`` builds the tuples), and so
# do the sm_90a compile tools. The tuples reach the GPU as their members, in this order: the
# kernel's machine parameters are those of the flat list they replace.
CONTEXT_TUPLES = {
    "stride_kv": ("stride_k_p", "stride_k_s", "stride_k_h", "stride_v_p", "stride_v_s", "stride_v_h"),
    "stride_sf": ("stride_ksf_p", "stride_ksf_s", "stride_ksf_h", "stride_vsf_p", "stride_vsf_s", "stride_vsf_h"),
    "stride_table": ("stride_kt_b", "stride_kt_p", "stride_vt_b", "stride_vt_p"),
}


@triton.jit
def context_kernel(
    q_ptr,  # [sum_q, Hq, D] query rows (last dim contiguous)
    k_ptr,  # [num_pages, PAGE_SIZE, Hkv, D_STORED] K pages (NHD view, any strides); D_STORED = D/2 for NVFP4;
    #         TMA: a descriptor of the 16-bit (or fp8, QK_FP8) pages as [num_pages, rows, cols] (see _tma_tile)
    v_ptr,  # same as k_ptr
    k_sf_ptr,  # [num_pages, PAGE_SIZE, Hkv, D / 16] e4m3 block scales of K (NVFP4)
    v_sf_ptr,  # [num_pages, PAGE_SIZE, Hkv, D / 16] e4m3 block scales of V (NVFP4)
    k_table_ptr,  # [B, pages_per_seq] int32 page ids of K
    v_table_ptr,  # [B, pages_per_seq] int32 page ids of V
    seq_lens_ptr,  # [B] int32 KV lengths
    cum_q_ptr,  # [B + 1] int32 / int64 query row offsets
    sinks_ptr,  # [Hq] float32 (HAS_SINKS)
    logit_scale_ptr,  # [1] float32 (LOGIT_PTR)
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    out_ptr,  # [sum_q, Hq, D] fp16/bf16/fp8, or NVFP4 packed codes uint8 [sum_q, Hq, D/2] (OUT_NVFP4)
    out_sf_ptr,  # [rows_sf * cols_sf] uint8 e4m3 block scales, 128x4 swizzled (OUT_NVFP4)
    lse_ptr,  # [sum_q, Hq] float32 base-2 LSE of each row (STORE_LSE; head stride 1)
    stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_lse_t,
    # The cache's strides (in elements) come in tuples (CONTEXT_TUPLES names their members): a kernel
    # of fewer parameters, with the same machine parameters (Triton passes a tuple's members one by one).
    stride_kv,  # (stride_k_p, stride_k_s, stride_k_h, stride_v_p, stride_v_s, stride_v_h): k_ptr's and v_ptr's
    #             page (p), slot (s) and head (h)
    stride_sf,  # (stride_ksf_p, stride_ksf_s, stride_ksf_h, stride_vsf_p, stride_vsf_s, stride_vsf_h): k_sf_ptr's
    #             and v_sf_ptr's page (p), slot (s) and head (h)
    stride_table,  # (stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p): k_table_ptr's and v_table_ptr's request
    #                (b) and page (p)
    num_rows, num_pages, capacity, window_left, sf_cols, sf_row0, head_rows, head_cols,
    logit_factor, out_factor, sf_div, skip_factor,
    HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV_FORMAT: tl.constexpr, QK_FP8: tl.constexpr,
    SAME_TABLE: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr, SKIP: tl.constexpr,
    LOGIT_PTR: tl.constexpr, OUT_PTR: tl.constexpr, OUT_FP8: tl.constexpr, OUT_NVFP4: tl.constexpr,
    TMA: tl.constexpr, Q_SIGN: tl.constexpr, STORE_LSE: tl.constexpr = False, CAUSAL: tl.constexpr = True,
):
    stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p = stride_table
    h = tl.program_id(0)
    b = tl.program_id(1)
    mt = tl.num_programs(2) - 1 - tl.program_id(2)  # the last query tiles (most keys) first
    kvh = h // GROUP

    q_start = tl.load(cum_q_ptr + b).to(tl.int32)
    q_end = tl.minimum(tl.load(cum_q_ptr + b + 1).to(tl.int32), num_rows)  # never write past `out`
    q_len = tl.load(cum_q_ptr + b + 1).to(tl.int32) - q_start
    # Lengths clamped into [0, capacity]: one past the table's capacity would read past the
    # request's row of the table; a negative one (uint32 >= 2^31) is empty. Rows are kept inside
    # [0, num_rows) whatever cum_seq_lens_q holds (lab/notes/robustness.md "Device-side clamps").
    kv_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), capacity)
    if mt * BLOCK_M >= q_len:
        return

    offs_m = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = q_start + offs_m
    row_ok = (rows >= 0) & (rows < q_end)
    if CAUSAL:
        row_pos = kv_len - q_len + offs_m
    else:  # bidirectional (no window): every row masked as the request's last one, at kv_len - 1
        row_pos = tl.zeros_like(offs_m) + (kv_len - 1)
    offs_d = tl.arange(0, HEAD_DIM)
    rows64 = rows.to(tl.int64)

    # Operand type of the products: the query's with a 16-bit cache; float16 with an fp8 or NVFP4
    # cache (both convert to it exactly, fp8 in one instruction a pair, and a words format's tiles
    # are float16), and for an fp8 query's P.V product.
    cdt = q_ptr.dtype.element_ty if KV_FORMAT == KV_HALF else tl.float16
    q = tl.load(q_ptr + rows64[:, None] * stride_q_t + h * stride_q_h + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    if not QK_FP8:
        q = q.to(cdt) if KV_FORMAT == KV_HALF else float16_operand(q)
    logit = logit_factor
    if LOGIT_PTR:
        logit = logit * tl.load(logit_scale_ptr)
    # A negative logit scale goes into q (negation is exact, and so is its effect on the products):
    # with qk_scale >= 0 the full tiles take the row max before scaling (see _context_run). Only
    # where the sign may be negative (Q_SIGN 0: a device scale; -1: a negative float): a q read
    # straight from memory stays a shared-memory operand of the products, not 128 registers.
    qk_scale = tl.abs(logit) * LOG2E
    if Q_SIGN <= 0:
        neg = logit < 0
        if QK_FP8:
            q_bits = q.to(tl.uint8, bitcast=True)
            q = tl.where(neg, q_bits ^ 0x80, q_bits).to(q_ptr.dtype.element_ty, bitcast=True)
        else:
            q = tl.where(neg, -q, q)
    skip_lambda = skip_factor / tl.maximum(kv_len, 1).to(tl.float32)

    # Keys the tile's valid rows can see: [start, hi), whole in [full_lo, full_hi).
    if CAUSAL:
        p0, hi, start, full_lo, full_hi = causal_key_ranges(kv_len, q_len, q_end - q_start, mt, window_left, BLOCK_M,
                                                            BLOCK_N, HAS_WINDOW)
    else:  # the key runs of one row at the last position: all the request's keys
        p0, hi, start, full_lo, full_hi = causal_key_ranges(kv_len, 1, 1, 0, window_left, BLOCK_M, BLOCK_N, False)
    a_hi = tl.minimum(full_lo, hi)
    c_lo = tl.maximum(full_hi, a_hi)

    kt_row = k_table_ptr + b.to(tl.int64) * stride_kt_b
    vt_row = v_table_ptr + b.to(tl.int64) * stride_vt_b
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # Three runs of key tiles: the window's edge, the tiles every row sees whole (no mask), the
    # diagonal. Unrolled: each run is its own loop with its own mask flag.
    for run in tl.static_range(3):
        acc, m_i, l_i = _context_run(
            acc, m_i, l_i, q, k_ptr, v_ptr, k_sf_ptr, v_sf_ptr, kt_row, vt_row, stride_kt_p, stride_vt_p,
            stride_kv, stride_sf, kvh, num_pages, (start, full_lo, c_lo)[run], (a_hi, full_hi, hi)[run], hi, start,
            row_pos, row_ok, qk_scale, window_left, skip_lambda, head_rows, head_cols,
            HEAD_DIM, PAGE_SIZE, BLOCK_N, KV_FORMAT, SAME_TABLE, run != 1, HAS_WINDOW, SKIP, QK_FP8, cdt, TMA,
        )

    heads = tl.full([BLOCK_M], 0, tl.int32) + h
    sink2 = sink_logits2(sinks_ptr, heads, row_ok, HAS_SINKS)
    o, lse2 = softmax_finalize(acc, m_i, l_i, sink2, HAS_SINKS)
    if STORE_LSE:
        tl.store(lse_ptr + rows64 * stride_lse_t + h, lse2, mask=row_ok)
    out_mult = out_factor
    if OUT_PTR:
        out_mult = out_mult * tl.load(out_scale_ptr)
    o = o * out_mult
    if OUT_NVFP4:
        BLOCKS: tl.constexpr = HEAD_DIM // 16
        packed, sf = quantize_nvfp4_rows(o, sf_div, BLOCKS)
        offs_b = tl.arange(0, HEAD_DIM // 2)
        tl.store(out_ptr + rows64[:, None] * stride_o_t + h * stride_o_h + offs_b[None, :], packed,
                 mask=row_ok[:, None])
        # 128x4 swizzle (docs/semantics.md, "Formats"): row m (+ the tensor's start index), column k = h * D/16 + block.
        m = (rows + sf_row0).to(tl.int64)[:, None]
        kcol = (h * BLOCKS + tl.arange(0, BLOCKS)).to(tl.int64)[None, :]
        sf_off = (m // 128) * (sf_cols // 4) * 512 + (kcol // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 \
            + kcol % 4
        tl.store(out_sf_ptr + sf_off, sf.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=row_ok[:, None])
    else:
        store_scaled(out_ptr + rows64[:, None] * stride_o_t + h * stride_o_h + offs_d[None, :], o,
                     row_ok[:, None], OUT_FP8)


__all__ = ["CONTEXT_TUPLES", "context_kernel"]
