"""Paged causal prefill for Hopper in Gluon, warp-specialised (the FlashAttention-3 schedule).

Why a second prefill kernel. The Triton kernel (:mod:`.kernels`) cannot overlap one key tile's
softmax with the next tile's matrix products: Triton 3.6 waits for a wgmma at its first use in the
same iteration, its software pipeliner keeps every warp of a program in step, and its automatic
warp specialisation crashed or did nothing on these loops (``lab/notes/prefill.md`` "Prefill:
overlapping the softmax with the matrix products"). On an H100 it stops at ~0.73 of the bf16
matmul rate at 1 x 8192 x 8192. Gluon writes the schedule out:

* **Roles** (``gl.warp_specialize``, 12 warps a program, registers moved by ``setmaxnreg``): one
  producer warp (24 registers) issues every K/V copy; two consumer warpgroups (240 registers each)
  own 64 query rows each of one 128-row query tile of one head, and share the K/V tiles.
* **Copies**: TMA boxes of ``[SUB, 64]`` (``SUB`` = min(page, BLOCK_N) tokens, 64 columns = one
  128-byte swizzle span) from the cache viewed as ``[rows, cols]`` (see :func:`tma_view`); page
  ids read by the producer, one a box; an id outside the cache becomes the row past the view's
  end, which TMA reads as zeros. K and V have rings of ``STAGES`` buffers each, an mbarrier
  ``ready`` (bytes landed) and ``empty`` (both warpgroups done) a buffer.
* **Consumer loop** (per key tile ``j``): ``S_j = Q K_j^T`` and ``O += P_{j-1} V_{j-1}`` issued
  back to back, then ``S_j`` waited for alone, so the softmax of tile ``j`` runs under
  ``P_{j-1} V_{j-1}`` (FA3's intra-warpgroup overlap); ``O`` is rescaled after that product
  retires. With ``PINGPONG`` the two warpgroups take turns issuing their products (two mbarriers
  passed back and forth), so one's softmax runs under the other's products (off in the table:
  slower on an H200, ``lab/notes/prefill.md`` "Prefill: warp-specialised Gluon kernel").
* **Masks**: the tiles of a query tile split into the window's edge, the fully visible run and the
  causal diagonal, as in the Triton kernel; one tile-uniform branch applies the mask only to the
  edge and diagonal tiles. Full tiles keep the logits unscaled and fold scale and max shift into
  one FMA before ``exp2``. A negative logit scale is folded into q (its sign flipped as q goes
  through registers, or in place in its slot once copied: a rare, tile-uniform branch).
* **Slots past the request**: a page's slots past ``seq_lens[b]`` may hold anything, NaN too; the
  scores there are masked, but ``0 * NaN`` is NaN in ``P V``, so the warpgroups zero those rows of
  the last V tile in shared memory before their products, each its half of the rows, and meet on
  an mbarrier (no location written by one is touched by the other's loads or stores).
* **Unusable page ids**: a box whose id lies outside the cache is read as zeros by the producer
  (a zero key and value, not yet the dropped token of docs/semantics.md: the consumer-side
  checks tried cost 3-11 %, lab/notes/hardening.md "Hardening: unusable page ids and lengths").
* **Scheduler**: persistent, one program an SM; tiles numbered longest first (the last query tile
  of every request and head first, counted from each request's own end, heads fastest so a KV
  head's query heads run side by side) and dealt in rounds of one tile a program, every other
  round in reverse (serpentine), so the long diagonal-heavy tiles start in the first round, short
  ones fill the tail, and no program takes the longest tile of every round.
* **Query rows a tile ahead**: where two query slots fit beside the rings (16-bit D64 / D128, fp8
  queries), each consumer warpgroup copies the next tile's rows (``cp.async``) under its tile's
  first score product, so a tile starts on rows already in shared memory; otherwise the rows go
  through registers as the tile starts (a 16-bit query over an fp8 cache is converted on the way).

Scope (host-checked in :func:`.plan_gluon_ws.eligible`): fp16/bf16 query and cache of one dtype, or a 16-bit or
fp8 query over an fp8 cache (``KV_FP8``: a converter partition turns the copied bytes into
float16 operands; an fp8 query's V may instead come as float16 pages staged in the workspace,
``V_STAGED``, see :mod:`.staging`, which also hands this kernel 16-bit copies of NVFP4 caches and of
small pages), head_dim 64 / 128 / 256, pages of 8 tokens or more that tile the key tiles (see
:func:`pages_tile`) and whose rows TMA can address, HND or NHD, shared or split page tables,
window, sinks, float or device-tensor scales, fp16/bf16 outputs. Everything else (fp8 / NVFP4
outputs, skip-softmax, other pages, ``KVATTN_GLUON=0``) takes the Triton kernel.

``CAUSAL`` False (``causal=False``, no window): every row of a request sees all its keys, as its
last row does under the causal rule (the same key runs, each row masked at ``kv_len - 1``).
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..common import causal_key_ranges, float16_operand, full_tile_softmax
from ..common.gluon_compat import cp_async_load, cta_barrier, tma_load
from ..common.gluon_dequant import f16_words, row_smem, words_view

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
BLOCK_M: gl.constexpr = gl.constexpr(128)  # query rows a tile: 64 a consumer warpgroup
WG_ROWS: gl.constexpr = gl.constexpr(64)
COLS: gl.constexpr = gl.constexpr(64)  # columns a TMA box: one 128-byte swizzle span of 16-bit values


@triton.constexpr_function
def _row_threads(head_dim):
    """``threads_per_warp`` of a ``[rows, head_dim]`` load of 16-byte vectors: a row's vectors
    across neighbouring lanes (coalesced), the rest of the warp on further rows."""
    head_dim = getattr(head_dim, "value", head_dim)  # Triton 3.6 passes the constexpr itself
    along = min(head_dim // 8, 32)
    return [32 // along, along]


@triton.constexpr_function
def _box_cols(head_dim, esize):
    """Columns of a TMA box and of a swizzle span: 128 bytes of a row, or the whole row where it
    is shorter (fp8 rows of 64 values)."""
    head_dim = getattr(head_dim, "value", head_dim)
    esize = getattr(esize, "value", esize)
    return min(head_dim, 128 // esize)


@gluon.jit
def _tile_of(t, num_tiles, num_heads, batch, m_tiles, cum_q_ptr, seq_lens_ptr, num_rows, capacity, window_left,
             BLOCK_N: gl.constexpr, HAS_WINDOW: gl.constexpr, CAUSAL: gl.constexpr):
    """The work tile of a program's loop index ``t`` (tiles: heads fastest, then requests, then
    query tiles counted from each request's last; see the serpentine rounds below): its head,
    request, query-tile index, rows and key runs. Every partition derives the same values.

    Counted from each request's own last tile, the first round holds every request's tile with the
    most keys (its last rows see all of them), whatever the request's length: a request of a few
    rows over a long cache is not left to the last round, where the longest tiles would run alone
    (lab/notes/prefill.md "Prefill: the tile order of ragged batches").

    Returns ``(h, b, mt, live, q_start, q_end, p0, kv_len, start, n_tiles, full_lo, full_hi)``:
    ``live`` whether the tile holds rows; keys ``[start, start + n_tiles * BLOCK_N)`` in tiles,
    those in ``[full_lo, full_hi)`` seen whole by every row (no mask)."""
    # Round r of the programs (tiles [r * P, (r + 1) * P)) is dealt in reverse when r is odd and
    # whole: with tiles sorted longest first, round robin gives program 0 the longest tile of every
    # round, the serpentine order evens the programs' totals (the partial last round stays as it
    # is: every index must map to one tile). lab/notes/prefill.md "Prefill: serpentine rounds and
    # the query a tile ahead".
    progs = gl.num_programs(0)
    r = t // progs
    t = gl.where(((r % 2) == 1) & ((r + 1) * progs <= num_tiles), (2 * r + 1) * progs - 1 - t, t)
    h = t % num_heads
    rest = t // num_heads
    b = rest % batch
    q_start = gl.load(cum_q_ptr + b).to(gl.int32)
    q_next = gl.load(cum_q_ptr + b + 1).to(gl.int32)
    q_len = q_next - q_start
    # (a request longer than max_q_len, the caller's bound, gets its last m_tiles tiles; clamping
    # its count here costs the producer's registers a spill)
    mt = gl.cdiv(q_len, BLOCK_M) - 1 - rest // batch
    q_end = gl.minimum(q_next, num_rows)  # never write past `out`
    # Lengths clamped into [0, capacity] and rows kept inside [0, num_rows) (the two masks below
    # test q_rows >= 0 too): see context_kernel and lab/notes/robustness.md "Device-side clamps".
    kv_len = gl.minimum(gl.maximum(gl.load(seq_lens_ptr + b), 0), capacity)
    live = mt >= 0
    # Keys the tile's valid rows can see: [start, hi), whole in [full_lo, full_hi) (the Triton
    # kernel's ranges: one scalar @triton.jit piece serves both).
    if CAUSAL:
        p0, hi, start, full_lo, full_hi = causal_key_ranges(kv_len, q_len, q_end - q_start, mt, window_left,
                                                            BLOCK_M, BLOCK_N, HAS_WINDOW)
    else:  # bidirectional (no window): every row sees what one row at the last position sees
        p0, hi, start, full_lo, full_hi = causal_key_ranges(kv_len, 1, 1, 0, window_left, BLOCK_M, BLOCK_N, False)
    n_tiles = gl.maximum(gl.cdiv(hi - start, BLOCK_N), 0)
    return h, b, mt, live, q_start, q_end, p0, kv_len, hi, start, n_tiles, full_lo, full_hi


# ---------------------------------------------------------------------------------------------
# producer: one warp
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _issue_tile(desc, buf, bar, table_row, stride_t_p, n0, hi, kvh, num_pages, page_rows, total_rows,
                head_rows, head_cols, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Start the copy of the key tile ``[n0, n0 + BLOCK_N)`` into ``buf [BLOCK_N, HEAD_DIM]``;
    ``bar`` counts its bytes. One box of ``SUB`` tokens x one 128-byte swizzle span of columns
    (64 16-bit values, up to 128 fp8 ones) at a time; a box's page id is read only where its
    first token is below ``hi`` (table entries past a request's last page are never read); other
    boxes, and ids outside ``[0, num_pages)``, read the row past the view's end: zeros."""
    SUB: gl.constexpr = PAGE_SIZE if PAGE_SIZE < BLOCK_N else BLOCK_N
    ESIZE: gl.constexpr = buf.dtype.primitive_bitwidth // 8
    BOX: gl.constexpr = _box_cols(HEAD_DIM, ESIZE)
    mbarrier.expect(bar, BLOCK_N * HEAD_DIM * ESIZE)
    for c in gl.static_range(BLOCK_N // SUB):
        tok = n0 + c * SUB
        pid = gl.load(table_row + (tok // PAGE_SIZE) * stride_t_p, mask=tok < hi, other=-1)
        ok = (pid >= 0) & (pid < num_pages)
        row = gl.where(ok, pid * page_rows + kvh * head_rows + tok % PAGE_SIZE, total_rows)
        part = buf.slice(c * SUB, SUB, dim=0)
        for d in gl.static_range(HEAD_DIM // BOX):
            tma_load(desc, [row, kvh * head_cols + d * BOX], bar, part.slice(d * BOX, BOX, dim=1))


@gluon.jit
def _producer(ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
              GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HAS_WINDOW: gl.constexpr,
              HAS_SINKS: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr, PINGPONG: gl.constexpr,
              KV_FP8: gl.constexpr, V_STAGED: gl.constexpr, CAUSAL: gl.constexpr):
    (stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p,
     num_rows, num_heads, batch, m_tiles, num_tiles, k_num_pages, v_num_pages, capacity, window_left,
     k_page_rows, v_page_rows, k_total_rows, v_total_rows, head_rows, head_cols) = ints
    (q_ptr, out_ptr, k_desc, v_desc, k_table_ptr, v_table_ptr, seq_lens_ptr, cum_q_ptr, sinks_ptr, logit_scale_ptr,
     out_scale_ptr) = ptrs
    q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, turn = bufs
    # Where each copy lands: the consumers' rings, or (fp8 caches) the converter's rings of bytes.
    k_raw, v_raw, k_raw_ready, k_raw_empty, v_raw_ready, v_raw_empty = raw
    if _converts_k(q_ptr.dtype.element_ty, KV_FP8):
        k_dst, k_full, k_free = k_raw, k_raw_ready, k_raw_empty
    else:
        k_dst, k_full, k_free = k_bufs, k_ready, k_empty
    if _converts_v(KV_FP8, V_STAGED):
        v_dst, v_full, v_free = v_raw, v_raw_ready, v_raw_empty
    else:
        v_dst, v_full, v_free = v_bufs, v_ready, v_empty
    c = 0  # tiles through the rings so far (buffer c % STAGES, its use number c // STAGES)
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        h, b, mt, live, q_start, q_end, p0, kv_len, hi, start, n_tiles, full_lo, full_hi = _tile_of(
            t, num_tiles, num_heads, batch, m_tiles, cum_q_ptr, seq_lens_ptr, num_rows, capacity, window_left, BLOCK_N,
            HAS_WINDOW, CAUSAL)
        if live:
            kvh = h // GROUP
            kt_row = k_table_ptr + b.to(gl.int64) * stride_kt_b
            vt_row = v_table_ptr + b.to(gl.int64) * stride_vt_b
            for j in range(n_tiles):
                n0 = start + j * BLOCK_N
                slot = c % STAGES
                phase = (c // STAGES) & 1
                # A fresh barrier passes a wait on parity 1: the first round finds every buffer free.
                mbarrier.wait(k_free.index(slot), phase ^ 1)
                _issue_tile(k_desc, k_dst.index(slot), k_full.index(slot), kt_row, stride_kt_p, n0, hi, kvh,
                            k_num_pages, k_page_rows, k_total_rows, head_rows, head_cols, PAGE_SIZE, BLOCK_N,
                            HEAD_DIM)
                mbarrier.wait(v_free.index(slot), phase ^ 1)
                _issue_tile(v_desc, v_dst.index(slot), v_full.index(slot), vt_row, stride_vt_p, n0, hi, kvh,
                            v_num_pages, v_page_rows, v_total_rows, head_rows, head_cols, PAGE_SIZE, BLOCK_N,
                            HEAD_DIM)
                c += 1


# ---------------------------------------------------------------------------------------------
# converter (fp8 caches): two warps
# ---------------------------------------------------------------------------------------------
CONV_WARPS: gl.constexpr = gl.constexpr(2)
CONVERTER_REGS: gl.constexpr = gl.constexpr(40)  # the producer's warpgroup (producer + converter warps)
CONSUMER_REGS_FP8: gl.constexpr = gl.constexpr(232)


@triton.constexpr_function
def _converts_k(q_dtype, kv_fp8):
    """K goes through the converter where the cache is fp8 and the query is not: a 16-bit query's
    score product needs 16-bit keys, an fp8 query's takes the copied bytes."""
    return bool(getattr(kv_fp8, "value", kv_fp8)) and not getattr(q_dtype, "value", q_dtype).is_fp8()


@triton.constexpr_function
def _converts_v(kv_fp8, v_staged):
    """V goes through the converter where the cache is fp8 and V is not staged (an fp8 query's V
    may come as float16 pages from the workspace, :mod:`.staging`)."""
    return bool(getattr(kv_fp8, "value", kv_fp8)) and not getattr(v_staged, "value", v_staged)


@triton.constexpr_function
def _converter_on(q_dtype, kv_fp8, v_staged):
    """Whether the converter partition runs: something to convert (K or V)."""
    return _converts_k(q_dtype, kv_fp8) or _converts_v(kv_fp8, v_staged)


@triton.constexpr_function
def _k_dtype(q_dtype, kv_fp8):
    """The type of the staged query and of the keys in the score product: an fp8 query's own
    (e4m3 products on the copied bytes); float16 over an fp8 cache (e4m3 converts to it exactly, a
    pair an instruction; the query saturated to its range, as the Triton kernels' float16
    operands); else the query's."""
    q_dtype = getattr(q_dtype, "value", q_dtype)
    if q_dtype.is_fp8():
        return q_dtype
    return gl.float16 if getattr(kv_fp8, "value", kv_fp8) else q_dtype


@triton.constexpr_function
def _pv_dtype(q_dtype, kv_fp8):
    """The type of P and of the values in the P.V product: float16 over an fp8 cache (P in e4m3
    would cost 1-2.5 % relative error, lab/notes/prefill.md "Prefill: floors and the first Triton
    kernel"), else the query's."""
    return gl.float16 if getattr(kv_fp8, "value", kv_fp8) else getattr(q_dtype, "value", q_dtype)


# Shared memory a program may fill with a second query slot (of the 227 KB an H100 program may
# use, room left for the barriers and the compiler's own scratch).
Q_RING_BUDGET = 200 * 1024


@triton.constexpr_function
def _q_slots(q_dtype, kv_fp8, v_staged, head_dim, block_n, stages):
    """Query slots of each consumer warpgroup: 2 where the query goes into shared memory unchanged
    (its type is the score product's) and a second slot fits beside the rings; then each tile's
    rows are copied (``cp.async``) while the tile before runs, off the path between two tiles
    (lab/notes/prefill.md "Prefill: serpentine rounds and the query a tile ahead"). 1: the query
    goes through registers (a 16-bit query over an fp8 cache is converted to float16 on the way)
    as the tile starts."""
    q_dtype = getattr(q_dtype, "value", q_dtype)
    head_dim, block_n, stages = (getattr(x, "value", x) for x in (head_dim, block_n, stages))
    if _converts_k(q_dtype, kv_fp8):
        return 1
    qk_bytes = 1 if q_dtype.is_fp8() else 2
    rings = stages * block_n * head_dim * (qk_bytes + 2)
    if _converts_v(kv_fp8, v_staged):
        rings += stages * block_n * head_dim  # the converter's ring of copied bytes
    two_slots = 2 * 2 * WG_ROWS.value * head_dim * qk_bytes
    return 2 if two_slots + rings <= Q_RING_BUDGET else 1


@triton.constexpr_function
def _convert_layout_of(cols):
    """Registers of one conversion step over ``cols`` fp8 columns read as 32-bit words: 16 bytes of
    a row a thread (one vector load; two vector stores of the float16 words), a row's vectors across
    neighbouring lanes, 8 rows a step (the swizzle's period)."""
    cols = getattr(cols, "value", cols)
    along = min(cols // 16, 32)
    rows = 32 // along
    per_thread = max(1, 8 // (rows * 2))
    return gl.BlockedLayout([per_thread, 4], [rows, along], [2, 1], [1, 0])


@gluon.jit
def _convert_tile(src, dst, n0, kv_len, ZERO_PAST: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Convert the e4m3 tile ``src [BLOCK_N, HEAD_DIM]`` (keys from ``n0``) into the float16 tile
    ``dst`` (exact), both seen as 32-bit words; with ``ZERO_PAST`` rows at or past ``kv_len`` become
    zeros (a page's slots past the request may hold NaN, and ``0 * NaN`` is NaN in ``P V``). Steps
    of 8 rows x 128 columns at most (one swizzle span of bytes): 16 bytes in, 32 out a thread,
    within the converter's registers.

    The next step's load is issued before this step's conversion and store: Triton cannot tell
    the partition's two buffers apart and puts a barrier before every store, which would otherwise
    leave each load's latency and each conversion alone on the converter's path."""
    COLS: gl.constexpr = HEAD_DIM if HEAD_DIM < 128 else 128
    ld: gl.constexpr = _convert_layout_of(COLS)
    STEP: gl.constexpr = ld.size_per_thread[0] * ld.threads_per_warp[0] * ld.warps_per_cta[0]
    N_STEPS: gl.constexpr = BLOCK_N // STEP
    src_w = words_view(src, BLOCK_N, HEAD_DIM, 1)
    dst_w = words_view(dst, BLOCK_N, HEAD_DIM, 2)
    for c in gl.static_range(HEAD_DIM // COLS):
        src_c = src_w.slice(c * COLS // 4, COLS // 4, dim=1)
        dst_c = dst_w.slice(c * COLS // 2, COLS // 2, dim=1)
        x = src_c.slice(0, STEP, dim=0).load(ld)
        for r in gl.static_range(N_STEPS):
            if r + 1 < N_STEPS:
                x_next = src_c.slice((r + 1) * STEP, STEP, dim=0).load(ld)
            y = f16_words(x)
            if ZERO_PAST:
                rows = n0 + r * STEP + gl.arange(0, STEP, layout=gl.SliceLayout(1, y.type.layout))
                y = gl.where((rows < kv_len)[:, None], y, 0)
            dst_c.slice(r * STEP, STEP, dim=0).store(y)
            if r + 1 < N_STEPS:
                x = x_next


@gluon.jit
def _pass_tile(src, dst, src_full, src_free, dst_full, dst_free, slot, phase, n0, kv_len, ZERO_PAST: gl.constexpr,
               BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Take a copied tile from the ring of bytes, convert it into the consumers' ring, free the
    one and fill the other. Every converter warp's stores are fenced for the tensor cores' reads
    and met at a barrier before the one arrival each."""
    mbarrier.wait(src_full.index(slot), phase)
    mbarrier.wait(dst_free.index(slot), phase ^ 1)
    if ZERO_PAST:
        if n0 + BLOCK_N > kv_len:
            _convert_tile(src.index(slot), dst.index(slot), n0, kv_len, True, BLOCK_N, HEAD_DIM)
        else:
            _convert_tile(src.index(slot), dst.index(slot), n0, kv_len, False, BLOCK_N, HEAD_DIM)
    else:
        _convert_tile(src.index(slot), dst.index(slot), n0, kv_len, False, BLOCK_N, HEAD_DIM)
    fence_async_shared()
    cta_barrier()
    mbarrier.arrive(src_free.index(slot))
    mbarrier.arrive(dst_full.index(slot))


@gluon.jit
def _converter(ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
               GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HAS_WINDOW: gl.constexpr,
               HAS_SINKS: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr, PINGPONG: gl.constexpr,
               KV_FP8: gl.constexpr, V_STAGED: gl.constexpr, CAUSAL: gl.constexpr):
    """fp8 caches: the copied e4m3 tiles into the 16-bit operands the tensor cores read (V always,
    K for a 16-bit query), off the consumers' path (lab/notes/prefill.md "Prefill: fp8 caches in
    the warp-specialised kernel"). V rows past the request are zeroed here, so the consumers skip
    their own zeroing."""
    (stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p,
     num_rows, num_heads, batch, m_tiles, num_tiles, k_num_pages, v_num_pages, capacity, window_left,
     k_page_rows, v_page_rows, k_total_rows, v_total_rows, head_rows, head_cols) = ints
    (q_ptr, out_ptr, k_desc, v_desc, k_table_ptr, v_table_ptr, seq_lens_ptr, cum_q_ptr, sinks_ptr, logit_scale_ptr,
     out_scale_ptr) = ptrs
    q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, turn = bufs
    k_raw, v_raw, k_raw_ready, k_raw_empty, v_raw_ready, v_raw_empty = raw
    c = 0  # tiles through the rings (as the producer counts them)
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        h, b, mt, live, q_start, q_end, p0, kv_len, hi, start, n_tiles, full_lo, full_hi = _tile_of(
            t, num_tiles, num_heads, batch, m_tiles, cum_q_ptr, seq_lens_ptr, num_rows, capacity, window_left, BLOCK_N,
            HAS_WINDOW, CAUSAL)
        if live:
            # K runs a tile ahead of V: K_{j+1}'s buffer falls free when S_{j-1} retires, V_j's only
            # when P_{j-2} V_{j-2} does, at the end of the consumers' iteration j - 1; converted in
            # tile order, K_{j+1} would wait behind V_j, and every iteration would wait for two
            # conversions in turn (lab/notes/prefill.md "Prefill: fp8 caches in the warp-specialised
            # kernel").
            if _converts_k(q_ptr.dtype.element_ty, KV_FP8):
                if n_tiles > 0:
                    _pass_tile(k_raw, k_bufs, k_raw_ready, k_raw_empty, k_ready, k_empty, c % STAGES,
                               (c // STAGES) & 1, start, kv_len, False, BLOCK_N, HEAD_DIM)
            for j in range(n_tiles):
                n0 = start + j * BLOCK_N
                if _converts_k(q_ptr.dtype.element_ty, KV_FP8):
                    if j + 1 < n_tiles:
                        _pass_tile(k_raw, k_bufs, k_raw_ready, k_raw_empty, k_ready, k_empty, (c + 1) % STAGES,
                                   ((c + 1) // STAGES) & 1, n0 + BLOCK_N, kv_len, False, BLOCK_N, HEAD_DIM)
                _pass_tile(v_raw, v_bufs, v_raw_ready, v_raw_empty, v_ready, v_empty, c % STAGES, (c // STAGES) & 1,
                           n0, kv_len, True, BLOCK_N, HEAD_DIM)
                c += 1


# ---------------------------------------------------------------------------------------------
# consumers: two warpgroups
# ---------------------------------------------------------------------------------------------
@gluon.jit
def _turn_wait(turn, pp, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Wait for this warpgroup's turn to issue its products (its ``pp``-th turn). Warpgroup 0
    goes first: its wait ``k`` needs warpgroup 1's turn ``k - 1`` issued (a fresh barrier passes
    parity 1); warpgroup 1's wait ``k`` needs warpgroup 0's turn ``k``."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), (pp & 1) ^ (1 - WG))


@gluon.jit
def _turn_pass(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG))


@gluon.jit
def _softmax_masked(s, m_i, l_i, n0, row_pos, qk_scale, window_left, HAS_WINDOW: gl.constexpr):
    """Online-softmax step of a masked score tile (window edge, diagonal): ``s [64, BLOCK_N]``
    unscaled ``q.k`` of keys from ``n0``. Returns ``(m_i, l_i, p, alpha)`` in base-2 units; a row
    without a visible key so far keeps m = -inf, p = 0, alpha = 0."""
    offs_n = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
    dist = row_pos[:, None] - offs_n[None, :]
    ok = dist >= 0
    if HAS_WINDOW:
        ok = ok & (dist <= window_left)
    s = gl.where(ok, s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_safe[:, None])
    alpha = gl.exp2(m_i - m_safe)
    l_i = l_i * alpha + gl.sum(p, 1)
    return m_new, l_i, p, alpha


@gluon.jit
def _softmax_full(s, m_i, l_i, qk_scale):
    """The same for a tile every row sees whole (the shared :func:`full_tile_softmax`: logits stay
    unscaled until the exponent's FMA)."""
    return full_tile_softmax(m_i, l_i, s, qk_scale)


@gluon.jit
def _zero_rows_past(buf, n0, kv_len, zero_bar, zeroings, WG: gl.constexpr, BLOCK_N: gl.constexpr,
                    HEAD_DIM: gl.constexpr):
    """Zero the rows of the V tile ``buf`` (keys from ``n0``) at or past ``kv_len`` before the P.V
    products of both warpgroups read it. Each warpgroup zeroes its half of the rows (no shared
    memory location is written by one and read or written by the other's loads and stores), then
    both meet on ``zero_bar`` (two arrivals; ``zeroings``: the calls so far, the same count in both
    warpgroups), so each product sees the whole tile zeroed (lab/notes/robustness.md "compute-sanitizer
    over every kernel family")."""
    HALF_N: gl.constexpr = BLOCK_N // 2
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    mine = buf.slice(WG * HALF_N, HALF_N, dim=0)
    rows = n0 + WG * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, ld))
    for d in gl.static_range(HEAD_DIM // COLS):
        part = mine.slice(d * COLS, COLS, dim=1)
        x = part.load(ld)
        part.store(gl.where((rows < kv_len)[:, None], x, 0.0))
    fence_async_shared()
    cta_barrier()
    mbarrier.arrive(zero_bar)
    mbarrier.wait(zero_bar, zeroings & 1)


@gluon.jit
def _fetch_q(dst, t, q_ptr, stride_q_t, stride_q_h, num_tiles, num_heads, batch, m_tiles, cum_q_ptr, seq_lens_ptr,
             num_rows, capacity, window_left, BLOCK_N: gl.constexpr, HAS_WINDOW: gl.constexpr,
             HEAD_DIM: gl.constexpr, WG: gl.constexpr):
    """Start copying this warpgroup's 64 query rows of the program's tile ``t`` into ``dst``
    (``[64, D]``) as one ``cp.async`` group; rows outside the request, and a ``t`` past the last
    tile, copy nothing (their slots are never read as rows of a result)."""
    h, b, mt, live, q_start, q_end, p0, kv_len, hi, start, n_tiles, full_lo, full_hi = _tile_of(
        t, num_tiles, num_heads, batch, m_tiles, cum_q_ptr, seq_lens_ptr, num_rows, capacity, window_left, BLOCK_N,
        HAS_WINDOW, True)  # (the rows only: the key runs go unused)
    VEC: gl.constexpr = 16 // (q_ptr.dtype.element_ty.primitive_bitwidth // 8)
    ld: gl.constexpr = gl.BlockedLayout([1, VEC], _row_threads(HEAD_DIM * 8 // VEC), [4, 1], [1, 0])
    rows = q_start + mt * BLOCK_M + WG * WG_ROWS + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, ld))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, ld))
    ok = (rows >= 0) & (rows < q_end) & live & (t < num_tiles)
    ptr = q_ptr + (rows.to(gl.int64)[:, None] * stride_q_t + h * stride_q_h + cols[None, :])
    cp_async_load(dst, ptr, mask=ok[:, None])
    async_copy.commit_group()


@gluon.jit
def _consumer(ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
              GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HAS_WINDOW: gl.constexpr,
              HAS_SINKS: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr, PINGPONG: gl.constexpr,
              KV_FP8: gl.constexpr, V_STAGED: gl.constexpr, CAUSAL: gl.constexpr, WG: gl.constexpr):
    (stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p,
     num_rows, num_heads, batch, m_tiles, num_tiles, k_num_pages, v_num_pages, capacity, window_left,
     k_page_rows, v_page_rows, k_total_rows, v_total_rows, head_rows, head_cols) = ints
    (q_ptr, out_ptr, k_desc, v_desc, k_table_ptr, v_table_ptr, seq_lens_ptr, cum_q_ptr, sinks_ptr, logit_scale_ptr,
     out_scale_ptr) = ptrs
    q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, turn = bufs
    dt: gl.constexpr = q_ptr.dtype.element_ty
    qk_dt: gl.constexpr = _k_dtype(dt, KV_FP8)
    pv_dt: gl.constexpr = _pv_dtype(dt, KV_FP8)
    # One warpgroup: S [64, BLOCK_N] and O [64, D] as m64 wgmma accumulators, P from registers.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 256 // qk_dt.primitive_bitwidth])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], _row_threads(HEAD_DIM), [4, 1], [1, 0])
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    logit = logit_factor
    if LOGIT_PTR:
        logit = logit * gl.load(logit_scale_ptr)
    qk_scale = gl.abs(logit) * LOG2E
    out_mult = out_factor
    if OUT_PTR:
        out_mult = out_mult * gl.load(out_scale_ptr)
    s_zero = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, layout=s_layout)
    offs_qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_ld))
    offs_od = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))

    zero_bar = turn.index(2)
    c = 0  # tiles through the rings (as the producer counts them)
    pp = 0  # turns taken (PINGPONG)
    zeroings = 0  # calls of _zero_rows_past (both warpgroups count the same)
    Q_SLOTS: gl.constexpr = _q_slots(dt, KV_FP8, V_STAGED, HEAD_DIM, BLOCK_N, STAGES)
    if Q_SLOTS == 2:
        _fetch_q(q_smem.index(WG), gl.program_id(0), q_ptr, stride_q_t, stride_q_h, num_tiles, num_heads, batch,
                 m_tiles, cum_q_ptr, seq_lens_ptr, num_rows, capacity, window_left, BLOCK_N, HAS_WINDOW, HEAD_DIM,
                 WG)
    k = 0  # the program's tiles so far (the query slot of its next one: k % 2)
    for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        h, b, mt, live, q_start, q_end, p0, kv_len, hi, start, n_tiles, full_lo, full_hi = _tile_of(
            t, num_tiles, num_heads, batch, m_tiles, cum_q_ptr, seq_lens_ptr, num_rows, capacity, window_left, BLOCK_N,
            HAS_WINDOW, CAUSAL)
        if Q_SLOTS == 2:
            # This tile's rows arrived (copied during the tile before); every thread's copies are
            # in before any wgmma reads them, and every thread is past the tile before (whose
            # products read the other slot) before that slot is refilled with the next tile's.
            my_q = q_smem.index((k % 2) * 2 + WG)
            async_copy.wait_group(0)
            fence_async_shared()
            cta_barrier()
        else:
            my_q = q_smem.index(WG)
        if live:
            row0 = mt * BLOCK_M + WG * WG_ROWS  # this warpgroup's first row within the request
            if Q_SLOTS == 2:
                if logit < 0:  # the logit's sign folded into q (exact), in place
                    q = my_q.load(q_ld)
                    if dt.is_fp8():  # (no fp8 negation in Triton: the sign bit flipped)
                        q = (q.to(gl.int8, bitcast=True) ^ -128).to(dt, bitcast=True)
                    else:
                        q = -q
                    my_q.store(q)
                    fence_async_shared()
                    cta_barrier()
            else:
                # Stage q (rows past the request read as 0), the logit's sign folded in (exact).
                q_rows = q_start + row0 + gl.arange(0, WG_ROWS, layout=gl.SliceLayout(1, q_ld))
                q_off = q_rows.to(gl.int64)[:, None] * stride_q_t + h * stride_q_h + offs_qd[None, :]
                q = gl.load(q_ptr + q_off, mask=((q_rows >= 0) & (q_rows < q_end))[:, None], other=0.0)
                if dt.is_fp8():  # (no fp8 negation in Triton: the sign bit flipped)
                    q_bits = q.to(gl.int8, bitcast=True)
                    q = gl.where(logit < 0, q_bits ^ -128, q_bits).to(dt, bitcast=True)
                else:
                    q = gl.where(logit < 0, -q, q)
                    if KV_FP8:
                        q = float16_operand(q)
                my_q.store(q)
                fence_async_shared()
                cta_barrier()

            if CAUSAL:
                row_pos = p0 + WG * WG_ROWS + gl.arange(0, WG_ROWS, layout=s_rows)
            else:  # every row masked as the last one: keys past the request only
                row_pos = gl.full([WG_ROWS], 0, gl.int32, layout=s_rows) + (kv_len - 1)
            m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, layout=s_rows)
            l_i = gl.zeros([WG_ROWS], gl.float32, layout=s_rows)
            acc = gl.zeros([WG_ROWS, HEAD_DIM], gl.float32, layout=o_layout)
            if n_tiles > 0:
                # Tile 0: scores only.
                slot = c % STAGES
                mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)
                _turn_wait(turn, pp, WG, PINGPONG)
                s_tok = warpgroup_mma(my_q, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                      is_async=True)
                _turn_pass(turn, WG, PINGPONG)
                pp += 1
                if Q_SLOTS == 2:  # the next tile's rows, their indices read under the first product
                    _fetch_q(q_smem.index(((k + 1) % 2) * 2 + WG), t + gl.num_programs(0), q_ptr, stride_q_t,
                             stride_q_h, num_tiles, num_heads, batch, m_tiles, cum_q_ptr, seq_lens_ptr, num_rows,
                             capacity, window_left, BLOCK_N, HAS_WINDOW, HEAD_DIM, WG)
                s = warpgroup_mma_wait(0, deps=[s_tok])
                mbarrier.arrive(k_empty.index(slot))
                if (start < full_lo) | (start >= full_hi):
                    m_i, l_i, p, alpha = _softmax_masked(s, m_i, l_i, start, row_pos, qk_scale, window_left,
                                                         HAS_WINDOW)
                else:
                    m_i, l_i, p, alpha = _softmax_full(s, m_i, l_i, qk_scale)
                p_op = gl.convert_layout(p.to(pv_dt), p_layout)
                prev = slot
                prev_phase = (c // STAGES) & 1
                prev_n0 = start
                c += 1
                for j in range(1, n_tiles):
                    n0 = start + j * BLOCK_N
                    slot = c % STAGES
                    mbarrier.wait(k_ready.index(slot), (c // STAGES) & 1)
                    mbarrier.wait(v_ready.index(prev), prev_phase)
                    if not KV_FP8:  # (fp8 caches: the converter zeroes those rows)
                        if prev_n0 + BLOCK_N > kv_len:
                            _zero_rows_past(v_bufs.index(prev), prev_n0, kv_len, zero_bar, zeroings, WG, BLOCK_N,
                                            HEAD_DIM)
                            zeroings += 1
                    _turn_wait(turn, pp, WG, PINGPONG)
                    s_tok = warpgroup_mma(my_q, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                          is_async=True)
                    o_tok = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
                    _turn_pass(turn, WG, PINGPONG)
                    pp += 1
                    # The softmax of tile j runs while P_{j-1} V_{j-1} is in flight.
                    s = warpgroup_mma_wait(1, deps=[s_tok])
                    mbarrier.arrive(k_empty.index(slot))
                    # The whole softmax sits inside the branch: ptxas schedules within a basic block
                    # and would otherwise hoist the wait below above it (lab/notes/prefill.md
                    # "Prefill: warp-specialised Gluon kernel").
                    if (n0 < full_lo) | (n0 >= full_hi):
                        m_i, l_i, p, alpha = _softmax_masked(s, m_i, l_i, n0, row_pos, qk_scale, window_left,
                                                             HAS_WINDOW)
                    else:
                        m_i, l_i, p, alpha = _softmax_full(s, m_i, l_i, qk_scale)
                    acc = warpgroup_mma_wait(0, deps=[o_tok])
                    mbarrier.arrive(v_empty.index(prev))
                    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
                    # P packed only now: the in-flight product still reads the registers of the
                    # previous P, which the new one reuses.
                    p_op = gl.convert_layout(p.to(pv_dt), p_layout)
                    prev = slot
                    prev_phase = (c // STAGES) & 1
                    prev_n0 = n0
                    c += 1
                # The last tile's values.
                mbarrier.wait(v_ready.index(prev), prev_phase)
                if not KV_FP8:
                    if prev_n0 + BLOCK_N > kv_len:
                        _zero_rows_past(v_bufs.index(prev), prev_n0, kv_len, zero_bar, zeroings, WG, BLOCK_N,
                                        HEAD_DIM)
                        zeroings += 1
                _turn_wait(turn, pp, WG, PINGPONG)
                o_tok = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
                _turn_pass(turn, WG, PINGPONG)
                pp += 1
                acc = warpgroup_mma_wait(0, deps=[o_tok])
                mbarrier.arrive(v_empty.index(prev))

            # o = acc / (l + sink term); rows without a visible key give 0.
            m_o = gl.convert_layout(m_i, o_rows)
            denom = gl.convert_layout(l_i, o_rows)
            if HAS_SINKS:
                sink2 = gl.load(sinks_ptr + h).to(gl.float32) * LOG2E
                denom = denom + gl.exp2(sink2 - gl.where(m_o == float("-inf"), 0.0, m_o))
            o = acc * (out_mult / gl.where(denom > 0, denom, 1.0))[:, None]
            o_rows_idx = q_start + row0 + gl.arange(0, WG_ROWS, layout=o_rows)
            o_off = o_rows_idx.to(gl.int64)[:, None] * stride_o_t + h * stride_o_h + offs_od[None, :]
            o_ok = (o_rows_idx >= 0) & (o_rows_idx < q_end)
            gl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=o_ok[:, None])
        if Q_SLOTS == 2:
            if (not live) | (n_tiles == 0):  # (no product to read the next tile's indices under)
                _fetch_q(q_smem.index(((k + 1) % 2) * 2 + WG), t + gl.num_programs(0), q_ptr, stride_q_t, stride_q_h,
                         num_tiles, num_heads, batch, m_tiles, cum_q_ptr, seq_lens_ptr, num_rows, capacity,
                         window_left, BLOCK_N, HAS_WINDOW, HEAD_DIM, WG)
        k += 1
    if Q_SLOTS == 2:
        async_copy.wait_group(0)  # (the copy past the program's last tile, which copies nothing)


# One function a consumer partition: gl.warp_specialize takes a function per partition, and the
# warpgroup's index must be a constexpr of _consumer (it picks the warpgroup's query rows, its half
# of the zeroing and its ping-pong barrier at compile time).
@gluon.jit
def _consumer0(ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
               GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HAS_WINDOW: gl.constexpr,
               HAS_SINKS: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr, PINGPONG: gl.constexpr,
               KV_FP8: gl.constexpr, V_STAGED: gl.constexpr, CAUSAL: gl.constexpr):
    _consumer(ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP, BLOCK_N, STAGES, HAS_WINDOW,
              HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL, 0)


@gluon.jit
def _consumer1(ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr,
               GROUP: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, HAS_WINDOW: gl.constexpr,
               HAS_SINKS: gl.constexpr, LOGIT_PTR: gl.constexpr, OUT_PTR: gl.constexpr, PINGPONG: gl.constexpr,
               KV_FP8: gl.constexpr, V_STAGED: gl.constexpr, CAUSAL: gl.constexpr):
    _consumer(ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP, BLOCK_N, STAGES, HAS_WINDOW,
              HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL, 1)


@gluon.jit
def prefill_ws_kernel(
    q_ptr,  # [sum_q, Hq, D] fp16/bf16/e4m3 query rows (last dim contiguous)
    out_ptr,  # [sum_q, Hq, D] fp16/bf16 output (last dim contiguous)
    k_desc,  # TMA descriptor of the K pages as [rows, cols] (see tma_view), box [min(page, BLOCK_N), 128 bytes]
    v_desc,  # same for V
    k_table_ptr,  # [B, pages_per_seq] int32 page ids of K
    v_table_ptr,  # [B, pages_per_seq] int32 page ids of V
    seq_lens_ptr,  # [B] int32 KV lengths
    cum_q_ptr,  # [B + 1] int32 / int64 query row offsets
    sinks_ptr,  # [Hq] float32 (HAS_SINKS)
    logit_scale_ptr,  # [1] float32 (LOGIT_PTR)
    out_scale_ptr,  # [1] float32 (OUT_PTR)
    stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p,
    num_rows, num_heads, batch, m_tiles, num_tiles, k_num_pages, v_num_pages, capacity, window_left,
    k_page_rows, v_page_rows, k_total_rows, v_total_rows, head_rows, head_cols,
    logit_factor, out_factor,
    HEAD_DIM: gl.constexpr, PAGE_SIZE: gl.constexpr, GROUP: gl.constexpr, BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr, HAS_WINDOW: gl.constexpr, HAS_SINKS: gl.constexpr, LOGIT_PTR: gl.constexpr,
    OUT_PTR: gl.constexpr, PINGPONG: gl.constexpr, KV_FP8: gl.constexpr, V_STAGED: gl.constexpr,
    CAUSAL: gl.constexpr,
):
    dt: gl.constexpr = q_ptr.dtype.element_ty
    qk_dt: gl.constexpr = _k_dtype(dt, KV_FP8)
    pv_dt: gl.constexpr = _pv_dtype(dt, KV_FP8)
    q_smem_layout: gl.constexpr = row_smem(HEAD_DIM, qk_dt.primitive_bitwidth // 8)
    pv_smem_layout: gl.constexpr = row_smem(HEAD_DIM, 2)
    # The consumers' operands: q and K in the score product's type, V in P's.
    # Query slots: [slot * 2 + warpgroup] (see _q_slots).
    q_smem = gl.allocate_shared_memory(qk_dt, [2 * _q_slots(dt, KV_FP8, V_STAGED, HEAD_DIM, BLOCK_N, STAGES), WG_ROWS,
                                               HEAD_DIM], q_smem_layout)
    k_bufs = gl.allocate_shared_memory(qk_dt, [STAGES, BLOCK_N, HEAD_DIM], q_smem_layout)
    v_bufs = gl.allocate_shared_memory(pv_dt, [STAGES, BLOCK_N, HEAD_DIM], pv_smem_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # turn: the ping-pong's two barriers, then the zeroing's meeting point (see _zero_rows_past).
    turn = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrival a consumer warpgroup
        mbarrier.init(v_empty.index(i), count=2)
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    mbarrier.init(turn.index(2), count=2)
    if _converter_on(dt, KV_FP8, V_STAGED):
        # The rings of copied bytes the converter reads (K's only where it converts K).
        byte_smem: gl.constexpr = row_smem(HEAD_DIM, 1)
        v_raw = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, HEAD_DIM], byte_smem)
        if _converts_k(dt, KV_FP8):
            k_raw = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, HEAD_DIM], byte_smem)
        else:
            k_raw = v_raw  # (unused)
        k_raw_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_raw_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_raw_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_raw_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_raw_ready.index(i), count=1)
            mbarrier.init(k_raw_empty.index(i), count=1)
            mbarrier.init(v_raw_ready.index(i), count=1)
            mbarrier.init(v_raw_empty.index(i), count=1)
        raw = (k_raw, v_raw, k_raw_ready, k_raw_empty, v_raw_ready, v_raw_empty)
    else:
        raw = (k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty)  # (unused)

    # Every partition takes the same arguments (tuples of runtime values; the constexprs written out
    # in each call: constexprs bound to a variable first would become runtime values).
    ptrs = (q_ptr, out_ptr, k_desc, v_desc, k_table_ptr, v_table_ptr, seq_lens_ptr, cum_q_ptr, sinks_ptr,
            logit_scale_ptr, out_scale_ptr)
    bufs = (q_smem, k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty, turn)
    ints = (stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_kt_b, stride_kt_p, stride_vt_b, stride_vt_p,
            num_rows, num_heads, batch, m_tiles, num_tiles, k_num_pages, v_num_pages, capacity, window_left,
            k_page_rows, v_page_rows, k_total_rows, v_total_rows, head_rows, head_cols)
    if _converter_on(dt, KV_FP8, V_STAGED):
        # A fourth partition, two converter warps beside the producer warp in the last warpgroup:
        # 40 registers there leave the consumers 232 each (12 warps at maxnreg 168).
        gl.warp_specialize([
            (_consumer0, (ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP,
                          BLOCK_N, STAGES, HAS_WINDOW, HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL)),
            (_consumer1, (ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP,
                          BLOCK_N, STAGES, HAS_WINDOW, HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL)),
            (_producer, (ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP,
                         BLOCK_N, STAGES, HAS_WINDOW, HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL)),
            (_converter, (ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP,
                          BLOCK_N, STAGES, HAS_WINDOW, HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL)),
        ], [4, 1, CONV_WARPS], [CONSUMER_REGS_FP8, CONVERTER_REGS, CONVERTER_REGS])
    else:
        gl.warp_specialize([
            (_consumer0, (ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP,
                          BLOCK_N, STAGES, HAS_WINDOW, HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL)),
            (_consumer1, (ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP,
                          BLOCK_N, STAGES, HAS_WINDOW, HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL)),
            (_producer, (ptrs, bufs, raw, ints, logit_factor, out_factor, HEAD_DIM, PAGE_SIZE, GROUP,
                         BLOCK_N, STAGES, HAS_WINDOW, HAS_SINKS, LOGIT_PTR, OUT_PTR, PINGPONG, KV_FP8, V_STAGED, CAUSAL)),
        ], [4, 1], [240, 24])  # registers: 12 warps at maxnreg 168; the producer's warpgroup keeps 24


__all__ = ["prefill_ws_kernel"]
