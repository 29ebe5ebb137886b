"""MLA decode kernel: one program per (request, KV split, block of ``BLOCK_H`` query heads).

Every query head of a request reads the same latent rows ``[ckv(512) | kpe(64)]``, so a program
packs ``BLOCK_H`` heads into the M dim of its tensor-core products and streams its split's keys in
``BLOCK_N`` tiles (page ids gathered per token, so a tile may span pages): ``S = q_nope ckv^T +
q_rope kpe^T``, the online softmax, then ``acc += P ckv`` with the ckv tile already loaded for S
(the values are the keys' first 512 columns: one read of each row serves both products). Like
the decode kernel it writes the final rows when the launch has one split, else a normalised
partial ``(o, lse)`` per split that :func:`~..common.combine.decode_combine_kernel` merges.

Cost model (local sm_90a compiles and the H100 runs recorded in mla/configs.py). BLOCK_H 64
(Hq >= 64) runs on wgmma with 8 warps, which the ``[64, 512]`` float32 accumulator needs (128
registers a thread). Left to itself, Triton 3.6 gives a product whose result reaches another
product (a "chained dot") all 8 warps along its 64 rows, so both warpgroups would compute the whole
score tile (2 x 36 ``m64n16k16`` score wgmmas a 32-key tile): ``2 * 576 + 512`` MACs a (head, key)
instead of ``576 + 512``, 0.30 of the bf16 matmul rate on the H100. ``SPLIT_SCORES`` puts layout
fences after the score products (see ``_mla_tile_scores``): each warpgroup computes half of the
tile's keys (36 wgmmas a tile in all), the softmax reductions cross the warpgroups through shared
memory, and P reaches the P.V product (one ``m64n256k16`` a warpgroup and k-step) through shared
memory. H100: bf16 Hq 128 0.30 -> 0.40-0.42 of the matmul rate with 64-key tiles.

On Hopper, 16-bit caches at BLOCK_H 64 over pages of 16, 32 or 64+ tokens take :mod:`.kernels_gluon` instead
(the same work division, with the copies and the score layout written out in Gluon: 224 against
278 us at Hq 128, 64x4096, on an H100), or its warp-specialised successor :mod:`.kernels_gluon_ws`, which
also takes the fp8-score launches below at BLOCK_H 64 over such pages; this kernel serves every
other launch (fp8 at Hq <= 16 with heads in N, ``KVATTN_GLUON_WS=0``, a launch asking for the LSE)
and the CPU tier.

An fp8 query with an fp8 cache (``QK_FP8``, BLOCK_H 64) takes the scores on fp8 tensor cores
straight from the copied bytes (both operands K-major: the query rows and the cache rows), exact
products accumulated in float32, and converts the tile once, to the float16 P.V operand (exact).
Otherwise fp8 rows convert to float16 for both products; BLOCK_H 16 / 32 run on mma.sync (M < 64)
and are bound by the row reads for 16-bit caches.

Multi-token prediction (``Q_LEN`` tokens a request, 1 to 4): the launcher passes the query, the
output and the LSE as ``Q_LEN * Hq`` token-major rows (row ``r * Hq + h``), which take the place
of the heads in M, so each row tile read serves every token and head (16 heads x 4 tokens fill
the 64-row tile as 64 heads do). Token ``r`` sees keys up to its position ``L - Q_LEN + r``
(:func:`mla_row_ends`): a per-row limit on the score mask, which differs from the split's end only
in a request's last keys. ``Q_LEN == 1`` compiles exactly as before (the mask stays a column mask).

Ragged batches (``BALANCED``, chosen by the plan for launches of several splits): instead of
``num_splits`` equal shares of each request, the programs take units of one chunk length for the
launch, planned from the device-side lengths by every program (:func:`~..common.balance.launch_unit`:
a long request several units, more than ``num_splits`` where the batch is ragged, a short one one;
an equal batch keeps the uniform split). The grid stays the uniform one (host bounds, so a CUDA
graph replays with new lengths), unit ``u``'s partial goes to slot ``u``, and
:func:`~..common.combine.balanced_combine_kernel` merges each request's units
(lab/notes/mla-ragged.md "MLA: the balanced split (design)").

``HEADS_AS_N`` swaps the operands of both products, ``S^T = ckv q_nope^T + kpe q_rope^T`` and
``O^T = ckv^T P^T``: the keys fill wgmma's M (64 rows and more) and the heads are its N (16 is
enough), so few heads need no padding to 64 rows. With fp8 scores at Hq <= 16 this cuts the tensor
work of a key 4x against BLOCK_H 64 (whose padded rows made that path compute-bound); the
softmax state then runs along the columns (``online_softmax_step(..., KEYS_FIRST=True)``) and the
accumulator is transposed once at the end.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common import (
    KV_HALF,
    LOG2E,
    as_mask,
    float16_operand,
    load_kv_tile,
    load_page_ids,
    online_softmax_step,
    softmax_finalize,
    split_bounds,
    token_pages,
)
from ..common.balance import launch_unit


@triton.jit
def mla_row_ends(kv_len, rows, num_rows, Q_LEN: tl.constexpr):
    """Multi-token prediction: the key limit of each row ``rows [M]`` of a request of ``kv_len``
    keys whose ``num_rows = Q_LEN * Hq`` rows are token-major (row ``r * Hq + h``). Token ``r``
    sits at position ``kv_len - Q_LEN + r`` and sees keys ``[0, kv_len - (Q_LEN - 1 - r))``; a
    negative limit (a request shorter than ``Q_LEN``) sees no key. Rows past ``num_rows`` (padding)
    get limits past ``kv_len``, which the caller clips to its split's end."""
    token = rows // (num_rows // Q_LEN)
    return kv_len - (Q_LEN - 1 - token)


@triton.jit
def _mla_tile_scores(kv_ptr, q_nope, q_rope, ids, offs_n, end, row_end, live, qk_scale, stride_kv_p, stride_kv_s,
                     CKV_DIM: tl.constexpr, KPE_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, KV_FORMAT: tl.constexpr,
                     sdt: tl.constexpr, HEADS_AS_N: tl.constexpr, SPLIT_SCORES: tl.constexpr, Q_LEN: tl.constexpr):
    """``(ckv [N, CKV_DIM], s)``: one tile's rows and its base-2 logits ``(q_nope ckv^T + q_rope
    kpe^T) * qk_scale`` as ``s [M, N]``, or transposed, ``s [N, M] = (ckv q_nope^T + ...) * qk_scale``,
    with ``HEADS_AS_N``; -inf for tokens past ``end`` (``Q_LEN > 1``: past each row's own limit
    ``row_end [M]``, at most ``end``). A token of an unusable page id reads as a zero row and keeps
    that row's logit (docs/semantics.md, "Unusable page ids").

    ``SPLIT_SCORES``: the two ``if live:`` blocks are layout fences (``live`` is the loop's own
    condition: true whenever this runs, which the compiler cannot know). Triton 3.6 gives a wgmma
    product whose result reaches another product all the warps along M (``warpsPerTileV3``: a
    chained dot gets ``[num_warps, 1]``), so at 64 rows both warpgroups would compute the whole
    score tile. Its search follows a value's uses into a region but not out through the region's
    ``yield``, so results that leave each product through an ``if`` make both products unchained
    (``[4, 2]``: each warpgroup computes half of N), while the row loads, used in the loop body,
    stay software-pipelined. The ``if`` holds real work (the where / scale), which keeps MLIR from
    folding it into a select. ``tests/ops/mla/test_codegen.py`` pins all of this."""
    page, slot, ok = token_pages(ids, offs_n, offs_n < end, PAGE_SIZE, True)
    row_off = page * stride_kv_p + slot * stride_kv_s  # int64 (token_offsets of the one latent head)
    # One read of the rows: ckv is the keys' first 512 columns and the values. (QK_FP8: the byte
    # tile is copied to shared memory once and feeds the fp8 score wgmma from there; the float16
    # conversion for P.V happens once, after the scores.)
    ckv = load_kv_tile(kv_ptr, kv_ptr, row_off, row_off, ok, 0, CKV_DIM, KV_FORMAT, sdt)
    kpe = load_kv_tile(kv_ptr, kv_ptr, row_off, row_off, ok, CKV_DIM, KPE_DIM, KV_FORMAT, sdt)
    seen = offs_n < end
    if HEADS_AS_N:
        if Q_LEN == 1:
            ok_s = seen[:, None]
        else:
            ok_s = offs_n[:, None] < row_end[None, :]
        s = tl.dot(kpe, tl.trans(q_rope))
    else:
        if Q_LEN == 1:
            ok_s = seen[None, :]
        else:
            ok_s = offs_n[None, :] < row_end[:, None]
        s = tl.dot(q_rope, tl.trans(kpe))
    if SPLIT_SCORES:
        if live:
            s = tl.where(ok_s, s, 0.0)
    if HEADS_AS_N:
        s = tl.dot(ckv, tl.trans(q_nope), s)
    else:
        s = tl.dot(q_nope, tl.trans(ckv), s)
    if SPLIT_SCORES:
        if live:
            s = tl.where(ok_s, s * qk_scale, float("-inf"))
    else:
        s = tl.where(ok_s, s * qk_scale, float("-inf"))
    return ckv, s


@triton.jit
def mla_split_kernel(
    q_ptr,  # [B, Q_LEN * Hq, CKV_DIM + KPE_DIM] query rows [q_nope | q_rope], token-major (last dim contiguous)
    kv_ptr,  # [num_pages, PAGE_SIZE, CKV_DIM + KPE_DIM] latent rows [ckv | kpe] (last dim contiguous)
    table_ptr,  # [B, pages_per_seq] int32 page ids
    seq_lens_ptr,  # [B] int32
    logit_scale_ptr,  # [1] float32 (LOGIT_PTR)
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    out_ptr,  # [B, Q_LEN * Hq, CKV_DIM] bfloat16 (or the query's 16-bit dtype, or float32; last dim contiguous)
    part_o_ptr,  # [num_splits, B, Q_LEN * Hq, CKV_DIM] float32 normalised split outputs (BALANCED: [units, ...])
    part_lse_ptr,  # [num_splits, B, Q_LEN * Hq] float32 split LSEs (base 2; BALANCED: [units, ...])
    lse_ptr,  # [B, Q_LEN * Hq] float32 base-2 LSE (STORE_LSE; row stride 1)
    stride_q_b, stride_q_h, stride_o_b, stride_o_h, stride_kv_p, stride_kv_s, stride_t_b, stride_t_p,
    batch, num_heads, num_splits, num_pages, capacity, stride_lse_b,
    logit_factor, out_factor,
    CKV_DIM: tl.constexpr, KPE_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, H_BLOCKS: tl.constexpr, KV_FORMAT: tl.constexpr, LOGIT_PTR: tl.constexpr,
    OUT_PTR: tl.constexpr, QK_FP8: tl.constexpr, HEADS_AS_N: tl.constexpr, SPLIT_SCORES: tl.constexpr,
    STORE_LSE: tl.constexpr = False, SPLIT_SPAN: tl.constexpr = 0, Q_LEN: tl.constexpr = 1,
    BALANCED: tl.constexpr = False, BLOCK_B: tl.constexpr = 1, MIN_CHUNK: tl.constexpr = 0,
    UNITS_CAP: tl.constexpr = 1,
):
    # Operand type of the products: the cache's 16-bit type, or float16 for fp8 (e4m3 converts to
    # float16 exactly, in one instruction per pair; an fp8 query too). QK_FP8 (fp8 query and cache,
    # raw bytes: KV_FORMAT == KV_FP8): the scores take the fp8 values as they are, P.V float16.
    cdt = kv_ptr.dtype.element_ty if KV_FORMAT == KV_HALF else tl.float16
    sdt = kv_ptr.dtype.element_ty if QK_FP8 else cdt

    # Head blocks vary fastest: the programs reading one request's split run side by side, so the
    # second one finds the rows in L2.
    pid = tl.program_id(0)
    hb = pid % H_BLOCKS
    rest = pid // H_BLOCKS
    if BALANCED:
        # The balanced split (common.balance.launch_unit): program group ``rest`` runs unit ``rest``
        # of a plan every program derives from the lengths; a ragged batch's requests take units
        # of one chunk length (a long request several), an equal batch the uniform split below.
        # Units past the plan's last (a ragged batch needs fewer than the grid holds) read no key
        # and write nothing. BLOCK_N = the tile the chunk rounds to; MIN_CHUNK its least keys.
        live, b, split, n_splits = launch_unit(seq_lens_ptr, rest, batch, capacity, num_splits, MIN_CHUNK, BLOCK_N,
                                               BLOCK_B, UNITS_CAP)
        kv_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), capacity)
        chunk = split_bounds(kv_len, 0, n_splits, BLOCK_N, 0)
        start = split * chunk
        end = tl.where(live, tl.minimum(start + chunk, kv_len), start)
    else:
        split = rest % num_splits
        b = rest // num_splits

        # Lengths clamped into [0, capacity] (capacity: the table row's tokens): a longer one would
        # read past the request's row of the table (lab/notes/robustness.md "Device-side clamps").
        kv_len = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), capacity)
        chunk = split_bounds(kv_len, 0, num_splits, BLOCK_N, SPLIT_SPAN)
        start = split * chunk
        end = tl.minimum(start + chunk, kv_len)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)  # rows: (token, head) pairs with Q_LEN > 1
    head_ok = heads < num_heads
    row_end = end
    if Q_LEN > 1:
        row_end = tl.minimum(mla_row_ends(kv_len, heads, num_heads, Q_LEN), end)
    offs_c = tl.arange(0, CKV_DIM)
    offs_r = CKV_DIM + tl.arange(0, KPE_DIM)
    q_off = b.to(tl.int64) * stride_q_b + heads[:, None].to(tl.int64) * stride_q_h
    q_nope = tl.load(q_ptr + q_off + offs_c[None, :], mask=head_ok[:, None], other=0.0)
    q_rope = tl.load(q_ptr + q_off + offs_r[None, :], mask=head_ok[:, None], other=0.0)
    if KV_FORMAT != KV_HALF and not QK_FP8:
        q_nope = float16_operand(q_nope)
        q_rope = float16_operand(q_rope)
    q_nope = q_nope.to(sdt)
    q_rope = q_rope.to(sdt)

    logit = logit_factor
    if LOGIT_PTR:
        logit = logit * tl.load(logit_scale_ptr)
    qk_scale = logit * LOG2E  # base-2 logits

    table_row = table_ptr + b.to(tl.int64) * stride_t_b
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    if HEADS_AS_N:
        acc = tl.zeros([CKV_DIM, BLOCK_H], dtype=tl.float32)  # transposed: V^T P^T
    else:
        acc = tl.zeros([BLOCK_H, CKV_DIM], dtype=tl.float32)
    # Page ids a tile ahead, carried through the loop: the row loads of a tile then depend on no
    # load of their own iteration, and the pipeliner overlaps them with the previous tile.
    offs_n = start + tl.arange(0, BLOCK_N)
    ids = load_page_ids(table_row, stride_t_p, offs_n, offs_n < end, num_pages, PAGE_SIZE, True)
    for start_n in range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        ckv, s = _mla_tile_scores(kv_ptr, q_nope, q_rope, ids, offs_n, end, row_end, start_n < end, qk_scale,
                                  stride_kv_p, stride_kv_s, CKV_DIM, KPE_DIM, PAGE_SIZE, KV_FORMAT, sdt, HEADS_AS_N,
                                  SPLIT_SCORES, Q_LEN)
        if HEADS_AS_N:
            m_i, l_i, p, alpha = online_softmax_step(m_i, l_i, s, True)
            acc = acc * alpha[None, :] + tl.dot(tl.trans(ckv.to(cdt)), p.to(cdt))
        else:
            m_i, l_i, p, alpha = online_softmax_step(m_i, l_i, s)
            acc = acc * alpha[:, None] + tl.dot(p.to(cdt), ckv.to(cdt))
        offs_n = offs_n + BLOCK_N
        ids = load_page_ids(table_row, stride_t_p, offs_n, offs_n < end, num_pages, PAGE_SIZE, True)

    # One split: the final rows. Several: every split writes a partial (an empty one, o = 0 and
    # lse = -inf, past a short request's active splits), which the combine merges.
    if HEADS_AS_N:
        acc = tl.trans(acc)
    o, lse2 = softmax_finalize(acc, m_i, l_i, l_i, False)
    final = num_splits == 1
    out_mult = out_factor
    if OUT_PTR:
        out_mult = out_mult * tl.load(out_scale_ptr)
    o_off = b.to(tl.int64) * stride_o_b + heads[:, None].to(tl.int64) * stride_o_h + offs_c[None, :]
    tl.store(out_ptr + o_off, (o * out_mult).to(out_ptr.dtype.element_ty), mask=as_mask(head_ok[:, None] & final))
    if STORE_LSE:
        tl.store(lse_ptr + b.to(tl.int64) * stride_lse_b + heads, lse2, mask=as_mask(head_ok & final))
    if BALANCED:  # unit u's partial in slot u (the combine finds a request's units as its programs did)
        partial = (num_splits > 1) & live
        p_row = rest.to(tl.int64) * num_heads + heads
    else:
        partial = num_splits > 1
        p_row = (split.to(tl.int64) * batch + b) * num_heads + heads
    tl.store(part_o_ptr + p_row[:, None] * CKV_DIM + offs_c[None, :], o, mask=as_mask(head_ok[:, None] & partial))
    tl.store(part_lse_ptr + p_row, lse2, mask=as_mask(head_ok & partial))


__all__ = ["mla_row_ends", "mla_split_kernel"]
