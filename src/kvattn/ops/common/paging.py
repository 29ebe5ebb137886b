"""Page addressing (``@triton.jit``): page ids from a request's page-table row, token offsets in
strided caches (64-bit), a tile's pages a run of rows at a time, and an L2 prefetch of rows ahead
of the pipelined copies."""

from __future__ import annotations

import triton
import triton.language as tl

try:  # threads of the program, for the inline-asm prefetch (CUDA builds of Triton)
    from triton.language.extra.cuda import num_threads
except ImportError:  # pragma: no cover
    num_threads = None

from .kv_formats import has_block_scales


@triton.jit
def load_page_ids(table_row_ptr, stride_table_p, offs_n, tok_ok, num_pages, PAGE_SIZE: tl.constexpr,
                  PAGED: tl.constexpr):
    """int32 ``[N]``: the page id of each token ``offs_n`` of one request (``table_row_ptr``: its
    row of the page table), or -1 where the token is not ``tok_ok`` or its id lies outside
    ``[0, num_pages)``. Only ``tok_ok`` tokens read the table, so entries past a request's last page
    are never touched, and no caller dereferences memory outside the cache whatever the table holds.
    Not PAGED: zeros (one contiguous sequence)."""
    if PAGED:
        ids = tl.load(table_row_ptr + (offs_n // PAGE_SIZE) * stride_table_p, mask=tok_ok, other=-1)
        return tl.where(ids < num_pages, ids, -1)
    else:
        return tl.zeros(offs_n.shape, dtype=tl.int32)


@triton.jit
def token_pages(page_ids, offs_n, tok_ok, PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr):
    """``(page, slot, ok)`` int64/int64/bool ``[N]`` of tokens ``offs_n`` from :func:`load_page_ids`.

    Everything derives from the ids alone (their -1 already folds in the token range), which keeps
    the ids free to ride through a loop in registers. Not PAGED: page 0, slot = token.
    """
    if PAGED:
        ok = page_ids >= 0
        page = tl.maximum(page_ids, 0).to(tl.int64)
        slot = (offs_n % PAGE_SIZE).to(tl.int64)
    else:
        ok = tok_ok
        page = tl.zeros(offs_n.shape, dtype=tl.int64)
        slot = offs_n.to(tl.int64)
    return page, slot, ok


@triton.jit
def token_offsets(page, slot, head, stride_page, stride_slot, stride_head):
    """int64 element offsets ``[N]`` of one head's vector of each token (64-bit: caches pass 2^31)."""
    return page * stride_page + slot * stride_slot + head.to(tl.int64) * stride_head


@triton.jit
def kv_token_offsets(page, slot, head, stride_page, stride_slot, stride_head, stride_sf_page, stride_sf_slot,
                     stride_sf_head, KV_FORMAT: tl.constexpr):
    """``(tok_off, sf_off)``: :func:`token_offsets` of each token's vector in the cache and, for a
    block-scaled cache (NVFP4), of its row of block scales (others: ``tok_off`` again, unused)."""
    tok_off = token_offsets(page, slot, head, stride_page, stride_slot, stride_head)
    sf_off = tok_off
    if has_block_scales(KV_FORMAT):
        sf_off = token_offsets(page, slot, head, stride_sf_page, stride_sf_slot, stride_sf_head)
    return tok_off, sf_off


@triton.jit
def page_token_offsets(page_ids, offs_n, head, stride_page, stride_slot, stride_head, PAGE_SIZE: tl.constexpr):
    """int64 ``[N]``: :func:`token_offsets` of tokens ``offs_n`` of a paged cache from their
    :func:`load_page_ids`, or -16 where the id is unusable (-1; negative, and a multiple of 16 as
    the offsets are declared): a caller reads token ``n`` only where its offset is >= 0 (strides
    are >= 0), so the offsets alone carry the validity.

    Why: computed where the ids are loaded (one id a thread), the full 64-bit multiply-add is one
    a thread a tile; the load layout's threads, each holding several rows of several pages, then
    receive the offsets instead of the ids (lab/notes/formats.md "Formats: where the fp8 decode
    loop's instructions go", candidate b)."""
    ok = page_ids >= 0
    off = token_offsets(tl.maximum(page_ids, 0).to(tl.int64), (offs_n % PAGE_SIZE).to(tl.int64), head,
                        stride_page, stride_slot, stride_head)
    return tl.multiple_of(tl.where(ok, off, -16), 16)


@triton.jit
def load_run_ids(table_row_ptr, stride_table_p, tile_start, end, num_pages, PAGE_SIZE: tl.constexpr,
                 PAGE_RUN: tl.constexpr, RUNS: tl.constexpr):
    """The page ids (a tuple of RUNS int32 scalars) of the tile of ``RUNS * PAGE_RUN`` keys from
    token ``tile_start``, one a run of ``PAGE_RUN`` rows in one page, or -1 where the id lies
    outside ``[0, num_pages)`` or the run holds no key before ``end`` (its table entry is not read,
    as :func:`load_page_ids` reads only the entries of the tokens it loads).

    ``tile_start`` (>= 0) is a multiple of the tile, which holds whole pages (``PAGE_RUN ==
    PAGE_SIZE``) or lies in one (``RUNS == 1``): run p is page ``tile_start // PAGE_SIZE + p``."""
    first = (tl.cast(tile_start, tl.uint32) // PAGE_SIZE).to(tl.int32)  # (unsigned: no sign fix-up)
    ids = ()
    for p in tl.static_range(RUNS):
        page_id = tl.load(table_row_ptr + (first + p) * stride_table_p, mask=tile_start + p * PAGE_RUN < end,
                          other=-1)
        ids = ids + (tl.where(page_id < num_pages, page_id, -1),)
    return ids


@triton.jit
def run_pages(ids, row_run, stride_page, lim, RUNS: tl.constexpr):
    """``(page_off, rows_lim)`` of a tile from its runs' page ids (:func:`load_run_ids`): the int64
    offset ``id * stride_page`` of each run's page, one scalar for one run, else ``[N, 1]`` (row
    n's run: ``row_run[n]``), and how many of the tile's rows may load, ``lim`` or (an unusable id,
    whose page is taken as page 0) 0, likewise a scalar or ``[N]``.

    Why: a tile in one page (or of whole pages) needs one id and one 64-bit multiply a run, where
    offsets a token cost each thread one a row it loads (lab/notes/formats.md "Formats: where the
    fp8 decode loop's instructions go"). The selects between runs depend on a row's place only,
    which the compiler folds to one run a register."""
    page_off = tl.maximum(ids[0], 0).to(tl.int64) * stride_page
    rows_lim = tl.where(ids[0] >= 0, lim, 0)
    for p in tl.static_range(1, RUNS):
        page_off = tl.where(row_run == p, tl.maximum(ids[p], 0).to(tl.int64) * stride_page, page_off)
        rows_lim = tl.where(row_run == p, tl.where(ids[p] >= 0, lim, 0), rows_lim)
    if RUNS > 1:
        page_off = page_off[:, None]
    return page_off, rows_lim


@triton.jit
def prefetch_rows_l2(row0_ptr, stride_row_bytes, num_rows, ROWS: tl.constexpr, ROW_BYTES: tl.constexpr):
    """Ask L2 for every 128-byte line of rows ``0 .. min(ROWS, num_rows) - 1`` of the strided array
    at ``row0_ptr`` (``stride_row_bytes`` apart), without waiting: a hint, nothing reaches registers.

    Why: the pipelined K/V copies start only after a program's setup (staging the query through
    shared memory waits for its load; RoPE builds float64 / precise-trig tables), so the programs of
    a one-wave launch would all leave the memory system idle for that long. Asked for at the
    program's start, the first tiles come from DRAM while the setup runs.

    Each thread derives its line from its thread index inside the asm, so the hint holds a few
    scalar registers, not a tensor of addresses (callers: mind what the arguments keep live, see
    decode/kernels.py).
    """
    NUM_THREADS: tl.constexpr = num_threads()
    LINES: tl.constexpr = (ROW_BYTES + 127) // 128
    LOG2_LINES: tl.constexpr = 0 if LINES == 1 else (1 if LINES == 2 else (2 if LINES == 4 else 3))
    rows = tl.minimum(num_rows, ROWS)
    for first in tl.static_range(0, ROWS * LINES, NUM_THREADS):
        tl.inline_asm_elementwise(
            """{
            .reg .pred p;
            .reg .u32 t, r, l;
            .reg .u64 o, a;
            mov.u32 t, %tid.x;
            add.u32 t, t, $4;
            shr.u32 r, t, $5;
            setp.lt.s32 p, r, $3;
            mov.u32 l, 1;
            shl.b32 l, l, $5;
            sub.u32 l, l, 1;
            and.b32 l, t, l;
            shl.b32 l, l, 7;
            mul.wide.u32 o, r, $2;
            add.u64 a, $1, o;
            cvt.u64.u32 o, l;
            add.u64 a, a, o;
            @p prefetch.global.L2 [a];
            mov.b32 $0, 0;
            }""",
            "=r,l,r,r,r,r", [row0_ptr, stride_row_bytes, rows, first, LOG2_LINES],
            dtype=tl.int32, is_pure=False, pack=1,
        )
