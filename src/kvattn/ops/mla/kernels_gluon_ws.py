"""MLA decode for Hopper in Gluon, warp-specialised: a copy warp and two warpgroups on a seesaw.

Why another kernel. :mod:`.kernels_gluon` runs both warpgroups in lock step on one 64-key tile at a
time: each computes the whole ``[64, 64]`` score tile (the two do the same work, 2 x 576 + 512
multiply-adds a (head, key) instead of 576 + 512), and the tensor cores idle while the softmax
runs between the score product and the P.V product. Here the work of two consecutive tiles ``A``
and ``B`` is divided so that neither happens (lab/notes/mla.md, "MLA: seesaw (warp-specialised
Gluon kernel)"):

* warpgroup 0 ("left") owns output columns ``[0, 256)`` and computes the scores of ``A``;
* warpgroup 1 ("right") owns columns ``[256, 512)`` and computes the scores of ``B``;
* each multiplies both tiles' probabilities with its half of both tiles' values, the other
  warpgroup's P arriving through shared memory.

The right warpgroup issues S_B once S_A is issued, so the tensor cores run S_A, then S_B while
the left softmax runs, then the four half-width P.V products while the right softmax runs, and
the next pair's S_A queues behind them. Each warpgroup's tensor work a pair is one score tile and
two half P.V tiles, the same as the other's. A fifth partition, one
warp, issues the TMA copies of the latent rows.

Shared memory (227 KB a program): the query (72 KB), two row buffers of 64 rows x 576 (144 KB,
one a tile of the pair), one ``[64, 64]`` P buffer (8 KB) used in turn by both warpgroups, and
the rows' maxima and sums. Two buffers are all that fit, so the next pair's copies start as parts
of a buffer fall free: each buffer has three parts with their own ``full`` / ``empty`` barriers,
the rope columns (read by one score product), the left and the right 256 columns (read by a score
product and one warpgroup's P.V). A score product takes its parts in the order they arrive.

Per pair (``m``: the running row max in base-2 logits, the same in both warpgroups; ``l_0``,
``l_1``: the row sums of the left's and the right's P, relative to ``m``):

left                                            right
S_A = q k_A^T                                   S_B = q k_B^T (issued after S_A)
m_A = max(m, rowmax S_A), P_A = 2^(S_A - m_A)
publish m_A and P_A (the P buffer)   ------>    O_R = O_R 2^(m - m_A) + P_A V_A[:, 256:]
O_L = O_L 2^(m - m_A) + P_A V_A[:, :256]        m_B = max(m_A, rowmax S_B), P_B = 2^(S_B - m_B)
                                     <------    publish m_B and P_B (the P buffer)
g = 2^(m_A - m_B): O_L = O_L g + P_B V_B[:, :256]   O_R = O_R g + P_B V_B[:, 256:]

(The right warpgroup reads P_A into registers first, so P_B may overwrite it at once.)
Every P.V product retires before the loop's back edge: one in flight across it made ptxas
serialise all the kernel's wgmmas.

A pair past the split's end for ``B`` (an odd tile count) loads rows of page "-1" (zeros) and
masks them, so every pair has two tiles. At the end the sums ``l_0 + l_1`` are exchanged; each
warpgroup writes its half of the rows (the final rows, or a normalised split partial and, left,
the LSE, merged by the decode family's combine kernel as for the other MLA kernels).

Rows of a request's last tile past its end may hold anything (NaN too; ``0 * NaN`` is NaN in a
product), so each warpgroup zeroes its own value columns of those rows before its P.V product
(after every score product that reads them). A page id outside the cache becomes a row past the
TMA view's end, read as zeros: a zero key and value that keep their logit (docs/semantics.md).

e4m3 query and cache (the same kernel, its ``FP8`` form; lab/notes/mla.md "MLA: fp8 on the
seesaw"). The tiles are half the bytes (64-byte swizzled rows: a 64-column box is 64 bytes, so
the copy warp is unchanged) and the score products run on e4m3 wgmmas straight from the copied
bytes (both operands K-major). P.V stays 16-bit (P in e4m3 missed the precision bar): e4m3 wgmma
wants a K-major B operand and the values are MN-major, so each warpgroup converts its own value
half of each tile to float16 (exact) in shared memory, rows past the request's end written as
zeros (which replaces the 16-bit form's in-place zeroing), and releases the byte part as soon as
it is converted: the copies of the next pair start earlier than in the 16-bit form. The left
converts into one buffer, A's half while S_A runs and B's while the right's softmax runs (it waits
for P_B then anyway); the right converts both its halves into two buffers while S_B runs. Shared
memory 214 KB (the query 36, rows 72, three converted halves 96, P 8, row vectors 2).

Scope: 16-bit caches with a query of the same dtype (Hq >= 33 in the launcher's tables), or an
e4m3 query over an e4m3 cache (Hq >= 17), 64 query heads a program (rows past Hq padded), pages of
a multiple of 64 tokens or of 16 or 32 addressed as one ``[pages * page, 576]`` TMA view, as
:mod:`.kernels_gluon`. Over pages smaller than a tile the copy warp copies each part page by page
(one box of ``page`` rows a page into the part's rows), the page ids of a pair one a lane
(:func:`_copy_pages`). The output is the 16-bit query's dtype, bfloat16 for e4m3.

Multi-token prediction (``Q_LEN > 1``): the rows are ``Q_LEN * Hq`` (token, head) pairs,
token-major, as in :mod:`.kernels`; both warpgroups mask their scores with each row's own key
limit (:func:`.kernels_gluon.mtp_row_ends`), which differs from the split's end only in a request's last
keys. ``Q_LEN == 1`` compiles as the one-token kernel always did.

The kernel has no timing switch: ``benchmarks/mla_ws_floors.py`` builds its floors (no copies,
no P.V, no scores, no value conversion) from a patched copy of this source.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..common.gluon_compat import cta_barrier, smem_view, tma_load
from ..common.gluon_dequant import f16_words, words_view
from ..common import load_page_ids, online_softmax_step
from .kernels_gluon import logit_scale2, mtp_row_ends, split_work, stage_query, store_rows

# Barrier slots (one [N_BARS, 1] allocation). full / empty come per buffer (0: tile A, 1: tile B)
# and per part: K = the rope columns, L / R = value columns [0, 256) / [256, 512).
BAR_Q = gl.constexpr(0)  # the query is in shared memory (left -> right)
FULL_K = gl.constexpr(1)
FULL_L = gl.constexpr(3)
FULL_R = gl.constexpr(5)
EMPTY_K = gl.constexpr(7)
EMPTY_L = gl.constexpr(9)
EMPTY_R = gl.constexpr(11)
BAR_MA = gl.constexpr(13)  # m_A and P_A published (left -> right)
BAR_PB = gl.constexpr(14)  # m_B and P_B published (right -> left)
BAR_SA = gl.constexpr(15)  # S_A issued (left -> right: S_B waits for it)
BAR_DONE = gl.constexpr(16)  # both warpgroups past their last read of the row maxima (both)
BAR_L = gl.constexpr(17)  # the row sums exchanged at the end (both)
N_BARS = gl.constexpr(18)
# Row vectors in shared memory: m_A and m_B, then (after BAR_DONE) the left's and the right's row
# sums in the same two slots.
X_MA = gl.constexpr(0)
X_MB = gl.constexpr(1)
N_X = gl.constexpr(2)

# Registers: the kernel is compiled for 168 a thread (3 warpgroups: 168 x 384 <= 65536); the copy
# warp's warpgroup gives back all but 24, which the two warpgroups on the tensor cores take (240
# each: the [64, 256] float32 accumulator half, a [64, 64] score tile, P in two forms).
MAXNREG = gl.constexpr(168)
RIGHT_REGS = gl.constexpr(240)
COPY_REGS = gl.constexpr(24)
NUM_WARPS = gl.constexpr(4)
# Registers of a [64, 64k] shared-memory tile in one partition's 4 warps (query staging, tail zeroing).
LD_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [NUM_WARPS.value, 1], [1, 0]))
# The same for the fp8 kernel's [64, 64] byte pieces (query staging, value conversion): 16 bytes a
# thread a row, four threads a 64-byte row.
CV_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [NUM_WARPS.value, 1], [1, 0]))
CW_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 4], [8, 4], [NUM_WARPS.value, 1], [1, 0]))  # (CV_LAYOUT in words)
# The fp8 form's float16 value buffers (and P): 128-byte swizzled rows of 16-bit values.
HALF_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
# A row vector of a wgmma accumulator, once per lane of the quad that holds its row: [64, 4], row r
# in the lanes and registers that hold row r of the accumulator (reduced along its columns, the four
# lanes of a quad hold the same value), column = the lane's place in its quad. Stored so, each word
# of a row exchange is written by exactly one thread and read back by the thread of the same place in
# the other warpgroup: compute-sanitizer's racecheck follows the barrier and mbarrier ordering of such
# an exchange, and not of one whose four lanes store the same word (lab/notes/robustness.md
# "compute-sanitizer over every kernel family").
QUAD_LAYOUT = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[8, 0]], lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]],
    block_bases=[], shape=[64, 4]))


@gluon.constexpr_function
def _acc_layout(cols, k=16):
    """The layout of one warpgroup's wgmma accumulator ``[64, cols]`` (m64n``cols``k``k``: 16 for
    16-bit operands, 32 for e4m3)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS.value, 1], instr_shape=[16, cols, k])


@gluon.jit
def _publish_rows(x_smem, slot: gl.constexpr, v):
    """Row vector ``v [64]`` (a reduced accumulator row layout) into slot ``slot`` of ``x_smem``,
    one word a lane (see ``QUAD_LAYOUT``); the caller orders it before the other warpgroup's read."""
    quads = gl.convert_layout(v, gl.SliceLayout(1, QUAD_LAYOUT))  # (the same registers: no data moves)
    x_smem.slice(slot * 64, 64).store(gl.zeros([64, 4], gl.float32, QUAD_LAYOUT) + gl.expand_dims(quads, 1))


@gluon.jit
def _read_rows(x_smem, slot: gl.constexpr, x_layout: gl.constexpr):
    """The row vector the other warpgroup published in ``slot``: its four copies a row (equal) read
    by the lanes that wrote them there, folded within the quad."""
    return gl.convert_layout(gl.max(x_smem.slice(slot * 64, 64).load(QUAD_LAYOUT), axis=1), x_layout)


@gluon.jit
def _tile_row(table_row, stride_t_p, n0, end, num_pages, total_rows, PAGE_SIZE: gl.constexpr):
    """The first row of the tile of tokens ``[n0, n0 + 64)`` (inside one page) in the ``[pages *
    page, 576]`` view. A token past ``end`` or an id outside ``[0, num_pages)`` gives the row
    ``total_rows``, past the view's end, which TMA reads as zeros (an unusable id: a zero key and
    value that keep their logit, docs/semantics.md "Unusable page ids")."""
    pid = load_page_ids(table_row, stride_t_p, n0, n0 < end, num_pages, PAGE_SIZE, True)
    return gl.where(pid >= 0, pid * PAGE_SIZE + n0 % PAGE_SIZE, total_rows)


@gluon.jit
def _copy_part(kv_desc, dst, bar_full, bar_empty, ph, row, COL0: gl.constexpr, COLS: gl.constexpr,
               BLOCK_N: gl.constexpr):
    """Wait until the part ``dst [BLOCK_N, COLS]`` of a buffer is free (``bar_empty``, parity
    ``ph ^ 1``: a fresh barrier passes), then copy columns ``[COL0, COL0 + COLS)`` of rows
    ``row ..`` into it in 64-column boxes, ``bar_full`` counting the bytes."""
    mbarrier.wait(bar_empty, ph ^ 1)
    mbarrier.expect(bar_full, BLOCK_N * COLS * dst.dtype.primitive_bitwidth // 8)
    for c in gl.static_range(COLS // 64):
        tma_load(kv_desc, [row, COL0 + c * 64], bar_full, dst.slice(c * 64, 64, dim=1))


@gluon.jit
def _pair_rows(table_row, stride_t_p, n0, end, num_pages, total_rows, offs, PAGE_SIZE: gl.constexpr):
    """The first row of each page of the tokens ``[n0, n0 + 2 * 64)`` (a pair of tiles, pages
    smaller than a tile) in the ``[pages * page, 576]`` view, one a lane (``offs``: the pages'
    places in the pair, in a layout over the copy warp's lanes): a page wholly past ``end`` (its
    table entry never read) or an id outside ``[0, num_pages)`` gives the row ``total_rows``, past
    the view's end, which TMA reads as zeros (docs/semantics.md "Unusable page ids"). One load a
    pair, kept in one register a lane: the copy warp's 24 registers hold no four ids a tile."""
    ok = n0 + offs * PAGE_SIZE < end
    pid = gl.load(table_row + (n0 // PAGE_SIZE + offs) * stride_t_p, mask=ok, other=-1)
    return gl.where((pid >= 0) & (pid < num_pages), pid * PAGE_SIZE, total_rows)


@gluon.jit
def _copy_part_pages(kv_desc, dst, bar_full, bar_empty, ph, rows, offs, FIRST: gl.constexpr, COL0: gl.constexpr,
                     COLS: gl.constexpr, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr):
    """:func:`_copy_part` for pages smaller than a tile (16, 32 tokens): the part ``dst [BLOCK_N,
    COLS]`` of a tile as one box of ``PAGE_SIZE`` rows a page and 64-column piece, at the page's
    row offset in ``dst`` (the descriptor's box is ``[PAGE_SIZE, 64]``; the byte count is the
    part's). The tile's pages are entries ``FIRST ..`` of the pair's ``rows``
    (:func:`_pair_rows`), each taken out of its lane as its boxes go."""
    mbarrier.wait(bar_empty, ph ^ 1)
    mbarrier.expect(bar_full, BLOCK_N * COLS * dst.dtype.primitive_bitwidth // 8)
    for j in gl.static_range(BLOCK_N // PAGE_SIZE):
        row = gl.sum(gl.where(offs == FIRST + j, rows, 0), 0)
        part = dst.slice(j * PAGE_SIZE, PAGE_SIZE, dim=0)
        for c in gl.static_range(COLS // 64):
            tma_load(kv_desc, [row, COL0 + c * 64], bar_full, part.slice(c * 64, 64, dim=1))


@gluon.jit
def _copy_pages(kv_desc, ckv_smem, kpe_smem, bars, table_row, stride_t_p, start, end, num_pairs, num_pages,
                total_rows, CKV_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
    """:func:`_copy_partition` for pages smaller than a tile: the same parts in the same order,
    each copied page by page (:func:`_copy_part_pages`), the page ids one pair ahead."""
    HALF: gl.constexpr = CKV_DIM // 2
    PAGES: gl.constexpr = BLOCK_N // PAGE_SIZE  # pages a tile (A's: entries [0, PAGES), B's: [PAGES, 2 PAGES))
    lanes: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    offs = gl.arange(0, 2 * PAGES, layout=lanes)
    rows = _pair_rows(table_row, stride_t_p, start, end, num_pages, total_rows, offs, PAGE_SIZE)
    for i in range(num_pairs):
        ph = i & 1
        next_rows = _pair_rows(table_row, stride_t_p, start + (2 * i + 2) * BLOCK_N, end, num_pages, total_rows,
                               offs, PAGE_SIZE)
        ckv_a = ckv_smem.index(0)
        ckv_b = ckv_smem.index(1)
        _copy_part_pages(kv_desc, kpe_smem.index(0), bars.index(FULL_K), bars.index(EMPTY_K), ph, rows, offs, 0,
                         CKV_DIM, 64, BLOCK_N, PAGE_SIZE)
        _copy_part_pages(kv_desc, kpe_smem.index(1), bars.index(FULL_K + 1), bars.index(EMPTY_K + 1), ph, rows, offs,
                         PAGES, CKV_DIM, 64, BLOCK_N, PAGE_SIZE)
        _copy_part_pages(kv_desc, ckv_a.slice(0, HALF, dim=1), bars.index(FULL_L), bars.index(EMPTY_L), ph, rows,
                         offs, 0, 0, HALF, BLOCK_N, PAGE_SIZE)
        _copy_part_pages(kv_desc, ckv_a.slice(HALF, HALF, dim=1), bars.index(FULL_R), bars.index(EMPTY_R), ph, rows,
                         offs, 0, HALF, HALF, BLOCK_N, PAGE_SIZE)
        _copy_part_pages(kv_desc, ckv_b.slice(0, HALF, dim=1), bars.index(FULL_L + 1), bars.index(EMPTY_L + 1), ph,
                         rows, offs, PAGES, 0, HALF, BLOCK_N, PAGE_SIZE)
        _copy_part_pages(kv_desc, ckv_b.slice(HALF, HALF, dim=1), bars.index(FULL_R + 1), bars.index(EMPTY_R + 1),
                         ph, rows, offs, PAGES, HALF, HALF, BLOCK_N, PAGE_SIZE)
        rows = next_rows


@gluon.jit
def _copy_partition(kv_desc, ckv_smem, kpe_smem, bars, table_row, stride_t_p, start, end, num_pairs, num_pages,
                    total_rows, CKV_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):
    """The copy warp: per pair, the parts of tiles A (buffer 0) and B (buffer 1) in the order the
    warpgroups free them (the rope parts after the score products, A's values mid-pair, B's at
    the pair's end, see the module docstring); page ids one pair ahead. Pages smaller than a tile
    take :func:`_copy_pages`."""
    if PAGE_SIZE < BLOCK_N:
        _copy_pages(kv_desc, ckv_smem, kpe_smem, bars, table_row, stride_t_p, start, end, num_pairs, num_pages,
                    total_rows, CKV_DIM, PAGE_SIZE, BLOCK_N)
    else:
        HALF: gl.constexpr = CKV_DIM // 2
        row_a = _tile_row(table_row, stride_t_p, start, end, num_pages, total_rows, PAGE_SIZE)
        row_b = _tile_row(table_row, stride_t_p, start + BLOCK_N, end, num_pages, total_rows, PAGE_SIZE)
        for i in range(num_pairs):
            ph = i & 1
            n_next = start + (2 * i + 2) * BLOCK_N
            next_a = _tile_row(table_row, stride_t_p, n_next, end, num_pages, total_rows, PAGE_SIZE)
            next_b = _tile_row(table_row, stride_t_p, n_next + BLOCK_N, end, num_pages, total_rows, PAGE_SIZE)
            ckv_a = ckv_smem.index(0)
            ckv_b = ckv_smem.index(1)
            _copy_part(kv_desc, kpe_smem.index(0), bars.index(FULL_K), bars.index(EMPTY_K), ph, row_a, CKV_DIM, 64,
                       BLOCK_N)
            _copy_part(kv_desc, kpe_smem.index(1), bars.index(FULL_K + 1), bars.index(EMPTY_K + 1), ph, row_b, CKV_DIM,
                       64, BLOCK_N)
            _copy_part(kv_desc, ckv_a.slice(0, HALF, dim=1), bars.index(FULL_L), bars.index(EMPTY_L), ph, row_a, 0,
                       HALF, BLOCK_N)
            _copy_part(kv_desc, ckv_a.slice(HALF, HALF, dim=1), bars.index(FULL_R), bars.index(EMPTY_R), ph, row_a,
                       HALF, HALF, BLOCK_N)
            _copy_part(kv_desc, ckv_b.slice(0, HALF, dim=1), bars.index(FULL_L + 1), bars.index(EMPTY_L + 1), ph,
                       row_b, 0, HALF, BLOCK_N)
            _copy_part(kv_desc, ckv_b.slice(HALF, HALF, dim=1), bars.index(FULL_R + 1), bars.index(EMPTY_R + 1), ph,
                       row_b, HALF, HALF, BLOCK_N)
            row_a = next_a
            row_b = next_b


@gluon.jit
def _issue_scores(qn3, qr3, z, ckv_buf, kpe_buf, bars, buf, ph, bar_issued, WAIT_ISSUED: gl.constexpr,
                  SIGNAL_ISSUED: gl.constexpr, HALF: gl.constexpr, s_layout: gl.constexpr):
    """Issue the raw score tile ``q k^T`` of buffer ``buf`` (in flight when it returns): the rope
    part, the left values, the right values, each product issued as its copy lands.

    ``WAIT_ISSUED``: issue nothing before ``bar_issued`` (parity ``ph``) completes;
    ``SIGNAL_ISSUED``: arrive on it once the last product is issued (the stagger, see
    :func:`_right_partition`)."""
    qn_smem = qn3.index(z)
    qr_smem = qr3.index(z)
    if WAIT_ISSUED:
        mbarrier.wait(bar_issued, ph)
    mbarrier.wait(bars.index(FULL_K + buf), ph)
    s = warpgroup_mma(qr_smem, kpe_buf.permute((1, 0)), gl.zeros([64, 64], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    mbarrier.wait(bars.index(FULL_L + buf), ph)
    s = warpgroup_mma(qn_smem.slice(0, HALF, dim=1), ckv_buf.slice(0, HALF, dim=1).permute((1, 0)), s,
                      is_async=True)
    mbarrier.wait(bars.index(FULL_R + buf), ph)
    s = warpgroup_mma(qn_smem.slice(HALF, HALF, dim=1), ckv_buf.slice(HALF, HALF, dim=1).permute((1, 0)), s,
                      is_async=True)
    if SIGNAL_ISSUED:
        mbarrier.arrive(bar_issued, count=1)
    return s


@gluon.jit
def _scores(qn3, qr3, z, ckv_buf, kpe_buf, bars, buf, ph, bar_issued, WAIT_ISSUED: gl.constexpr,
            SIGNAL_ISSUED: gl.constexpr, HALF: gl.constexpr, s_layout: gl.constexpr):
    """:func:`_issue_scores`, retired; the rope part of ``buf`` released (its only reader)."""
    s = _issue_scores(qn3, qr3, z, ckv_buf, kpe_buf, bars, buf, ph, bar_issued, WAIT_ISSUED, SIGNAL_ISSUED, HALF,
                      s_layout)
    s = warpgroup_mma_wait(0, deps=[s])
    # The rope part is read by this product only.
    mbarrier.arrive(bars.index(EMPTY_K + buf), count=1)
    return s


@gluon.jit
def _pv(p, v, o):
    """``o + p v`` issued asynchronously."""
    acc = warpgroup_mma(p, v, o, is_async=True)
    return acc


@gluon.jit
def _masked_logits(s, n0, end, qk_scale, s_layout: gl.constexpr, Q_LEN: gl.constexpr):
    """Base-2 logits of the tile of tokens ``[n0, n0 + 64)``: -inf past ``end``, a scalar, or with
    ``Q_LEN > 1`` past each row's own limit, ``end [64]`` (:func:`.gluon.mtp_row_ends`)."""
    offs = n0 + gl.arange(0, 64, layout=gl.SliceLayout(0, s_layout))
    if Q_LEN == 1:
        valid = offs < end
        s = gl.where(valid[None, :], s * qk_scale, float("-inf"))
    else:
        s = gl.where(offs[None, :] < end[:, None], s * qk_scale, float("-inf"))
    return s


@gluon.jit
def _zero_tail(ckv_buf, n0, end, COL0: gl.constexpr, HALF: gl.constexpr, ld_layout: gl.constexpr):
    """Zero the value columns ``[COL0, COL0 + HALF)`` of the rows past ``end`` of a request's last
    tile (partial: ``n0 < end < n0 + 64``), before this warpgroup's P.V product reads them."""
    if (n0 < end) & (n0 + 64 > end):
        offs_r = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, ld_layout))
        for c in gl.static_range(HALF // 64):
            part = ckv_buf.slice(COL0 + c * 64, 64, dim=1)
            rows = part.load(ld_layout)
            part.store(gl.where((offs_r < end)[:, None], rows, 0.0))
        fence_async_shared()
        cta_barrier()


@gluon.jit
def _finish(o, m_i, l_i, x_smem, bars, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch,
            num_heads, num_splits, stride_o_b, stride_o_h, out_factor, X_MINE: gl.constexpr, X_OTHER: gl.constexpr,
            COL0: gl.constexpr, HALF: gl.constexpr, CKV_DIM: gl.constexpr, BLOCK_H: gl.constexpr,
            OUT_PTR: gl.constexpr, STORE_LSE: gl.constexpr, x_layout: gl.constexpr, o_layout: gl.constexpr,
            BALANCED: gl.constexpr, stage):
    """A warpgroup's end: once both are past their last read of the row maxima (``BAR_DONE``), its
    row sums out (slot ``X_MINE``), the other's in (``X_OTHER``), then its columns ``[COL0, COL0 +
    HALF)`` of the rows written with the sum of both (``l_0 + l_1``)."""
    cta_barrier()
    mbarrier.arrive(bars.index(BAR_DONE), count=1)
    mbarrier.wait(bars.index(BAR_DONE), 0)
    _publish_rows(x_smem, X_MINE, l_i)
    cta_barrier()
    mbarrier.arrive(bars.index(BAR_L), count=1)
    mbarrier.wait(bars.index(BAR_L), 0)
    l_other = _read_rows(x_smem, X_OTHER, x_layout)
    store_rows(o, m_i, l_i + l_other, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch,
               num_heads, num_splits, stride_o_b, stride_o_h, out_factor, COL0, HALF, CKV_DIM, BLOCK_H, OUT_PTR,
               STORE_LSE, o_layout, BALANCED, stage)


@gluon.jit
def _left_partition(q_ptr, qn_smem, qr_smem, ckv_smem, kpe_smem, p_smem, x_smem, bars, logit_scale_ptr,
                    out_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, b, hb, split, start, end, kv_len, num_pairs,
                    batch, num_heads, num_splits, num_pages, stride_q_b, stride_q_h, stride_o_b, stride_o_h,
                    logit_factor, out_factor, CKV_DIM: gl.constexpr, KPE_DIM: gl.constexpr, BLOCK_H: gl.constexpr,
                    BLOCK_N: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr, Q_LEN: gl.constexpr,
                    BALANCED: gl.constexpr = False):
    """Warpgroup 0 (the default partition): stages the query, then per pair the scores of tile A
    and the output columns ``[0, 256)``."""
    HALF: gl.constexpr = CKV_DIM // 2
    dt: gl.constexpr = q_ptr.dtype.element_ty
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(HALF)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld_layout: gl.constexpr = LD_LAYOUT
    x_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    # The query rows to shared memory (rows past Hq read as 0), then released to the other warpgroup.
    stage_query(q_ptr, qn_smem.index(0), qr_smem.index(0), b, hb, num_heads, stride_q_b, stride_q_h, CKV_DIM,
                KPE_DIM, BLOCK_H, ld_layout)
    mbarrier.arrive(bars.index(BAR_Q), count=1)

    qk_scale = logit_scale2(logit_factor, logit_scale_ptr, LOGIT_PTR)
    row_end = end  # the key limit of the rows: the split's end, or each token's own (Q_LEN > 1)
    if Q_LEN > 1:
        row_end = mtp_row_ends(kv_len, end, hb, num_heads, BLOCK_H, Q_LEN, x_layout)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=x_layout)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=x_layout)
    o = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    for i in range(num_pairs):
        ph = i & 1
        # (z is 0, but the compiler cannot know it: the shared-memory descriptors derived from it
        # are computed in the loop instead of being hoisted out of it, where ~70 of them spilled.)
        z = i & (num_pages >> 31)
        ckv_a = ckv_smem.index(z)
        ckv_b = ckv_smem.index(1 + z)
        n_a = start + 2 * i * BLOCK_N
        n_b = n_a + BLOCK_N
        # S_A (the other warpgroup's S_B is issued after this one).
        s = _scores(qn_smem, qr_smem, z, ckv_a, kpe_smem.index(z), bars, 0, ph, bars.index(BAR_SA), False, True,
                    HALF, s_layout)
        s = _masked_logits(s, n_a, row_end, qk_scale, s_layout, Q_LEN)
        m_a, l_i, p_a, alpha = online_softmax_step(m_i, l_i, s)
        # m_A and P_A (relative to m_A) to the other warpgroup.
        p_al = p_a.to(dt)
        _publish_rows(x_smem, X_MA, m_a)
        p_smem.store(p_al)
        fence_async_shared()
        cta_barrier()
        mbarrier.arrive(bars.index(BAR_MA), count=1)
        _zero_tail(ckv_a, n_a, end, 0, HALF, ld_layout)
        p_op = gl.convert_layout(p_al, p_layout)
        o = o * gl.convert_layout(alpha, o_rows)[:, None]
        o_acc = _pv(p_op, ckv_a.slice(0, HALF, dim=1), o)
        # m_B and P_B (relative to m_B, in the P buffer) from the other warpgroup.
        mbarrier.wait(bars.index(BAR_PB), ph)
        m_b = _read_rows(x_smem, X_MB, x_layout)
        g = gl.exp2(m_a - gl.where(m_b == float("-inf"), 0.0, m_b))
        l_i = l_i * g
        m_i = m_b
        # P_A V_A[:, :256] retires (A's left values are free); then P_B V_B[:, :256].
        o, p_op = warpgroup_mma_wait(0, deps=[o_acc, p_op])
        mbarrier.arrive(bars.index(EMPTY_L), count=1)
        _zero_tail(ckv_b, n_b, end, 0, HALF, ld_layout)
        o = o * gl.convert_layout(g, o_rows)[:, None]
        o_acc = _pv(p_smem, ckv_b.slice(0, HALF, dim=1), o)
        # It retires before the loop's back edge (B's left values and the P buffer are free): with
        # a product in flight across the back edge or the loop's exit, ptxas serialises every
        # wgmma of the kernel (C7514 / C7515, lab/notes/mla.md "MLA: seesaw (warp-specialised
        # Gluon kernel)").
        o = warpgroup_mma_wait(0, deps=[o_acc])
        mbarrier.arrive(bars.index(EMPTY_L + 1), count=1)

    _finish(o, m_i, l_i, x_smem, bars, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch,
            num_heads, num_splits, stride_o_b, stride_o_h, out_factor, X_MA, X_MB, 0, HALF, CKV_DIM, BLOCK_H, OUT_PTR,
            True, x_layout, o_layout, BALANCED,
            qn_smem.index(0).slice(0, HALF, dim=1))


@gluon.jit
def _right_partition(qn_smem, qr_smem, ckv_smem, kpe_smem, p_smem, x_smem, bars, logit_scale_ptr,
                     out_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, b, hb, split, start, end, kv_len, num_pairs,
                     batch, num_heads, num_splits, num_pages, stride_o_b, stride_o_h, logit_factor, out_factor,
                     CKV_DIM: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LOGIT_PTR: gl.constexpr,
                     OUT_PTR: gl.constexpr, Q_LEN: gl.constexpr, BALANCED: gl.constexpr = False):
    """Warpgroup 1: per pair the scores of tile B and the output columns ``[256, 512)``.

    S_B is issued once S_A is (the tensor cores run S_A first, so the left softmax
    overlaps S_B, and B's parts, freed last in the previous pair, have S_A's time to arrive).
    P_A is read from the P buffer into registers, so P_B may overwrite it without
    waiting for P_A V_A[:, 256:] to retire."""
    HALF: gl.constexpr = CKV_DIM // 2
    dt: gl.constexpr = ckv_smem.dtype
    s_layout: gl.constexpr = _acc_layout(BLOCK_N)
    o_layout: gl.constexpr = _acc_layout(HALF)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld_layout: gl.constexpr = LD_LAYOUT
    x_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    qk_scale = logit_scale2(logit_factor, logit_scale_ptr, LOGIT_PTR)
    row_end = end  # the key limit of the rows: the split's end, or each token's own (Q_LEN > 1)
    if Q_LEN > 1:
        row_end = mtp_row_ends(kv_len, end, hb, num_heads, BLOCK_H, Q_LEN, x_layout)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=x_layout)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=x_layout)
    o = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    mbarrier.wait(bars.index(BAR_Q), 0)
    for i in range(num_pairs):
        ph = i & 1
        z = i & (num_pages >> 31)  # 0 (see _left_partition)
        ckv_a = ckv_smem.index(z)
        ckv_b = ckv_smem.index(1 + z)
        n_a = start + 2 * i * BLOCK_N
        n_b = n_a + BLOCK_N
        s = _scores(qn_smem, qr_smem, z, ckv_b, kpe_smem.index(1 + z), bars, 1, ph, bars.index(BAR_SA), True,
                    False, HALF, s_layout)
        s = _masked_logits(s, n_b, row_end, qk_scale, s_layout, Q_LEN)
        # m_A and P_A from the other warpgroup: O_R to m_A, then P_A V_A[:, 256:], while this
        # warpgroup's softmax runs.
        mbarrier.wait(bars.index(BAR_MA), ph)
        m_a = _read_rows(x_smem, X_MA, x_layout)
        beta = gl.exp2(m_i - gl.where(m_a == float("-inf"), 0.0, m_a))
        _zero_tail(ckv_a, n_a, end, HALF, HALF, ld_layout)
        o = o * gl.convert_layout(beta, o_rows)[:, None]
        p_a = p_smem.load(p_layout)
        o_acc = _pv(p_a, ckv_a.slice(HALF, HALF, dim=1), o)
        # From m_A with an empty sum: (m_B, rowsum P_B, P_B, 2^(m_A - m_B)).
        m_b, l_new, p_b, g = online_softmax_step(m_a, gl.zeros([BLOCK_H], gl.float32, layout=x_layout), s)
        l_i = l_i * beta * g + l_new
        m_i = m_b
        p_bl = p_b.to(dt)
        # m_B and P_B go out (P_A is in registers), then P_A V_A[:, 256:] retires: A's right
        # values are free.
        _publish_rows(x_smem, X_MB, m_b)
        p_smem.store(p_bl)
        fence_async_shared()
        cta_barrier()
        mbarrier.arrive(bars.index(BAR_PB), count=1)
        o, p_a = warpgroup_mma_wait(0, deps=[o_acc, p_a])
        mbarrier.arrive(bars.index(EMPTY_R), count=1)
        _zero_tail(ckv_b, n_b, end, HALF, HALF, ld_layout)
        p_op = gl.convert_layout(p_bl, p_layout)
        o = o * gl.convert_layout(g, o_rows)[:, None]
        o_acc = _pv(p_op, ckv_b.slice(HALF, HALF, dim=1), o)
        # It retires before the back edge (see _left_partition): B's right values are free.
        o, p_op = warpgroup_mma_wait(0, deps=[o_acc, p_op])
        mbarrier.arrive(bars.index(EMPTY_R + 1), count=1)

    _finish(o, m_i, l_i, x_smem, bars, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch,
            num_heads, num_splits, stride_o_b, stride_o_h, out_factor, X_MB, X_MA, HALF, HALF, CKV_DIM, BLOCK_H,
            OUT_PTR, False, x_layout, o_layout, BALANCED,
            qn_smem.index(0).slice(HALF, HALF, dim=1))


@gluon.jit
def _convert_values(src, dst, n0, end):
    """``dst [64, COLS]`` (float16, the P.V operand) = ``src [64, COLS]`` (e4m3 bytes of the tile
    of tokens ``[n0, n0 + 64)``), rows past ``end`` zero (they may hold NaN: ``0 * NaN`` is NaN in
    a product). e4m3 converts to float16 exactly (one instruction a pair). Each thread moves 16
    bytes of a row at a time (8 threads a 128-byte row pair: no bank conflict under either
    swizzle). The caller fences and synchronises
    its warpgroup before the product reads ``dst`` or the copy warp may overwrite ``src``."""
    # As 32-bit words (ops/common/gluon_dequant): a 64-column block is one 64-byte swizzle span
    # of the bytes and one 128-byte span of the float16 values.
    for c in gl.static_range(src.shape[1] // 64):
        w = words_view(src.slice(c * 64, 64, dim=1), 64, 64, 1).load(CW_LAYOUT)
        v = f16_words(w)
        offs_r = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, v.type.layout))
        v = gl.where((offs_r < end)[:, None], v, 0)
        words_view(dst.slice(c * 64, 64, dim=1), 64, 64, 2).store(v)


@gluon.jit
def _left_fp8(q_ptr, qn_smem, qr_smem, ckv_smem, kpe_smem, p_smem, v_smem, x_smem, bars, logit_scale_ptr,
              out_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, b, hb, split, start, end, kv_len, num_pairs, batch,
              num_heads, num_splits, num_pages, stride_q_b, stride_q_h, stride_o_b, stride_o_h, logit_factor,
              out_factor, CKV_DIM: gl.constexpr, KPE_DIM: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
              LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr, Q_LEN: gl.constexpr,
              BALANCED: gl.constexpr = False):
    """Warpgroup 0 of the fp8 kernel: the left's schedule (tile A's scores on e4m3 wgmmas, output
    columns ``[0, 256)``), with its values converted into one float16 buffer (``v_smem`` slot 0):
    A's while S_A runs, B's while the right's softmax runs (the left waits for P_B then anyway)."""
    HALF: gl.constexpr = CKV_DIM // 2
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, 32)
    o_layout: gl.constexpr = _acc_layout(HALF)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    x_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    stage_query(q_ptr, qn_smem.index(0), qr_smem.index(0), b, hb, num_heads, stride_q_b, stride_q_h, CKV_DIM,
                KPE_DIM, BLOCK_H, CV_LAYOUT)
    mbarrier.arrive(bars.index(BAR_Q), count=1)

    qk_scale = logit_scale2(logit_factor, logit_scale_ptr, LOGIT_PTR)
    row_end = end  # the key limit of the rows: the split's end, or each token's own (Q_LEN > 1)
    if Q_LEN > 1:
        row_end = mtp_row_ends(kv_len, end, hb, num_heads, BLOCK_H, Q_LEN, x_layout)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=x_layout)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=x_layout)
    o = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    for i in range(num_pairs):
        ph = i & 1
        z = i & (num_pages >> 31)  # 0 (see _left_partition)
        ckv_a = ckv_smem.index(z)
        ckv_b = ckv_smem.index(1 + z)
        v_l = v_smem.index(z)
        n_a = start + 2 * i * BLOCK_N
        n_b = n_a + BLOCK_N
        s = _issue_scores(qn_smem, qr_smem, z, ckv_a, kpe_smem.index(z), bars, 0, ph, bars.index(BAR_SA), False,
                          True, HALF, s_layout)
        # V_A[:, :256] to float16 while S_A runs (v_l is free: the last pair's products retired).
        _convert_values(ckv_a.slice(0, HALF, dim=1), v_l, n_a, end)
        fence_async_shared()
        cta_barrier()
        s = warpgroup_mma_wait(0, deps=[s])
        # A's rope and left value bytes are read (S_A, the conversion).
        mbarrier.arrive(bars.index(EMPTY_K), count=1)
        mbarrier.arrive(bars.index(EMPTY_L), count=1)
        s = _masked_logits(s, n_a, row_end, qk_scale, s_layout, Q_LEN)
        m_a, l_i, p_a, alpha = online_softmax_step(m_i, l_i, s)
        p_al = p_a.to(gl.float16)
        _publish_rows(x_smem, X_MA, m_a)
        p_smem.store(p_al)
        fence_async_shared()
        cta_barrier()
        mbarrier.arrive(bars.index(BAR_MA), count=1)
        p_op = gl.convert_layout(p_al, p_layout)
        o = o * gl.convert_layout(alpha, o_rows)[:, None]
        o_acc = _pv(p_op, v_l, o)
        o, p_op = warpgroup_mma_wait(0, deps=[o_acc, p_op])
        # V_B[:, :256] into the same buffer while the right's softmax of B runs.
        mbarrier.wait(bars.index(FULL_L + 1), ph)
        _convert_values(ckv_b.slice(0, HALF, dim=1), v_l, n_b, end)
        fence_async_shared()
        cta_barrier()
        mbarrier.wait(bars.index(BAR_PB), ph)
        # B's left value bytes are read (the right's S_B retired before it published P_B).
        mbarrier.arrive(bars.index(EMPTY_L + 1), count=1)
        m_b = _read_rows(x_smem, X_MB, x_layout)
        g = gl.exp2(m_a - gl.where(m_b == float("-inf"), 0.0, m_b))
        l_i = l_i * g
        m_i = m_b
        o = o * gl.convert_layout(g, o_rows)[:, None]
        o_acc = _pv(p_smem, v_l, o)
        # Retired before the back edge (see _left_partition).
        o = warpgroup_mma_wait(0, deps=[o_acc])

    _finish(o, m_i, l_i, x_smem, bars, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch,
            num_heads, num_splits, stride_o_b, stride_o_h, out_factor, X_MA, X_MB, 0, HALF, CKV_DIM, BLOCK_H, OUT_PTR,
            True, x_layout, o_layout, BALANCED,
            smem_view(v_smem.index(0), gl.bfloat16, [BLOCK_N, HALF], HALF_SMEM))


@gluon.jit
def _right_fp8(qn_smem, qr_smem, ckv_smem, kpe_smem, p_smem, v_smem, x_smem, bars, logit_scale_ptr, out_scale_ptr,
               out_ptr, part_o_ptr, part_lse_ptr, b, hb, split, start, end, kv_len, num_pairs, batch, num_heads,
               num_splits, num_pages, stride_o_b, stride_o_h, logit_factor, out_factor, CKV_DIM: gl.constexpr,
               BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr,
               Q_LEN: gl.constexpr, BALANCED: gl.constexpr = False):
    """Warpgroup 1 of the fp8 kernel: the right's schedule (tile B's scores on e4m3 wgmmas,
    output columns ``[256, 512)``, P_A read into registers), with both tiles' right values
    converted into float16 buffers of their own (``v_smem`` slots 1 and 2) while S_B runs."""
    HALF: gl.constexpr = CKV_DIM // 2
    s_layout: gl.constexpr = _acc_layout(BLOCK_N, 32)
    o_layout: gl.constexpr = _acc_layout(HALF)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    x_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    qk_scale = logit_scale2(logit_factor, logit_scale_ptr, LOGIT_PTR)
    row_end = end  # the key limit of the rows: the split's end, or each token's own (Q_LEN > 1)
    if Q_LEN > 1:
        row_end = mtp_row_ends(kv_len, end, hb, num_heads, BLOCK_H, Q_LEN, x_layout)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=x_layout)
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=x_layout)
    o = gl.zeros([BLOCK_H, HALF], gl.float32, layout=o_layout)
    mbarrier.wait(bars.index(BAR_Q), 0)
    for i in range(num_pairs):
        ph = i & 1
        z = i & (num_pages >> 31)  # 0 (see _left_partition)
        ckv_a = ckv_smem.index(z)
        ckv_b = ckv_smem.index(1 + z)
        v_ra = v_smem.index(1 + z)
        v_rb = v_smem.index(2 + z)
        n_a = start + 2 * i * BLOCK_N
        n_b = n_a + BLOCK_N
        s = _issue_scores(qn_smem, qr_smem, z, ckv_b, kpe_smem.index(1 + z), bars, 1, ph, bars.index(BAR_SA),
                          True, False, HALF, s_layout)
        # Both tiles' right values to float16 while S_B runs (A's bytes landed before B's).
        mbarrier.wait(bars.index(FULL_R), ph)
        _convert_values(ckv_a.slice(HALF, HALF, dim=1), v_ra, n_a, end)
        _convert_values(ckv_b.slice(HALF, HALF, dim=1), v_rb, n_b, end)
        fence_async_shared()
        cta_barrier()
        s = warpgroup_mma_wait(0, deps=[s])
        # B's rope and right value bytes are read (S_B, the conversion).
        mbarrier.arrive(bars.index(EMPTY_K + 1), count=1)
        mbarrier.arrive(bars.index(EMPTY_R + 1), count=1)
        s = _masked_logits(s, n_b, row_end, qk_scale, s_layout, Q_LEN)
        mbarrier.wait(bars.index(BAR_MA), ph)
        # A's right value bytes are read (the left's S_A retired before it published P_A).
        mbarrier.arrive(bars.index(EMPTY_R), count=1)
        m_a = _read_rows(x_smem, X_MA, x_layout)
        beta = gl.exp2(m_i - gl.where(m_a == float("-inf"), 0.0, m_a))
        o = o * gl.convert_layout(beta, o_rows)[:, None]
        p_a = p_smem.load(p_layout)
        o_acc = _pv(p_a, v_ra, o)
        m_b, l_new, p_b, g = online_softmax_step(m_a, gl.zeros([BLOCK_H], gl.float32, layout=x_layout), s)
        l_i = l_i * beta * g + l_new
        m_i = m_b
        p_bl = p_b.to(gl.float16)
        # m_B and P_B go out (P_A is in registers); then P_A V_A[:, 256:] retires.
        _publish_rows(x_smem, X_MB, m_b)
        p_smem.store(p_bl)
        fence_async_shared()
        cta_barrier()
        mbarrier.arrive(bars.index(BAR_PB), count=1)
        o, p_a = warpgroup_mma_wait(0, deps=[o_acc, p_a])
        p_op = gl.convert_layout(p_bl, p_layout)
        o = o * gl.convert_layout(g, o_rows)[:, None]
        o_acc = _pv(p_op, v_rb, o)
        # Retired before the back edge (see _left_partition).
        o, p_op = warpgroup_mma_wait(0, deps=[o_acc, p_op])

    _finish(o, m_i, l_i, x_smem, bars, out_ptr, part_o_ptr, part_lse_ptr, out_scale_ptr, b, hb, split, batch,
            num_heads, num_splits, stride_o_b, stride_o_h, out_factor, X_MB, X_MA, HALF, HALF, CKV_DIM, BLOCK_H,
            OUT_PTR, False, x_layout, o_layout, BALANCED,
            smem_view(v_smem.index(1), gl.bfloat16, [BLOCK_N, HALF], HALF_SMEM))


@gluon.jit
def mla_gluon_ws_kernel(
    q_ptr,  # [B, Q_LEN * Hq, CKV_DIM + KPE_DIM] query rows [q_nope | q_rope], token-major, 16-bit or e4m3 (last dim contiguous)
    kv_desc,  # TMA descriptor of the rows as [num_pages * PAGE_SIZE, CKV_DIM + KPE_DIM], box [min(PAGE_SIZE, 64), 64]
    table_ptr,  # [B, pages_per_seq] int32 page ids
    seq_lens_ptr,  # [B] int32
    logit_scale_ptr,  # [1] float32 (LOGIT_PTR)
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    out_ptr,  # [B, Q_LEN * Hq, CKV_DIM] the query's 16-bit dtype, bfloat16 for an e4m3 query (last dim contiguous)
    part_o_ptr,  # [num_splits, B, Q_LEN * Hq, CKV_DIM] normalised split outputs, out's dtype if bfloat16 else float32 (BALANCED: [units, ...])
    part_lse_ptr,  # [num_splits, B, Q_LEN * Hq] float32 split LSEs (base 2; BALANCED: [units, ...])
    stride_q_b, stride_q_h, stride_o_b, stride_o_h, stride_t_b, stride_t_p,
    batch, num_heads, num_splits, num_pages, capacity,
    logit_factor, out_factor,
    CKV_DIM: gl.constexpr, KPE_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_H: gl.constexpr,
    BLOCK_N: gl.constexpr, H_BLOCKS: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr,
    SPLIT_SPAN: gl.constexpr = 0, Q_LEN: gl.constexpr = 1, BALANCED: gl.constexpr = False,
    BLOCK_B: gl.constexpr = 1, MIN_CHUNK: gl.constexpr = 0, UNITS_CAP: gl.constexpr = 1,
):
    gl.static_assert(BLOCK_H == 64 and BLOCK_N == 64 and KPE_DIM == 64 and CKV_DIM % 128 == 0)
    # A tile inside one page, or over at most 16 whole pages of a pair (_copy_pages: a page a lane).
    gl.static_assert(PAGE_SIZE % BLOCK_N == 0 or (BLOCK_N % PAGE_SIZE == 0 and PAGE_SIZE >= 4))
    dt: gl.constexpr = q_ptr.dtype.element_ty
    FP8: gl.constexpr = dt == gl.float8e4nv
    x_smem_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])

    b, hb, split, start, end, num_tiles = split_work(seq_lens_ptr, capacity, batch, num_splits, H_BLOCKS, BLOCK_N,
                                                     SPLIT_SPAN, BALANCED, MIN_CHUNK, BLOCK_B, UNITS_CAP)
    num_pairs = (num_tiles + 1) // 2
    total_rows = num_pages * PAGE_SIZE
    table_row = table_ptr + b.to(gl.int64) * stride_t_b
    # The request's length, for the tokens' own key limits (Q_LEN > 1; a constant otherwise, which
    # the partitions never read).
    kv_len = 0
    if Q_LEN > 1:
        kv_len = gl.minimum(gl.maximum(gl.load(seq_lens_ptr + b), 0), capacity)

    if FP8:
        # e4m3 bytes: a 64-column box is 64 bytes, the rows' swizzle span (lab/notes/mla.md "MLA:
        # fp8 on the seesaw"); P and the converted values are float16 in 128-byte swizzled rows.
        row_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
        half_smem: gl.constexpr = HALF_SMEM
        pdt: gl.constexpr = gl.float16
    else:
        row_smem: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        half_smem: gl.constexpr = row_smem
        pdt: gl.constexpr = dt
    qn_smem = gl.allocate_shared_memory(dt, [1, BLOCK_H, CKV_DIM], row_smem)
    qr_smem = gl.allocate_shared_memory(dt, [1, BLOCK_H, KPE_DIM], row_smem)
    ckv_smem = gl.allocate_shared_memory(dt, [2, BLOCK_N, CKV_DIM], row_smem)
    kpe_smem = gl.allocate_shared_memory(dt, [2, BLOCK_N, KPE_DIM], row_smem)
    p_smem = gl.allocate_shared_memory(pdt, [BLOCK_H, BLOCK_N], half_smem)
    x_smem = gl.allocate_shared_memory(gl.float32, [N_X * BLOCK_H, 4], x_smem_layout)
    bars = gl.allocate_shared_memory(gl.int64, [N_BARS, 1], mbarrier.MBarrierLayout())
    for k in gl.static_range(N_BARS - 2):
        mbarrier.init(bars.index(k), count=1)
    mbarrier.init(bars.index(BAR_DONE), count=2)  # (the last two slots) both warpgroups arrive
    mbarrier.init(bars.index(BAR_L), count=2)

    if FP8:
        # The float16 values of P.V: the left's half (one buffer), the right's half of A and of B.
        v_smem = gl.allocate_shared_memory(gl.float16, [3, BLOCK_N, CKV_DIM // 2], half_smem)
        gl.warp_specialize([
            (_left_fp8, (q_ptr, qn_smem, qr_smem, ckv_smem, kpe_smem, p_smem, v_smem, x_smem, bars, logit_scale_ptr,
                         out_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, b, hb, split, start, end, kv_len,
                         num_pairs, batch, num_heads, num_splits, num_pages, stride_q_b, stride_q_h, stride_o_b,
                         stride_o_h, logit_factor, out_factor, CKV_DIM, KPE_DIM, BLOCK_H, BLOCK_N, LOGIT_PTR,
                         OUT_PTR, Q_LEN, BALANCED)),
            (_right_fp8, (qn_smem, qr_smem, ckv_smem, kpe_smem, p_smem, v_smem, x_smem, bars, logit_scale_ptr,
                          out_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, b, hb, split, start, end, kv_len,
                          num_pairs, batch, num_heads, num_splits, num_pages, stride_o_b, stride_o_h, logit_factor,
                          out_factor, CKV_DIM, BLOCK_H, BLOCK_N, LOGIT_PTR, OUT_PTR, Q_LEN, BALANCED)),
            (_copy_partition, (kv_desc, ckv_smem, kpe_smem, bars, table_row, stride_t_p, start, end, num_pairs,
                               num_pages, total_rows, CKV_DIM, PAGE_SIZE, BLOCK_N)),
        ], [NUM_WARPS, 1], [RIGHT_REGS, COPY_REGS])
    else:
        gl.warp_specialize([
            (_left_partition, (q_ptr, qn_smem, qr_smem, ckv_smem, kpe_smem, p_smem, x_smem, bars, logit_scale_ptr,
                               out_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, b, hb, split, start, end, kv_len,
                               num_pairs, batch, num_heads, num_splits, num_pages, stride_q_b, stride_q_h,
                               stride_o_b, stride_o_h, logit_factor, out_factor, CKV_DIM, KPE_DIM, BLOCK_H, BLOCK_N,
                               LOGIT_PTR, OUT_PTR, Q_LEN, BALANCED)),
            (_right_partition, (qn_smem, qr_smem, ckv_smem, kpe_smem, p_smem, x_smem, bars, logit_scale_ptr,
                                out_scale_ptr, out_ptr, part_o_ptr, part_lse_ptr, b, hb, split, start, end, kv_len,
                                num_pairs, batch, num_heads, num_splits, num_pages, stride_o_b, stride_o_h,
                                logit_factor, out_factor, CKV_DIM, BLOCK_H, BLOCK_N, LOGIT_PTR, OUT_PTR, Q_LEN,
                                BALANCED)),
            (_copy_partition, (kv_desc, ckv_smem, kpe_smem, bars, table_row, stride_t_p, start, end, num_pairs,
                               num_pages, total_rows, CKV_DIM, PAGE_SIZE, BLOCK_N)),
        ], [NUM_WARPS, 1], [RIGHT_REGS, COPY_REGS])
