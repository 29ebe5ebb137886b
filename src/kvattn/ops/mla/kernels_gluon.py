"""MLA decode for Hopper in Gluon: 16-bit latent pages read by TMA, copies issued as buffers free.

Why a second kernel. The Triton kernel (:mod:`.kernels`) leaves the row copies to Triton
3.6's software pipeliner. The ``[64, 576]`` query and two ``[64, 576]`` row tiles fill 216-224 KB,
so there is room for two buffers only, and the pipeliner issues the copy of tile ``j + 1`` at the
end of iteration ``j`` (after the page-id load it depends on) and waits for it first thing in
iteration ``j + 1``: every tile's load latency is exposed. Gluon (Triton's explicit-layout
language, part of the same package: still no compiler at install) lets the schedule be written
out: the copy of tile ``j + 1`` is issued as soon as the P.V product of tile ``j - 1`` (the last
reader of its buffer) has retired, before the score product of tile ``j``, so it overlaps a whole
tile of work. And the score layout is chosen rather than inferred: each warpgroup computes the
whole ``[64, 64]`` score tile (``m64n64`` wgmmas; the two warpgroups do the same products), so
each holds all of P in the rows it owns in the P.V product and no reduction or P exchange crosses
the warpgroups. H100, bf16, Hq 128 (CUDA-graph replay, L2 flushed; lab/notes/mla.md
"MLA: Gluon kernel with TMA row tiles"): 64x4096 278 -> 224 us, 128x8192 1052 -> 845, 32x16384
560 -> 423 against the Triton kernel.
(The Triton kernel's split score tile, half the keys a warpgroup with the softmax reductions and P
crossing through shared memory, measured 244 / 926 / 415 here.)

Scope: 16-bit caches with a query of the same dtype, ``BLOCK_H = 64`` query heads a program
(Hq >= 64; rows past Hq padded), 64-key tiles, pages of a multiple of 64 tokens or of 16 or 32
(a tile then spans 64 / page pages, copied as one box of ``page`` rows a page into the tile's rows),
whose rows TMA can address as one ``[pages * page, 576]`` view. Every other launch takes
:mod:`.kernels` (the ``KVATTN_GLUON=0`` switch too).

Multi-token prediction (``Q_LEN > 1``): the rows are ``Q_LEN * Hq`` (token, head) pairs,
token-major, as in :mod:`.kernels`; the score mask takes each row's own key limit.

Per tile ``j`` (8 warps; the accumulator ``[64, 512]`` split by columns between the warpgroups):

1. wait for tile ``j``'s copy (an mbarrier a buffer); a request's last tile gets its rows past the
   end zeroed in shared memory (a page's slots past the request may hold anything, NaN too, and
   ``0 * NaN`` is NaN in the product);
2. retire P.V of tile ``j - 1``; a CTA barrier (both warpgroups read that buffer);
3. one thread issues the copy of tile ``j + 1`` into the freed buffer (nine 64-column TMA boxes,
   nine a page over pages smaller than the tile; a page id outside the cache becomes a row past
   the view's end, which TMA reads as zeros);
4. ``S = q_rope kpe^T + q_nope ckv^T`` (A = the query in shared memory);
5. online softmax in registers;
6. ``acc = acc * alpha + P ckv`` issued asynchronously (P from registers), retired in step 2.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

# The shared @triton.jit pieces run inside Gluon kernels as they are (the layouts follow their inputs).
from ..common.gluon_balance import balanced_split_work
from ..common.gluon_compat import cp_async_load, cta_barrier, tma_load
from ..common import LOG2E, load_page_ids, online_softmax_step, softmax_finalize, split_bounds
from .kernels import mla_row_ends


@gluon.jit
def _issue_tile(kv_desc, ckv_buf, kpe_buf, bar, table_row_ptr, stride_t_p, n0, end, num_pages, total_rows,
                PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, CKV_DIM: gl.constexpr, KPE_DIM: gl.constexpr,
                pred):
    """Start the TMA copy of the tile of tokens ``[n0, n0 + BLOCK_N)`` into ``ckv_buf [BLOCK_N,
    CKV_DIM]`` and ``kpe_buf [BLOCK_N, KPE_DIM]``; ``bar`` counts its bytes. A page of at least
    ``BLOCK_N`` tokens holds the whole tile: one box of ``BLOCK_N`` rows a 64-column piece. A
    smaller page (16, 32) holds ``PAGE_SIZE`` of its rows: one box of ``PAGE_SIZE`` rows a page and
    piece, each at its page's row offset in the same buffers (the descriptor's box is ``[PAGE_SIZE,
    64]``; the byte count is the tile's either way). A page id outside the cache, or a page wholly
    past ``end`` (its table entry never read), becomes the row ``total_rows``, past the descriptor's
    end, which TMA reads as zeros: a zero key and value that keep their logit (docs/semantics.md,
    "Unusable page ids")."""
    if PAGE_SIZE < BLOCK_N:
        mbarrier.expect(bar, BLOCK_N * (CKV_DIM + KPE_DIM) * 2, pred=pred)
        for j in gl.static_range(BLOCK_N // PAGE_SIZE):
            tok = n0 + j * PAGE_SIZE
            pid = load_page_ids(table_row_ptr, stride_t_p, tok, pred & (tok < end), num_pages, PAGE_SIZE, True)
            row = gl.where(pid >= 0, pid * PAGE_SIZE, total_rows)
            ckv_rows = ckv_buf.slice(j * PAGE_SIZE, PAGE_SIZE, dim=0)
            for c in gl.static_range(CKV_DIM // 64):
                tma_load(kv_desc, [row, c * 64], bar, ckv_rows.slice(c * 64, 64, dim=1), pred=pred)
            tma_load(kv_desc, [row, CKV_DIM], bar, kpe_buf.slice(j * PAGE_SIZE, PAGE_SIZE, dim=0), pred=pred)
    else:
        pid = load_page_ids(table_row_ptr, stride_t_p, n0, pred & (n0 < end), num_pages, PAGE_SIZE, True)
        ok = pid >= 0
        row = gl.where(ok, pid * PAGE_SIZE + n0 % PAGE_SIZE, total_rows)
        mbarrier.expect(bar, BLOCK_N * (CKV_DIM + KPE_DIM) * 2, pred=pred)
        for c in gl.static_range(CKV_DIM // 64):
            tma_load(kv_desc, [row, c * 64], bar, ckv_buf.slice(c * 64, 64, dim=1), pred=pred)
        tma_load(kv_desc, [row, CKV_DIM], bar, kpe_buf, pred=pred)


# Pieces both Gluon MLA kernels run (this one and the warp-specialised one of kernels_gluon_ws.py).
@gluon.jit
def split_work(seq_lens_ptr, capacity, batch, num_splits, H_BLOCKS: gl.constexpr, BLOCK_N: gl.constexpr,
               SPLIT_SPAN: gl.constexpr, BALANCED: gl.constexpr, MIN_CHUNK: gl.constexpr, BLOCK_B: gl.constexpr,
               UNITS_CAP: gl.constexpr):
    """``(b, hb, split, start, end, num_tiles)``: the program's request, head block and split, and
    the split's keys ``[start, end)`` in ``num_tiles`` tiles of ``BLOCK_N``. Head blocks vary
    fastest: the programs reading one request's split run side by side, so the second finds the
    rows in L2. The request's length is clamped into ``[0, capacity]`` (the table row's tokens;
    lab/notes/robustness.md "Device-side clamps"). ``BALANCED``: a ragged batch's units
    (``common.gluon_balance.balanced_split_work``; ``split`` is then the partial's slot)."""
    if BALANCED:
        b, hb, split, start, end, num_tiles = balanced_split_work(seq_lens_ptr, capacity, batch, num_splits, H_BLOCKS,
                                                                  BLOCK_N, MIN_CHUNK, BLOCK_B, UNITS_CAP)
    else:
        pid = gl.program_id(0)
        hb = pid % H_BLOCKS
        rest = pid // H_BLOCKS
        split = rest % num_splits
        b = rest // num_splits

        kv_len = gl.minimum(gl.maximum(gl.load(seq_lens_ptr + b), 0), capacity)
        chunk = split_bounds(kv_len, 0, num_splits, BLOCK_N, SPLIT_SPAN)
        start = split * chunk
        end = gl.minimum(start + chunk, kv_len)
        num_tiles = gl.maximum(gl.cdiv(end - start, BLOCK_N), 0)
    return b, hb, split, start, end, num_tiles


@gluon.jit
def mtp_row_ends(kv_len, end, hb, num_heads, BLOCK_H: gl.constexpr, Q_LEN: gl.constexpr, layout: gl.constexpr):
    """Multi-token prediction: the key limit ``[BLOCK_H]`` (in ``layout``) of each row of head
    block ``hb`` over the ``num_heads = Q_LEN * Hq`` token-major rows (:func:`.kernels.mla_row_ends`),
    at most the split's ``end``."""
    rows = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=layout)
    return gl.minimum(mla_row_ends(kv_len, rows, num_heads, Q_LEN), end)


@gluon.jit
def stage_query(q_ptr, qn_smem, qr_smem, b, hb, num_heads, stride_q_b, stride_q_h, CKV_DIM: gl.constexpr,
                KPE_DIM: gl.constexpr, BLOCK_H: gl.constexpr, ld_layout: gl.constexpr):
    """The head block's query rows into shared memory, ``qn_smem [BLOCK_H, CKV_DIM]`` and
    ``qr_smem [BLOCK_H, KPE_DIM]``, in 64-column pieces (rows past Hq read as 0), visible to the
    calling threads' wgmmas when it returns.

    Every piece is one ``cp.async`` group member, all in flight at once: loaded through registers,
    each piece's store waited for its load and the compiler put a barrier between the pieces, so a
    program paid five serial round trips to memory before its first score product (the query of
    64 heads is as many bytes as a key tile).
    See lab/notes/mla-program-ends.md "What one program pays"."""
    offs_qh = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_layout))
    head_ok = (offs_qh < num_heads)[:, None]
    for c in gl.static_range((CKV_DIM + KPE_DIM) // 64):
        offs_qd = c * 64 + gl.arange(0, 64, layout=gl.SliceLayout(0, ld_layout))
        q_off = b.to(gl.int64) * stride_q_b + offs_qh[:, None].to(gl.int64) * stride_q_h + offs_qd[None, :]
        if c * 64 < CKV_DIM:
            cp_async_load(qn_smem.slice(c * 64, 64, dim=1), q_ptr + q_off, mask=head_ok)
        else:
            cp_async_load(qr_smem, q_ptr + q_off, mask=head_ok)
    async_copy.commit_group()
    async_copy.wait_group(0)
    fence_async_shared()
    cta_barrier()


@gluon.jit
def logit_scale2(logit_factor, logit_scale_ptr, LOGIT_PTR: gl.constexpr):
    """The scores' factor to base-2 logits: ``logit_factor`` (times ``*logit_scale_ptr`` with
    ``LOGIT_PTR``) times log2(e)."""
    logit = logit_factor
    if LOGIT_PTR:
        logit = logit * gl.load(logit_scale_ptr)
    return logit * LOG2E


@gluon.jit
def store_rows(o_acc, m_i, l_i, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch, num_heads,
               num_splits, stride_o_b, stride_o_h, out_factor, COL0: gl.constexpr, COLS: gl.constexpr,
               CKV_DIM: gl.constexpr, BLOCK_H: gl.constexpr, OUT_PTR: gl.constexpr, STORE_LSE: gl.constexpr,
               o_layout: gl.constexpr, BALANCED: gl.constexpr = False, stage=None):
    """Write the output columns ``[COL0, COL0 + COLS)`` of the head block's rows from the
    accumulator ``o_acc [BLOCK_H, COLS]`` (row max ``m_i``, row sum ``l_i``): the final output
    (one split), or the normalised split partial and (``STORE_LSE``) its base-2 LSE, which the
    decode family's combine kernel merges (an empty split: o = 0, lse = -inf). ``BALANCED``
    (``balanced_split_work``): ``split`` is the partial's slot, its unit (none past the partials:
    a unit past the plan's last), which ``combine.balanced_combine_kernel`` merges.

    ``stage``: free bfloat16 shared memory ``[BLOCK_H, COLS]``, the calling warpgroup's alone:
    bfloat16 final rows go through it (:func:`store_staged`), and so do bfloat16 partials (the plan
    gives a launch with bfloat16 output bfloat16 partials: half the bytes every program writes at
    its end and the combine reads; lab/notes/mla-program-ends.md); float32 rows (twice its bytes)
    and float32 partials are stored from the accumulator's layout."""
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    o, lse2 = softmax_finalize(o_acc, gl.convert_layout(m_i, o_rows), gl.convert_layout(l_i, o_rows), 0.0, False)
    heads = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=o_rows)
    head_ok = heads < num_heads
    offs_c = COL0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, o_layout))
    final = num_splits == 1
    out_mult = out_factor
    if OUT_PTR:
        out_mult = out_mult * gl.load(out_scale_ptr)
    STAGED: gl.constexpr = stage is not None and out_ptr.dtype.element_ty == gl.bfloat16
    # (A launch of one split passes ``out`` for the partials it never writes: a bfloat16 pointer
    # then is no partial buffer, and a kernel without a stage stores nothing through it.)
    PART16: gl.constexpr = STAGED and part_o_ptr.dtype.element_ty == gl.bfloat16
    if BALANCED:
        partial = (num_splits > 1) & (split < batch * num_splits)
        p_row0 = split.to(gl.int64) * num_heads + hb * BLOCK_H
    else:
        partial = num_splits > 1
        p_row0 = (split.to(gl.int64) * batch + b) * num_heads + hb * BLOCK_H
    if not STAGED:
        o_off = b.to(gl.int64) * stride_o_b + heads[:, None].to(gl.int64) * stride_o_h + offs_c[None, :]
        gl.store(out_ptr + o_off, (o * out_mult).to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & final)
    elif PART16:
        # The final rows or the partial, through the one stage (a launch writes one kind).
        row0 = gl.where(final, b.to(gl.int64) * stride_o_b + (hb * BLOCK_H).to(gl.int64) * stride_o_h,
                        p_row0 * CKV_DIM) + COL0
        n_rows = gl.where(final | partial, num_heads - hb * BLOCK_H, 0)
        store_staged((o * gl.where(final, out_mult, 1.0)).to(gl.bfloat16), stage,
                     gl.where(final, out_ptr, part_o_ptr), row0, gl.where(final, stride_o_h, CKV_DIM), n_rows)
    elif final:
        store_staged((o * out_mult).to(out_ptr.dtype.element_ty), stage, out_ptr,
                     b.to(gl.int64) * stride_o_b + (hb * BLOCK_H).to(gl.int64) * stride_o_h + COL0, stride_o_h,
                     num_heads - hb * BLOCK_H)
    p_row = p_row0 + gl.arange(0, BLOCK_H, layout=o_rows)
    if not PART16:
        gl.store(part_o_ptr + p_row[:, None] * CKV_DIM + offs_c[None, :], o, mask=head_ok[:, None] & partial)
    if STORE_LSE:
        gl.store(part_lse_ptr + p_row, lse2, mask=head_ok & partial)


@gluon.jit
def store_staged(x, stage, ptr, row0, row_stride, n_rows):
    """``x [R, C]`` (an accumulator's layout) to the global rows ``ptr + row0 + r * row_stride +
    [0, C)`` for ``r < n_rows``, through ``stage`` (free shared memory ``[R, C]`` of ``x``'s dtype,
    the calling warpgroup's alone): a warp writes a row's contiguous bytes, 16 a thread, where
    each store from the accumulator's layout writes 16-byte pieces of 8 rows."""
    R: gl.constexpr = x.shape[0]
    C: gl.constexpr = x.shape[1]
    stage.store(x)
    cta_barrier()
    rd: gl.constexpr = gl.BlockedLayout([1, 128 // x.dtype.primitive_bitwidth], [1, 32], [gl.num_warps(), 1], [1, 0])
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, rd))
    cols = gl.arange(0, C, layout=gl.SliceLayout(0, rd))
    off = row0 + rows.to(gl.int64)[:, None] * row_stride + cols[None, :]
    gl.store(ptr + off, stage.load(rd), mask=(rows < n_rows)[:, None])


@gluon.jit
def store_final_lse(m_i, l_i, lse_ptr, b, hb, num_heads, num_splits, stride_lse_b, BLOCK_H: gl.constexpr,
                    o_layout: gl.constexpr):
    """``return_lse``: the head block's base-2 LSE ``m + log2(l)`` into ``lse [B, Hq]`` when the
    launch has one split (-inf for a row without keys); with several, the combine kernel stores it."""
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    m = gl.convert_layout(m_i, o_rows)
    den = gl.convert_layout(l_i, o_rows)
    lse2 = gl.where(den > 0, m + gl.log2(gl.where(den > 0, den, 1.0)), float("-inf"))
    heads = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=o_rows)
    gl.store(lse_ptr + b.to(gl.int64) * stride_lse_b + heads, lse2, mask=(heads < num_heads) & (num_splits == 1))


@gluon.jit
def mla_gluon_kernel(
    q_ptr,  # [B, Q_LEN * Hq, CKV_DIM + KPE_DIM] query rows [q_nope | q_rope], token-major (last dim contiguous)
    kv_desc,  # TMA descriptor of the rows as [num_pages * PAGE_SIZE, CKV_DIM + KPE_DIM], box [min(PAGE_SIZE, 64), 64]
    table_ptr,  # [B, pages_per_seq] int32 page ids
    seq_lens_ptr,  # [B] int32
    logit_scale_ptr,  # [1] float32 (LOGIT_PTR)
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    out_ptr,  # [B, Q_LEN * Hq, CKV_DIM] the query's 16-bit dtype (last dim contiguous)
    part_o_ptr,  # [num_splits, B, Q_LEN * Hq, CKV_DIM] float32 normalised split outputs (BALANCED: [units, ...])
    part_lse_ptr,  # [num_splits, B, Q_LEN * Hq] float32 split LSEs (base 2; BALANCED: [units, ...])
    lse_ptr,  # [B, Q_LEN * Hq] float32 base-2 LSE (STORE_LSE; row stride 1)
    stride_q_b, stride_q_h, stride_o_b, stride_o_h, stride_t_b, stride_t_p,
    batch, num_heads, num_splits, num_pages, capacity, stride_lse_b,
    logit_factor, out_factor,
    CKV_DIM: gl.constexpr, KPE_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr, H_BLOCKS: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr,
    STORE_LSE: gl.constexpr = False, SPLIT_SPAN: gl.constexpr = 0, Q_LEN: gl.constexpr = 1,
    BALANCED: gl.constexpr = False, BLOCK_B: gl.constexpr = 1, MIN_CHUNK: gl.constexpr = 0,
    UNITS_CAP: gl.constexpr = 1,
):
    # A tile inside one page, or over whole pages (_issue_tile).
    gl.static_assert(PAGE_SIZE % BLOCK_N == 0 or BLOCK_N % PAGE_SIZE == 0)
    dt: gl.constexpr = q_ptr.dtype.element_ty
    # Layouts (8 warps): S [64, BLOCK_N] whole in each warpgroup ([8, 1]: m64n64, both warpgroups
    # compute it); O [64, 512] split by columns ([4, 2]: m64n256 a warpgroup).
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, CKV_DIM // 2, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0])
    row_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    b, hb, split, start, end, num_tiles = split_work(seq_lens_ptr, capacity, batch, num_splits, H_BLOCKS, BLOCK_N,
                                                     SPLIT_SPAN, BALANCED, MIN_CHUNK, BLOCK_B, UNITS_CAP)
    total_rows = num_pages * PAGE_SIZE
    row_end = end
    if Q_LEN > 1:  # (rows are (token, head) pairs: each token's own key limit)
        kv_len = gl.minimum(gl.maximum(gl.load(seq_lens_ptr + b), 0), capacity)
        row_end = mtp_row_ends(kv_len, end, hb, num_heads, BLOCK_H, Q_LEN, gl.SliceLayout(1, s_layout))

    qn_smem = gl.allocate_shared_memory(dt, [BLOCK_H, CKV_DIM], row_smem)
    qr_smem = gl.allocate_shared_memory(dt, [BLOCK_H, KPE_DIM], row_smem)
    ckv_smem = gl.allocate_shared_memory(dt, [2, BLOCK_N, CKV_DIM], row_smem)
    kpe_smem = gl.allocate_shared_memory(dt, [2, BLOCK_N, KPE_DIM], row_smem)
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    mbarrier.init(bars.index(1), count=1)

    table_row = table_ptr + b.to(gl.int64) * stride_t_b
    # The first two tiles' copies go out before the query is even read.
    _issue_tile(kv_desc, ckv_smem.index(0), kpe_smem.index(0), bars.index(0), table_row, stride_t_p, start,
                end, num_pages, total_rows, PAGE_SIZE, BLOCK_N, CKV_DIM, KPE_DIM, num_tiles > 0)
    _issue_tile(kv_desc, ckv_smem.index(1), kpe_smem.index(1), bars.index(1), table_row, stride_t_p,
                start + BLOCK_N, end, num_pages, total_rows, PAGE_SIZE, BLOCK_N, CKV_DIM, KPE_DIM, num_tiles > 1)

    stage_query(q_ptr, qn_smem, qr_smem, b, hb, num_heads, stride_q_b, stride_q_h, CKV_DIM, KPE_DIM, BLOCK_H,
                ld_layout)
    qk_scale = logit_scale2(logit_factor, logit_scale_ptr, LOGIT_PTR)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_layout))
    # The accumulator rides through the loop as an in-flight wgmma result (retired each tile).
    acc = warpgroup_mma_init(gl.zeros([BLOCK_H, CKV_DIM], gl.float32, layout=o_layout))
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    offs_sn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    for j in range(0, num_tiles):
        buf = j % 2
        n0 = start + j * BLOCK_N
        mbarrier.wait(bars.index(buf), (j // 2) & 1)
        ckv_buf = ckv_smem.index(buf)
        kpe_buf = kpe_smem.index(buf)
        if n0 + BLOCK_N > end:
            # The last tile: zero its rows past the request (they may hold NaN; P is 0 there, but
            # 0 * NaN is NaN). Only the values (ckv) matter: the scores there are set to -inf.
            offs_r = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld_layout))
            for c in gl.static_range(CKV_DIM // 64):
                part = ckv_buf.slice(c * 64, 64, dim=1)
                rows = part.load(ld_layout)
                part.store(gl.where((offs_r < end)[:, None], rows, 0.0))
            fence_async_shared()
            cta_barrier()
        # P.V of the previous tile retires; then neither warpgroup reads its buffer or P again.
        acc_t = warpgroup_mma_wait(0, deps=[acc])
        cta_barrier()
        # Tile j + 1 into the freed buffer (tiles 0 and 1 went out before the loop).
        issue = (j >= 1) & (j + 1 < num_tiles)
        _issue_tile(kv_desc, ckv_smem.index(1 - buf), kpe_smem.index(1 - buf), bars.index(1 - buf), table_row,
                    stride_t_p, n0 + BLOCK_N, end, num_pages, total_rows, PAGE_SIZE, BLOCK_N, CKV_DIM, KPE_DIM, issue)
        s = warpgroup_mma(qr_smem, kpe_buf.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(qn_smem, ckv_buf.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        if Q_LEN == 1:
            valid = (n0 + offs_sn) < end
            s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
        else:
            s = gl.where((n0 + offs_sn)[None, :] < row_end[:, None], s * qk_scale, float("-inf"))
        m_i, l_i, p, alpha = online_softmax_step(m_i, l_i, s)
        # Each warpgroup holds all of P, in the rows it owns in the P.V product: no exchange.
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))
        p_op = gl.convert_layout(p.to(dt), p_layout)
        acc = warpgroup_mma(p_op, ckv_buf, acc_t * alpha_o[:, None], is_async=True)
    acc_t = warpgroup_mma_wait(0, deps=[acc])
    mbarrier.invalidate(bars.index(0))
    mbarrier.invalidate(bars.index(1))

    # One split: the final rows. Several: every split writes a partial, which the decode
    # family's combine kernel merges.
    store_rows(acc_t, m_i, l_i, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch, num_heads,
               num_splits, stride_o_b, stride_o_h, out_factor, 0, CKV_DIM, CKV_DIM, BLOCK_H, OUT_PTR, True, o_layout,
               BALANCED)
    if STORE_LSE:
        store_final_lse(m_i, l_i, lse_ptr, b, hb, num_heads, num_splits, stride_lse_b, BLOCK_H, o_layout)
