"""Decode attention kernels: one program per (request, KV head, KV split, query-row block).

A program packs every query row that reads one KV head -- the ``GROUP`` query heads of the KV
group times the ``Q_LEN`` draft tokens of the request -- into one ``BLOCK_M`` tile, so the KV of a
request and head is read once whatever ``Q_LEN`` is. It streams its split's keys in ``BLOCK_N``
tiles (gathering page ids per token, so a tile may span several pages, or with PAGE_RUNS one a run
of a page's rows), keeps the softmax state in registers and either writes the final rows (the
launch has a single split) or a normalised partial ``(o, lse)`` to the workspace, which
:func:`decode_combine_kernel` merges.

Single-request decode is the same kernel with ``PAGED=False`` (contiguous ``[L, Hkv, D]`` K/V)
and the ROPE / ALIBI / SOFT_CAP / STORE_LSE switches it needs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import (
    KV_HALF,
    LOG2E,
    as_mask,
    alibi_slopes,
    element_bits,
    float16_operand,
    kv_token_offsets,
    load_kv_tile,
    load_page_ids,
    load_run_ids,
    merge_partials,
    online_softmax_step,
    online_softmax_step_tile,
    page_token_offsets,
    prefetch_rows_l2,
    rope_angle,
    rope_freqs,
    rope_query_per_key,
    rope_rotate,
    rope_table,
    run_pages,
    sink_logits2,
    soft_cap,
    softmax_finalize,
    spec_draft_allowed,
    split_bounds,
    storage_bytes,
    store_scaled,
    tma_kv_tile,
    tile_diagonal,
    tile_pv,
    tile_scores,
    token_pages,
    window_causal_allowed,
)
from ..common.balance import balanced_plan, balanced_unit, lane_piece, lane_span
from ..common.combine import decode_combine_kernel
from ...runtime.ptx_hints import mark_copies_evict_first

# KV_TMA kernels with KV_EVICT_FIRST carry the L2 hint on their TMA copies: their launches compile
# inside ptx_hints.applied() (fast_launch.Launch with ptx_hints=True).

try:  # grid dependency control (programmatic dependent launch); absent in old Triton builds
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _request_kv_range(seq_lens_ptr, kv_start_ptr, b, fixed_len, window_left, Q_LEN: tl.constexpr,
                      PAGED: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_KV_START: tl.constexpr):
    """``(kv_len, kv_lo)``: the request's length and its first key any of its rows can see.

    PAGED: ``fixed_len`` is the page table's capacity in tokens (pages a row x page size), and the
    length read is clamped into ``[0, capacity]``: a length past the row would read the table past
    the request's row, and a negative one (a uint32 length >= 2^31 reads as one) is empty
    (lab/notes/robustness.md "Device-side clamps")."""
    if PAGED:
        kv_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), fixed_len)
    else:
        kv_len = fixed_len
    kv_lo = kv_len * 0
    if HAS_WINDOW:
        # The first draft row (position L - Q) has the earliest window start.
        kv_lo = tl.maximum(kv_len - Q_LEN - window_left, 0)
    if HAS_KV_START:
        # A per-request first key (a window cut into a compacted local slice: kvattn.distributed).
        kv_lo = tl.maximum(kv_lo, tl.load(kv_start_ptr + b).to(tl.int32))
    return kv_len, kv_lo


@triton.jit
def _tile_rows(offs_m, b, kvh, GROUP: tl.constexpr, Q_LEN: tl.constexpr):
    """``(row_ok, row_idx, heads, q_rows)`` of tile rows ``offs_m`` of request ``b`` and KV head
    ``kvh``: row m is draft row ``m // GROUP`` of query head ``kvh * GROUP + m % GROUP``."""
    row_ok = offs_m < Q_LEN * GROUP
    row_idx = offs_m // GROUP
    heads = kvh * GROUP + offs_m % GROUP
    q_rows = (b * Q_LEN + row_idx).to(tl.int64)
    return row_ok, row_idx, heads, q_rows


@triton.jit
def _tile_pages(offs_n, tok_ok, kt_row, vt_row, stride_kt_p, stride_vt_p, num_pages, kvh, stride_kv,
                PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, SAME_TABLE: tl.constexpr, PAGE_OFFSETS: tl.constexpr):
    """``(k_ids, v_ids)`` of tokens ``offs_n``: their page ids (``load_page_ids``; V's are K's on one
    table), or with PAGE_OFFSETS their tokens' offsets (``page_token_offsets``; 2: V's are K's)."""
    stride_k_p, stride_k_s, stride_k_h, stride_v_p, stride_v_s, stride_v_h = stride_kv
    k_ids = load_page_ids(kt_row, stride_kt_p, offs_n, tok_ok, num_pages, PAGE_SIZE, PAGED)
    v_ids = k_ids
    if not SAME_TABLE:
        v_ids = load_page_ids(vt_row, stride_vt_p, offs_n, tok_ok, num_pages, PAGE_SIZE, PAGED)
    if PAGE_OFFSETS:
        k_ids = page_token_offsets(k_ids, offs_n, kvh, stride_k_p, stride_k_s, stride_k_h, PAGE_SIZE)
        if PAGE_OFFSETS == 1:
            v_ids = page_token_offsets(v_ids, offs_n, kvh, stride_v_p, stride_v_s, stride_v_h, PAGE_SIZE)
        else:
            v_ids = k_ids
    return k_ids, v_ids


@triton.jit
def _tile_runs(kt_row, vt_row, stride_kt_p, stride_vt_p, tile_start, end, num_pages, PAGE_SIZE: tl.constexpr,
               PAGE_RUN: tl.constexpr, RUNS: tl.constexpr, SAME_TABLE: tl.constexpr):
    """``(k_ids, v_ids)``: the page ids of the tile's runs (``load_run_ids``; V's are K's on one table)."""
    k_ids = load_run_ids(kt_row, stride_kt_p, tile_start, end, num_pages, PAGE_SIZE, PAGE_RUN, RUNS)
    v_ids = k_ids
    if not SAME_TABLE:
        v_ids = load_run_ids(vt_row, stride_vt_p, tile_start, end, num_pages, PAGE_SIZE, PAGE_RUN, RUNS)
    return k_ids, v_ids


@triton.jit
def _masked_scores(s, allowed, KEYS_IN_M: tl.constexpr):
    """``s`` with -inf where a key is not ``allowed`` (``[M, N]``; KEYS_IN_M: ``s`` is ``[N, M]``)."""
    if KEYS_IN_M:
        return tl.where(tl.trans(allowed), s, float("-inf"))
    else:
        return tl.where(allowed, s, float("-inf"))


@triton.jit
def _decode_item(
    item,
    q_ptr, k_ptr, v_ptr, k_sf_ptr, v_sf_ptr, k_table_ptr, v_table_ptr, seq_lens_ptr, kv_start_ptr, mask_ptr, sinks_ptr,
    logit_scale_ptr, out_scale_ptr, out_ptr, lse_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
    stride_qo, stride_kv, stride_sf, stride_req, stride_lse_t, sizes, fixed_len, window_left,
    logit_factor, out_factor, soft_cap_value, rope_theta, rope_scale, alibi_n, balance_sizes, lane_share,
    SHAPE: tl.constexpr, KV_FORMAT: tl.constexpr, PAGED: tl.constexpr, SAME_TABLE: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_MASK: tl.constexpr, HAS_SINKS: tl.constexpr, LOGIT_PTR: tl.constexpr,
    OUT_PTR: tl.constexpr, OUT_FP8: tl.constexpr, STORE_LSE: tl.constexpr, ROPE: tl.constexpr, ALIBI: tl.constexpr,
    SOFT_CAP: tl.constexpr, USE_DOT: tl.constexpr, PAGING: tl.constexpr, PREFETCH: tl.constexpr,
    KV_EVICT_FIRST: tl.constexpr, KV_TMA: tl.constexpr, MERGE: tl.constexpr, MERGE_ROWS: tl.constexpr,
    MERGE_BLOCK_S: tl.constexpr, HAS_KV_START: tl.constexpr, SPLIT_SPAN: tl.constexpr, BALANCE: tl.constexpr,
):
    """One work item of :func:`decode_split_kernel` (its parameters, grouped as there: SPLIT_TUPLES)."""
    HEAD_DIM: tl.constexpr = SHAPE[0]
    PAGE_SIZE: tl.constexpr = SHAPE[1]
    NUM_KV_HEADS: tl.constexpr = SHAPE[2]
    GROUP: tl.constexpr = SHAPE[3]
    Q_LEN: tl.constexpr = SHAPE[4]
    BLOCK_M: tl.constexpr = SHAPE[5]
    BLOCK_N: tl.constexpr = SHAPE[6]
    M_BLOCKS: tl.constexpr = SHAPE[7]
    # KEYS_IN_M: keys in the products' M dim, S^T = K Q^T and O^T = V^T P^T (the plan's choice for
    # fp8 caches with at most 8 query rows: mma.sync N = 8 instead of rows padded to a 16-row M tile)
    KEYS_IN_M: tl.constexpr = SHAPE[8]
    tl.static_assert(not KEYS_IN_M or (USE_DOT and not ROPE and not ALIBI))
    BALANCED: tl.constexpr = BALANCE[0]
    BLOCK_B: tl.constexpr = BALANCE[1]
    MIN_CHUNK: tl.constexpr = BALANCE[2]
    LANES: tl.constexpr = BALANCE[4]
    # requests of more units are left unmerged, for the lanes combine launch (0: none)
    MERGE_UNITS: tl.constexpr = BALANCE[6]
    PAGE_AHEAD: tl.constexpr = PAGING[0]
    # PAGE_OFFSETS 0 / 1 / 2: token offsets where the page ids load (2: V's are K's)
    PAGE_OFFSETS: tl.constexpr = PAGING[1]
    # PAGE_RUNS: a tile's addresses a page run at a time (see the loop), the plan's choice where
    # every tile starts at a multiple of BLOCK_N (no window, no first keys) and holds whole pages
    # or lies in one, and a row's offset in its page fits int32
    PAGE_RUNS: tl.constexpr = PAGING[2]
    stride_q_t, stride_q_h, stride_o_t, stride_o_h = stride_qo
    stride_k_p, stride_k_s, stride_k_h, stride_v_p, stride_v_s, stride_v_h = stride_kv
    stride_ksf_p, stride_ksf_s, stride_ksf_h, stride_vsf_p, stride_vsf_s, stride_vsf_h = stride_sf
    stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p, stride_mask_b, stride_mask_r = stride_req
    _, num_rows, num_splits, num_pages = sizes
    batch, unit_target = balance_sizes

    NUM_HEADS: tl.constexpr = NUM_KV_HEADS * GROUP
    HALF: tl.constexpr = HEAD_DIM // 2
    # RoPE with one query row on tensor cores (MHA single decode): rotate the query once per key
    # instead of each key (see the loop), so K goes from its pipelined shared-memory copy straight
    # into the product, as without RoPE. Several rows keep the key rotation (one per key, shared).
    ROPE_Q: tl.constexpr = ROPE and USE_DOT and GROUP * Q_LEN == 1
    # Operand type of the products. Quantised caches (fp8, NVFP4) convert exactly to float16, and
    # the fp8 -> float16 conversion is one instruction per pair (bfloat16 needs a second step).
    cdt = q_ptr.dtype.element_ty if KV_FORMAT == KV_HALF else tl.float16

    mb = item % M_BLOCKS
    rest = item // M_BLOCKS
    if BALANCED:
        # Work units of the balanced plan (common.balance): a unit is one chunk of one request, for
        # every KV head and row block; the request's own unit count replaces num_splits.
        kvh = rest % NUM_KV_HEADS
        unit = rest // NUM_KV_HEADS
        if LANES:
            # A ragged batch's unit is request b's piece in the program's lane (lane_share: the
            # lane and its share of tiles, common.balance.lane_span), unit b + lane; a batch found
            # uniform (share 0) keeps num_splits units a request, in request order.
            lane, share = lane_share
            lane_ragged = share > 0
            uni_split = unit % num_splits
            b = tl.minimum(tl.maximum(tl.where(lane_ragged, unit - lane, unit // num_splits), 0), batch - 1)
            split, n_splits, first_unit, lane_lo, lane_hi = lane_piece(
                seq_lens_ptr, b, lane, tl.maximum(share, 1), batch, fixed_len, BLOCK_N, BLOCK_B)
            split = tl.where(lane_ragged, split, uni_split)
            n_splits = tl.where(lane_ragged, n_splits, num_splits)
            first_unit = tl.where(lane_ragged, first_unit, unit - uni_split)
        else:
            b, split, n_splits, first_unit = balanced_unit(seq_lens_ptr, unit, batch, fixed_len, num_splits,
                                                           unit_target, MIN_CHUNK, BLOCK_N, BLOCK_B, MERGE_BLOCK_S)
        bh = b * NUM_KV_HEADS + kvh
    else:
        split = rest % num_splits
        bh = rest // num_splits
        b = bh // NUM_KV_HEADS
        kvh = bh % NUM_KV_HEADS
        n_splits = num_splits

    kv_len, kv_lo = _request_kv_range(seq_lens_ptr, kv_start_ptr, b, fixed_len, window_left, Q_LEN, PAGED,
                                      HAS_WINDOW, HAS_KV_START)
    chunk = split_bounds(kv_len, kv_lo, n_splits, BLOCK_N, SPLIT_SPAN)
    start = kv_lo + split * chunk
    end = tl.minimum(start + chunk, kv_len)
    if BALANCED and LANES:  # (a balanced plan has no window or first keys: kv_lo is 0)
        start = tl.where(lane_ragged, lane_lo, start)
        end = tl.where(lane_ragged, tl.minimum(lane_hi, kv_len), end)
    if PREFETCH > 0:
        # Contiguous caches (the launcher passes 0 for paged ones, whose addresses wait on the
        # page table anyway): the split's first PREFETCH tiles of K and V head for L2 now.
        ELEM: tl.constexpr = storage_bytes(KV_FORMAT)
        ROW_BYTES: tl.constexpr = HEAD_DIM * element_bits(KV_FORMAT) // 8
        pf_rows = kv_len - start  # (not end: ptxas then kept the RoPE kernel at 156 registers)
        pf_head = kvh.to(tl.int64)
        prefetch_rows_l2(k_ptr + (pf_head * stride_k_h + start.to(tl.int64) * stride_k_s), stride_k_s * ELEM, pf_rows,
                         PREFETCH * BLOCK_N, ROW_BYTES)
        prefetch_rows_l2(v_ptr + (pf_head * stride_v_h + start.to(tl.int64) * stride_v_s), stride_v_s * ELEM, pf_rows,
                         PREFETCH * BLOCK_N, ROW_BYTES)

    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok, row_idx, heads, q_rows = _tile_rows(offs_m, b, kvh, GROUP, Q_LEN)
    row_pos = kv_len - Q_LEN + row_idx
    draft_start = kv_len - Q_LEN
    offs_d = tl.arange(0, HEAD_DIM)

    logit = logit_factor
    if LOGIT_PTR:
        logit = logit * tl.load(logit_scale_ptr)
    # Without a bias or cap the whole logit multiplier folds into one base-2 factor.
    qk_scale = logit * LOG2E

    q_off = q_rows[:, None] * stride_q_t + heads[:, None] * stride_q_h
    if ROPE_Q:
        # u = R(p - j0) q for the tile at j0 (p = kv_len - 1): set at the split's start, then
        # turned by R(-BLOCK_N) each tile. (p - j0) is reduced once, in float64; the product of
        # rotations drifts by ~1e-7 rad a tile, far under the operands' bfloat16 rounding.
        q0 = b.to(tl.int64) * Q_LEN * stride_q_t + kvh * GROUP * stride_q_h
        offs_h = tl.arange(0, HALF)
        q1 = tl.load(q_ptr + q0 + offs_h).to(tl.float32)
        q2 = tl.load(q_ptr + q0 + HALF + offs_h).to(tl.float32)
        freqs = rope_freqs(rope_theta, rope_scale, HALF)
        ang = rope_angle(kv_len - 1 - start, freqs)
        u1, u2 = rope_rotate(q1, q2, tl.cos(ang), tl.sin(ang))
        # [1, HALF]: carried in the layout of their use (a 1-D carry costs two conversions a tile)
        u1 = u1[None, :]
        u2 = u2[None, :]
        step_ang = rope_angle(tl.full([1], BLOCK_N, tl.int32), freqs)[None, :]
        step_cos = tl.cos(step_ang)
        step_sin = tl.sin(step_ang)
        t_cos, t_sin = rope_table(BLOCK_N, freqs)
        first_row = tl.arange(0, BLOCK_M) == 0
    elif ROPE:
        offs_h = tl.arange(0, HALF)
        q1 = tl.load(q_ptr + q_off + offs_h[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        q2 = tl.load(q_ptr + q_off + HALF + offs_h[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
        freqs = rope_freqs(rope_theta, rope_scale, HALF)
        ang = rope_angle(row_pos[:, None], freqs[None, :])
        q1, q2 = rope_rotate(q1, q2, tl.cos(ang), tl.sin(ang))
        if USE_DOT:  # the CUDA-core path keeps the rotated values in float32
            q1 = q1.to(cdt)
            q2 = q2.to(cdt)
        # cos/sin of key j = j0 + t from those of j0 and of t < BLOCK_N (angle addition): two
        # sincos per frequency per tile instead of one per key and frequency.
        t_cos, t_sin = rope_table(BLOCK_N, freqs)
    else:
        q = tl.load(q_ptr + q_off + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        if KV_FORMAT != KV_HALF:
            q = float16_operand(q)
    if ALIBI:
        slopes = alibi_slopes(heads, alibi_n)
    sink2 = sink_logits2(sinks_ptr, heads, row_ok, HAS_SINKS)

    kt_row = k_table_ptr + b.to(tl.int64) * stride_kt_b
    vt_row = v_table_ptr + b.to(tl.int64) * stride_vt_b
    mask_row = mask_ptr + b.to(tl.int64) * stride_mask_b

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    # TILE_SUM: the softmax denominator kept per logit (the scores' layout) and summed over the keys
    # once after the loop, so no tile reduces its row sum across the warps that hold its keys
    # (sm_90a, Triton 3.6: bf16 64-key tiles 9 -> 6 barriers and 4-8 % fewer instructions, fp8
    # 12 -> 9; on the H200 fp8 rows 3-9 % faster, bf16 level to 3 % faster;
    # lab/notes/decode-loop-reductions.md). Not with RoPE: its one-row programs' square
    # score tile would be held whole (694 -> 734 instructions a tile, 199 -> 214 registers).
    TILE_SUM: tl.constexpr = not ROPE
    if TILE_SUM:
        if KEYS_IN_M:
            l_tile = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        else:
            l_tile = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if KEYS_IN_M:
        acc = tl.zeros([HEAD_DIM, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # PAGE_AHEAD: page ids are loaded one tile ahead and carried through the loop, so the K/V
    # loads of a tile depend on no load of their own iteration and the pipeliner double-buffers
    # them with fewer stages; otherwise the pipeliner stages the (table -> K/V) chain itself.
    offs_n = start + tl.arange(0, BLOCK_N)
    # OFF_ROWS: the loads take the rows to read from the token offsets' signs (PAGE_OFFSETS)
    OFF_ROWS: tl.constexpr = PAGE_OFFSETS > 0 and not PAGE_RUNS
    if PAGE_RUNS:
        # A tile is RUNS runs of PAGE_RUN rows, each run in one page (the plan's PAGE_RUNS: tiles
        # start at multiples of BLOCK_N and hold whole pages or lie in one): a run's page id rides
        # through the loop instead of a token's, its page offset is one 64-bit multiply a run and
        # tile, added to the head's loop-invariant pointer, and a row adds its int32 offset in the
        # page (load_kv_tile's REL_ROWS), its column's included.
        PAGE_RUN: tl.constexpr = PAGE_SIZE if PAGE_SIZE < BLOCK_N else BLOCK_N
        RUNS: tl.constexpr = BLOCK_N // PAGE_RUN
        tl.static_assert(PAGED and PAGE_OFFSETS > 0 and not HAS_WINDOW and not HAS_KV_START and not KV_TMA)
        tl.static_assert(PAGE_SIZE % BLOCK_N == 0 or BLOCK_N % PAGE_SIZE == 0)
        rows_n = tl.arange(0, BLOCK_N)
        row_run = rows_n // PAGE_RUN
        k_rel = (rows_n % PAGE_RUN) * stride_k_s
        v_rel = k_rel
        if PAGE_OFFSETS == 1:
            v_rel = (rows_n % PAGE_RUN) * stride_v_s
        # the head's rows as bytes: a page offset in bytes needs no scaling of its own a run
        ELEM_BYTES: tl.constexpr = storage_bytes(KV_FORMAT)
        k_head = (k_ptr + kvh.to(tl.int64) * stride_k_h).to(tl.pointer_type(tl.int8), bitcast=True)
        v_head = (v_ptr + kvh.to(tl.int64) * stride_v_h).to(tl.pointer_type(tl.int8), bitcast=True)
        k_page_bytes = tl.cast(stride_k_p, tl.int64) * ELEM_BYTES
        v_page_bytes = tl.cast(stride_v_p, tl.int64) * ELEM_BYTES
        k_ids, v_ids = _tile_runs(kt_row, vt_row, stride_kt_p, stride_vt_p, start, end, num_pages, PAGE_SIZE,
                                  PAGE_RUN, RUNS, SAME_TABLE)
    else:
        k_ids, v_ids = _tile_pages(offs_n, offs_n < end, kt_row, vt_row, stride_kt_p, stride_vt_p, num_pages, kvh,
                                   stride_kv, PAGE_SIZE, PAGED, SAME_TABLE, PAGE_OFFSETS)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        tok_ok = offs_n < end
        if not PAGE_AHEAD:
            if PAGE_RUNS:
                k_ids, v_ids = _tile_runs(kt_row, vt_row, stride_kt_p, stride_vt_p, start_n, end, num_pages,
                                          PAGE_SIZE, PAGE_RUN, RUNS, SAME_TABLE)
            else:
                k_ids, v_ids = _tile_pages(offs_n, tok_ok, kt_row, vt_row, stride_kt_p, stride_vt_p, num_pages, kvh,
                                           stride_kv, PAGE_SIZE, PAGED, SAME_TABLE, PAGE_OFFSETS)
        k_src = k_ptr
        v_src = v_ptr
        if PAGE_RUNS:
            page_off, k_lim = run_pages(k_ids, row_run, k_page_bytes, end - start_n, RUNS)
            k_src = (k_head + page_off).to(k_ptr.dtype, bitcast=True)
            v_src = (v_head + page_off).to(v_ptr.dtype, bitcast=True)
            v_lim = k_lim
            if PAGE_OFFSETS == 1 or not SAME_TABLE:
                page_off, v_lim = run_pages(v_ids, row_run, v_page_bytes, end - start_n, RUNS)
                v_src = (v_head + page_off).to(v_ptr.dtype, bitcast=True)
            # The tile's first slot (0 on tiles of whole pages) goes into the rows' int32 offsets,
            # a signed % the compiler does not find loop-invariant: a row's offset is then one
            # IMAD a tile that the 64-bit address takes whole (IMAD.WIDE). An invariant offset (no
            # slot term, or an unsigned %) is hoisted sign-extended and scaled in 64 bits: two
            # instructions a row to add, two registers a row to hold (sm_90a, Triton 3.6: pages
            # of 64, 346 instructions a tile instead of 340, up to 244 registers instead of 168).
            slot0 = start_n % PAGE_SIZE
            k_off = k_rel + slot0 * stride_k_s
            v_off = k_off
            if PAGE_OFFSETS == 1:
                v_off = v_rel + slot0 * stride_v_s
            k_ok = rows_n < k_lim
            ksf_off = k_off
        elif PAGE_OFFSETS:
            # k_ids / v_ids hold the tokens' offsets (negative: unusable id, read as zeros)
            k_off = k_ids
            k_ok = k_off >= 0
            ksf_off = k_off
        else:
            k_page, k_slot, k_ok = token_pages(k_ids, offs_n, tok_ok, PAGE_SIZE, PAGED)
            v_page, v_slot, v_ok = k_page, k_slot, k_ok
            if not SAME_TABLE:
                v_page, v_slot, v_ok = token_pages(v_ids, offs_n, tok_ok, PAGE_SIZE, PAGED)
            k_off, ksf_off = kv_token_offsets(k_page, k_slot, kvh, stride_k_p, stride_k_s, stride_k_h,
                                              stride_ksf_p, stride_ksf_s, stride_ksf_h, KV_FORMAT)

        if ROPE_Q:
            # S[t, t'] = <R(p - j0 - t) q, k_t'>: its diagonal holds the tile's logits. The square
            # product is ~BLOCK_N / 16 times the padded one row, still well under the tile's
            # memory time, and the query rows depend on no load, so they overlap the copies.
            if KV_TMA:
                k1 = tma_kv_tile(k_ptr, kvh, start_n, 0, BLOCK_N, HALF)
                k2 = tma_kv_tile(k_ptr, kvh, start_n, HALF, BLOCK_N, HALF)
            else:
                k1 = load_kv_tile(k_src, k_sf_ptr, k_off, ksf_off, k_ok, 0, HALF, KV_FORMAT, cdt,
                                  EVICT_FIRST=KV_EVICT_FIRST, OFF_VALID=OFF_ROWS, REL_ROWS=PAGE_RUNS)
                k2 = load_kv_tile(k_src, k_sf_ptr, k_off, ksf_off, k_ok, HALF, HALF, KV_FORMAT, cdt,
                                  EVICT_FIRST=KV_EVICT_FIRST, OFF_VALID=OFF_ROWS, REL_ROWS=PAGE_RUNS)
            qt1, qt2 = rope_query_per_key(u1, u2, t_cos, t_sin)
            sq = tl.dot(qt1.to(cdt), tl.trans(k1))
            sq = tl.dot(qt2.to(cdt), tl.trans(k2), sq)
            qk = tl.where(first_row[:, None], tile_diagonal(sq)[None, :], 0.0)
            u1, u2 = rope_rotate(u1, u2, step_cos, -step_sin)
        elif ROPE:
            k1 = load_kv_tile(k_src, k_sf_ptr, k_off, ksf_off, k_ok, 0, HALF, KV_FORMAT, tl.float32,
                              EVICT_FIRST=KV_EVICT_FIRST, OFF_VALID=OFF_ROWS, REL_ROWS=PAGE_RUNS)
            k2 = load_kv_tile(k_src, k_sf_ptr, k_off, ksf_off, k_ok, HALF, HALF, KV_FORMAT, tl.float32,
                              EVICT_FIRST=KV_EVICT_FIRST, OFF_VALID=OFF_ROWS, REL_ROWS=PAGE_RUNS)
            b_ang = rope_angle(start_n, freqs)
            b_cos = tl.cos(b_ang)[None, :]
            b_sin = tl.sin(b_ang)[None, :]
            cos = b_cos * t_cos - b_sin * t_sin
            sin = b_sin * t_cos + b_cos * t_sin
            k1, k2 = rope_rotate(k1, k2, cos, sin)
            if USE_DOT:
                k1 = k1.to(cdt)
                k2 = k2.to(cdt)
            qk = tile_scores(q1, k1, USE_DOT) + tile_scores(q2, k2, USE_DOT)
        else:
            if KV_TMA:
                k = tma_kv_tile(k_ptr, kvh, start_n, 0, BLOCK_N, HEAD_DIM)
            else:
                k = load_kv_tile(k_src, k_sf_ptr, k_off, ksf_off, k_ok, 0, HEAD_DIM, KV_FORMAT, cdt,
                                 EVICT_FIRST=KV_EVICT_FIRST, OFF_VALID=OFF_ROWS, REL_ROWS=PAGE_RUNS)
            if KEYS_IN_M:
                qk = tl.dot(k, tl.trans(q))
            else:
                qk = tile_scores(q, k, USE_DOT)

        if ALIBI or SOFT_CAP:
            s = qk * logit
            if ALIBI:
                s = s + slopes[:, None] * offs_n[None, :].to(tl.float32)
            if SOFT_CAP:
                s = soft_cap(s, soft_cap_value)
            s = s * LOG2E
        else:
            s = qk * qk_scale

        # A token of an unusable page id keeps its (zero) key's logit: its K / V loads read zeros
        # (docs/semantics.md, "Unusable page ids").
        allowed = tok_ok[None, :]
        if Q_LEN > 1:
            c = offs_n[None, :] - draft_start
            prefix = c < 0
            if HAS_WINDOW:
                prefix = prefix & (row_pos[:, None] - offs_n[None, :] <= window_left)
            draft = spec_draft_allowed(row_idx, row_ok, c, mask_row, stride_mask_r, Q_LEN, HAS_MASK)
            allowed = allowed & (prefix | draft)
        elif HAS_WINDOW:
            allowed = allowed & window_causal_allowed(row_pos, offs_n, window_left, True)
        if PAGE_RUNS and Q_LEN == 1 and not KEYS_IN_M:
            # One query row (and no window: PAGE_RUNS): a tile wholly before `end` allows every key,
            # so only the last tile masks its scores, a branch the whole program takes (16 of the
            # bf16 loop's ~340 SASS instructions a 64-key tile on pages of 64). Kept to the runs'
            # launches: on the token offsets' ones and single decode it cost registers as often as
            # it saved them (the one-row RoPE kernel by TMA 199 -> 226), fp8 with keys in M 44.
            if start_n + BLOCK_N > end:
                s = _masked_scores(s, allowed, KEYS_IN_M)
        else:
            s = _masked_scores(s, allowed, KEYS_IN_M)
        if TILE_SUM:
            m_i, l_tile, p, alpha = online_softmax_step_tile(m_i, l_tile, s, KEYS_IN_M)
        else:
            m_i, l_i, p, alpha = online_softmax_step(m_i, l_i, s, KEYS_IN_M)

        if PAGE_RUNS:
            v_ok = rows_n < v_lim
            vsf_off = v_off
        elif PAGE_OFFSETS:
            v_off = v_ids
            v_ok = v_off >= 0
            vsf_off = v_off
        else:
            v_off, vsf_off = kv_token_offsets(v_page, v_slot, kvh, stride_v_p, stride_v_s, stride_v_h,
                                              stride_vsf_p, stride_vsf_s, stride_vsf_h, KV_FORMAT)
        if KV_TMA:
            v = tma_kv_tile(v_ptr, kvh, start_n, 0, BLOCK_N, HEAD_DIM)
        else:
            v = load_kv_tile(v_src, v_sf_ptr, v_off, vsf_off, v_ok, 0, HEAD_DIM, KV_FORMAT, cdt, PV_OPERAND=True,
                             EVICT_FIRST=KV_EVICT_FIRST, OFF_VALID=OFF_ROWS, REL_ROWS=PAGE_RUNS)
        if KEYS_IN_M:
            acc = acc * alpha[None, :] + tl.dot(tl.trans(v), p.to(v.dtype))
        else:
            acc = acc * alpha[:, None] + tile_pv(p, v, USE_DOT)

        if PAGE_AHEAD:
            if PAGE_RUNS:
                k_ids, v_ids = _tile_runs(kt_row, vt_row, stride_kt_p, stride_vt_p, start_n + BLOCK_N, end, num_pages,
                                          PAGE_SIZE, PAGE_RUN, RUNS, SAME_TABLE)
            else:
                offs_next = offs_n + BLOCK_N
                k_ids, v_ids = _tile_pages(offs_next, offs_next < end, kt_row, vt_row, stride_kt_p, stride_vt_p,
                                           num_pages, kvh, stride_kv, PAGE_SIZE, PAGED, SAME_TABLE, PAGE_OFFSETS)

    # A launch with one split writes the final rows; with several, every split writes a partial
    # (an empty one, o = 0 and lse = -inf, past the request's active splits), so the combine merges
    # all num_splits of them without reading the request's length again.
    final = n_splits == 1
    if TILE_SUM:
        l_i = tl.sum(l_tile, 0 if KEYS_IN_M else 1)
    if KEYS_IN_M:
        acc = tl.trans(acc)
    o, lse2 = softmax_finalize(acc, m_i, l_i, sink2, HAS_SINKS)
    out_mult = out_factor
    if OUT_PTR:
        out_mult = out_mult * tl.load(out_scale_ptr)
    o_off = q_rows[:, None] * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :]
    store_scaled(out_ptr + o_off, o * out_mult, as_mask(row_ok[:, None] & final), OUT_FP8)
    if STORE_LSE:
        tl.store(lse_ptr + q_rows * stride_lse_t + heads, lse2, mask=as_mask(row_ok & final))

    # Partials leave out the sinks (the combine adds them once) and the output scale.
    partial = n_splits > 1
    o_part, _ = softmax_finalize(acc, m_i, l_i, sink2, False)
    if BALANCED:
        # Partials by unit: [units, Q_LEN, Hq, D], a unit's rows those of its one request.
        p_row = (unit.to(tl.int64) * Q_LEN + row_idx) * NUM_HEADS + heads
    else:
        p_row = (split.to(tl.int64) * num_rows + q_rows) * NUM_HEADS + heads
    tl.store(part_o_ptr + p_row[:, None] * HEAD_DIM + offs_d[None, :], o_part, mask=as_mask(row_ok[:, None] & partial))
    tl.store(part_lse_ptr + p_row, lse2, mask=as_mask(row_ok & partial))

    if MERGE:
        # The item's last split to finish merges all of them (no combine launch): each split
        # counts its arrival after its partial is written (the barrier orders every thread's
        # stores before the one thread's release), and the last resets the count for the next
        # launch. Every split of an item runs, so the count always reaches n_splits. Balanced
        # units of a one-unit request wrote their rows and count nothing.
        tl.debug_barrier()
        count_ptr = counter_ptr + (bh * M_BLOCKS + mb)
        if BALANCED:
            merged = partial
            if MERGE_UNITS > 0:
                # A ragged batch's requests of more units go to the lanes combine launch; a batch
                # found uniform (dealt, not in lanes) merges here, so that launch finds nothing.
                tl.static_assert(LANES)
                merged = merged & ((n_splits <= MERGE_UNITS) | (not lane_ragged))
            arrived = tl.atomic_add(count_ptr, 1, mask=merged, sem="acq_rel", scope="gpu")
            last = merged & (arrived == n_splits - 1)
        else:
            arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
            last = arrived == num_splits - 1
        if last:
            tl.atomic_xchg(count_ptr, 0, sem="relaxed", scope="gpu")
            # MERGE_ROWS: the tile's rows that can hold query rows (1 for one row, which the
            # tensor-core tile pads to 16), so the merge loads more splits at once instead.
            mg_ok, mg_idx, mg_heads, mg_rows = _tile_rows(mb * BLOCK_M + tl.arange(0, MERGE_ROWS), b, kvh, GROUP, Q_LEN)
            if BALANCED:
                split_stride = Q_LEN * NUM_HEADS
                mg_first = (first_unit.to(tl.int64) * Q_LEN + mg_idx) * NUM_HEADS + mg_heads
            else:
                split_stride = num_rows * NUM_HEADS
                mg_first = mg_rows * NUM_HEADS + mg_heads
            mg_m, mg_den, mg_acc = merge_partials(part_o_ptr, part_lse_ptr, mg_first, mg_ok,
                                                  split_stride, n_splits, HEAD_DIM, MERGE_BLOCK_S, True)
            mg_sink2 = sink_logits2(sinks_ptr, mg_heads, mg_ok, HAS_SINKS)
            mg_o, mg_lse2 = softmax_finalize(mg_acc, mg_m, mg_den, mg_sink2, HAS_SINKS)
            mg_off = mg_rows[:, None] * stride_o_t + mg_heads[:, None] * stride_o_h + offs_d[None, :]
            store_scaled(out_ptr + mg_off, mg_o * out_mult, mg_ok[:, None], OUT_FP8)
            if STORE_LSE:
                tl.store(lse_ptr + mg_rows * stride_lse_t + mg_heads, mg_lse2, mask=mg_ok)


# decode_split_kernel's tuple parameters and their members, in order. The kernel takes them apart
# under these names; a launch names each member (fast_launch.Launch's ``tuples`` builds the tuples),
# and so do the sm_90a compile tools. Runtime tuples reach the GPU as their members, in this order:
# the kernel's machine parameters are those of the flat list they replace.
SPLIT_TUPLES = {
    "stride_qo": ("stride_q_t", "stride_q_h", "stride_o_t", "stride_o_h"),
    "stride_kv": ("stride_k_p", "stride_k_s", "stride_k_h", "stride_v_p", "stride_v_s", "stride_v_h"),
    "stride_sf": ("stride_ksf_p", "stride_ksf_s", "stride_ksf_h", "stride_vsf_p", "stride_vsf_s", "stride_vsf_h"),
    "stride_req": ("stride_kt_b", "stride_kt_p", "stride_vt_b", "stride_vt_p", "stride_mask_b", "stride_mask_r"),
    "sizes": ("num_items", "num_rows", "num_splits", "num_pages"),
    "balance_sizes": ("batch", "unit_target"),
    "SHAPE": ("HEAD_DIM", "PAGE_SIZE", "NUM_KV_HEADS", "GROUP", "Q_LEN", "BLOCK_M", "BLOCK_N", "M_BLOCKS",
              "KEYS_IN_M"),
    "BALANCE": ("BALANCED", "BLOCK_B", "MIN_CHUNK", "DEAL_SLOT", "LANES", "LANE_CAP", "MERGE_UNITS"),
    "PAGING": ("PAGE_AHEAD", "PAGE_OFFSETS", "PAGE_RUNS"),
}


@triton.jit
def decode_split_kernel(
    q_ptr,  # [B * Q_LEN, Hq, D] query rows, request-major (last dim contiguous)
    k_ptr,  # [num_pages, PAGE_SIZE, Hkv, D_STORED] pages (PAGED) or [L, Hkv, D_STORED]; D_STORED = D/2 for NVFP4;
    #         KV_TMA: a tensor descriptor of the contiguous 16-bit cache as [Hkv, L, D] (common.tma_kv_tile)
    v_ptr,  # same shape as k_ptr
    k_sf_ptr,  # [num_pages, PAGE_SIZE, Hkv, D / 16] e4m3 block scales of K (NVFP4)
    v_sf_ptr,  # [num_pages, PAGE_SIZE, Hkv, D / 16] e4m3 block scales of V (NVFP4)
    k_table_ptr,  # [B, pages_per_seq] int32 page ids of K
    v_table_ptr,  # [B, pages_per_seq] int32 page ids of V
    seq_lens_ptr,  # [B] int32 (PAGED)
    kv_start_ptr,  # [B] int32 first key each request may see (HAS_KV_START)
    mask_ptr,  # [B, Q_LEN, words] int16 spec-decode mask bits (HAS_MASK)
    sinks_ptr,  # [Hq] float32 (HAS_SINKS)
    logit_scale_ptr,  # [1] float32 (LOGIT_PTR)
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    out_ptr,  # [B * Q_LEN, Hq, D] q's dtype or fp8 (last dim contiguous)
    lse_ptr,  # [B * Q_LEN, Hq] float32 base-2 LSE (STORE_LSE; head stride 1)
    part_o_ptr,  # [num_splits, B * Q_LEN, Hq, D] float32 normalised split outputs
    part_lse_ptr,  # [num_splits, B * Q_LEN, Hq] float32 split LSEs
    counter_ptr,  # [B * Hkv * M_BLOCKS] int32 arrivals per item (MERGE; zero between launches)
    # Strides (in elements) and sizes come in tuples (SPLIT_TUPLES names their members): a kernel of
    # fewer parameters, with the same machine parameters (Triton passes a tuple's members one by one).
    stride_qo,  # (stride_q_t, stride_q_h, stride_o_t, stride_o_h): q_ptr's and out_ptr's row (t) and head (h)
    stride_kv,  # (stride_k_p, stride_k_s, stride_k_h, stride_v_p, stride_v_s, stride_v_h): k_ptr's and v_ptr's
    #             page (p), slot (s) and head (h); not PAGED, s steps a token and p is unused
    stride_sf,  # (stride_ksf_p, stride_ksf_s, stride_ksf_h, stride_vsf_p, stride_vsf_s, stride_vsf_h): k_sf_ptr's
    #             and v_sf_ptr's page (p), slot (s) and head (h)
    stride_req,  # (stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p, stride_mask_b, stride_mask_r): the
    #              per-request arrays': k_table_ptr's and v_table_ptr's request (b) and page (p), mask_ptr's
    #              request (b) and draft row (r)
    stride_lse_t,  # lse_ptr's row
    sizes,  # (num_items, num_rows, num_splits, num_pages): work items (uniform split), query rows B * Q_LEN,
    #         splits a request, pages of the cache (page ids past it read as invalid)
    fixed_len, window_left,
    logit_factor, out_factor, soft_cap_value, rope_theta, rope_scale, alibi_n,
    balance_sizes,  # (batch, unit_target): requests B and the units a ragged balanced plan aims at (BALANCED)
    SHAPE: tl.constexpr,  # (HEAD_DIM, PAGE_SIZE, NUM_KV_HEADS, GROUP, Q_LEN, BLOCK_M, BLOCK_N, M_BLOCKS, KEYS_IN_M)
    KV_FORMAT: tl.constexpr, PAGED: tl.constexpr, SAME_TABLE: tl.constexpr, HAS_WINDOW: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_SINKS: tl.constexpr, LOGIT_PTR: tl.constexpr, OUT_PTR: tl.constexpr,
    OUT_FP8: tl.constexpr, STORE_LSE: tl.constexpr, ROPE: tl.constexpr, ALIBI: tl.constexpr,
    SOFT_CAP: tl.constexpr, USE_DOT: tl.constexpr,
    PAGING: tl.constexpr,  # (PAGE_AHEAD, PAGE_OFFSETS, PAGE_RUNS): page ids a tile ahead; token offsets where they
    #                        load; a tile's addresses a page run at a time
    PREFETCH: tl.constexpr,
    KV_EVICT_FIRST: tl.constexpr, KV_TMA: tl.constexpr, MERGE: tl.constexpr, MERGE_ROWS: tl.constexpr,
    MERGE_BLOCK_S: tl.constexpr,
    PERSISTENT: tl.constexpr, USE_PDL: tl.constexpr, HAS_KV_START: tl.constexpr = False,
    SPLIT_SPAN: tl.constexpr = 0,
    # (BALANCED, BLOCK_B, MIN_CHUNK, DEAL_SLOT, LANES, LANE_CAP, MERGE_UNITS): the balanced split, a
    # ragged batch's in lanes, a request's lanes at most (LANES), requests of more units left to the
    # lanes combine launch (0: none)
    BALANCE: tl.constexpr = (False, 1, 0, 0, False, 0, 0),
):
    # the members this body reads (_decode_item takes the tuples apart itself)
    NUM_KV_HEADS: tl.constexpr = SHAPE[2]
    BLOCK_N: tl.constexpr = SHAPE[6]
    M_BLOCKS: tl.constexpr = SHAPE[7]
    BALANCED: tl.constexpr = BALANCE[0]
    BLOCK_B: tl.constexpr = BALANCE[1]
    MIN_CHUNK: tl.constexpr = BALANCE[2]
    DEAL_SLOT: tl.constexpr = BALANCE[3]
    LANES: tl.constexpr = BALANCE[4]
    LANE_CAP: tl.constexpr = BALANCE[5]
    MERGE_UNITS: tl.constexpr = BALANCE[6]
    num_items, _, num_splits, _ = sizes
    batch, unit_target = balance_sizes
    if KV_EVICT_FIRST and KV_TMA:
        mark_copies_evict_first()
    if USE_PDL:
        gdc_wait()
    # Two call sites on purpose: wrapping the one-item path in the persistent loop as well (one
    # call site) costs ptxas 40 registers on the one-row RoPE kernel (128 -> 168), a program less
    # per SM and 20-25 % of its time on an H100 (lab/notes/single-decode.md).
    pid = tl.program_id(0)
    if BALANCED:
        # The balanced split (common.balance): the grid is one wave of resident programs, and each
        # program deals itself units from the counter at DEAL_SLOT (its first unit is its own
        # index) until the plan's units run out, so programs that drew short units take more. A
        # ragged batch's units are cut from its lengths, a uniform batch's are the host's split
        # (num_splits units a request), so both take the same loop. With LANES a ragged batch is
        # cut into one equal share of its tiles a lane instead (every KV head and row block of a
        # unit: PER_UNIT programs), each program walking its lane's units, no counter. The last
        # program to finish resets the counter (and its finish count at DEAL_SLOT + 1).
        PER_UNIT: tl.constexpr = NUM_KV_HEADS * M_BLOCKS
        _, units = balanced_plan(seq_lens_ptr, batch, fixed_len, num_splits, unit_target, MIN_CHUNK, BLOCK_N,
                                 BLOCK_B, MERGE_BLOCK_S)
        item = pid
        stop = units * PER_UNIT
        ragged = False
        lane_share = (0, 0)
        if LANES:
            lane = pid // PER_UNIT
            ragged, share, unit_first, unit_stop = lane_span(seq_lens_ptr, lane, batch, fixed_len,
                                                             tl.num_programs(0) // PER_UNIT, MIN_CHUNK, BLOCK_N,
                                                             BLOCK_B, LANE_CAP)
            item = tl.where(ragged, unit_first * PER_UNIT + pid % PER_UNIT, item)
            stop = tl.where(ragged, unit_stop * PER_UNIT, stop)
            lane_share = (lane, tl.where(ragged, share, 0))
            if USE_PDL and MERGE_UNITS > 0:
                # A batch found uniform merges here, so the lanes combine launch has nothing to
                # merge: let it start now, to read the lengths and exit under this launch instead
                # of after it (a ragged batch's combine programs would park in gdc_wait and slow
                # this launch, so they still start at its end; lab/notes/decode-sw12.md).
                if not ragged:
                    gdc_launch_dependents()
        while item < stop:
            _decode_item(
                item, q_ptr, k_ptr, v_ptr, k_sf_ptr, v_sf_ptr, k_table_ptr, v_table_ptr, seq_lens_ptr,
                kv_start_ptr, mask_ptr,
                sinks_ptr, logit_scale_ptr, out_scale_ptr, out_ptr, lse_ptr, part_o_ptr, part_lse_ptr,
                counter_ptr,
                stride_qo, stride_kv, stride_sf, stride_req, stride_lse_t, sizes, fixed_len, window_left,
                logit_factor, out_factor, soft_cap_value, rope_theta, rope_scale, alibi_n, balance_sizes, lane_share,
                SHAPE, KV_FORMAT, PAGED, SAME_TABLE, HAS_WINDOW, HAS_MASK, HAS_SINKS, LOGIT_PTR, OUT_PTR,
                OUT_FP8, STORE_LSE, ROPE, ALIBI, SOFT_CAP, USE_DOT, PAGING, PREFETCH, KV_EVICT_FIRST, KV_TMA,
                MERGE, MERGE_ROWS, MERGE_BLOCK_S, HAS_KV_START, SPLIT_SPAN, BALANCE,
            )
            if ragged:
                item += PER_UNIT
            else:
                item = tl.atomic_add(counter_ptr + DEAL_SLOT, 1, sem="relaxed", scope="gpu") + tl.num_programs(0)
        finished = tl.atomic_add(counter_ptr + DEAL_SLOT + 1, 1, sem="acq_rel", scope="gpu")
        if finished == tl.num_programs(0) - 1:
            tl.atomic_xchg(counter_ptr + DEAL_SLOT, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(counter_ptr + DEAL_SLOT + 1, 0, sem="relaxed", scope="gpu")
    elif PERSISTENT:
        # A capped grid (xqa's sm_count): each program walks the work items.
        for item in range(pid, num_items, tl.num_programs(0)):
            _decode_item(
                item, q_ptr, k_ptr, v_ptr, k_sf_ptr, v_sf_ptr, k_table_ptr, v_table_ptr, seq_lens_ptr, kv_start_ptr,
                mask_ptr,
                sinks_ptr, logit_scale_ptr, out_scale_ptr, out_ptr, lse_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
                stride_qo, stride_kv, stride_sf, stride_req, stride_lse_t, sizes, fixed_len, window_left,
                logit_factor, out_factor, soft_cap_value, rope_theta, rope_scale, alibi_n, balance_sizes, (0, 0),
                SHAPE, KV_FORMAT, PAGED, SAME_TABLE, HAS_WINDOW, HAS_MASK, HAS_SINKS, LOGIT_PTR, OUT_PTR,
                OUT_FP8, STORE_LSE, ROPE, ALIBI, SOFT_CAP, USE_DOT, PAGING, PREFETCH, KV_EVICT_FIRST, KV_TMA,
                MERGE, MERGE_ROWS, MERGE_BLOCK_S, HAS_KV_START, SPLIT_SPAN, BALANCE,
            )
    else:
        _decode_item(
            pid, q_ptr, k_ptr, v_ptr, k_sf_ptr, v_sf_ptr, k_table_ptr, v_table_ptr, seq_lens_ptr, kv_start_ptr,
            mask_ptr,
            sinks_ptr, logit_scale_ptr, out_scale_ptr, out_ptr, lse_ptr, part_o_ptr, part_lse_ptr, counter_ptr,
            stride_qo, stride_kv, stride_sf, stride_req, stride_lse_t, sizes, fixed_len, window_left,
            logit_factor, out_factor, soft_cap_value, rope_theta, rope_scale, alibi_n, balance_sizes, (0, 0),
            SHAPE, KV_FORMAT, PAGED, SAME_TABLE, HAS_WINDOW, HAS_MASK, HAS_SINKS, LOGIT_PTR, OUT_PTR,
            OUT_FP8, STORE_LSE, ROPE, ALIBI, SOFT_CAP, USE_DOT, PAGING, PREFETCH, KV_EVICT_FIRST, KV_TMA,
            MERGE, MERGE_ROWS, MERGE_BLOCK_S, HAS_KV_START, SPLIT_SPAN, BALANCE,
        )
    if USE_PDL:
        # At the end, not the start: combine programs launched early and parked in gdc_wait made
        # the split launches ~2 us slower on an H100 (lab/notes/decode.md).
        gdc_launch_dependents()


__all__ = ["SPLIT_TUPLES", "decode_split_kernel", "decode_combine_kernel"]
