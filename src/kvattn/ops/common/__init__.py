"""``@triton.jit`` building blocks shared by the decode, prefill and MLA kernel families.

Conventions: logits are kept in base-2 units (``s * log2(e)``) so every exponential is an ``exp2``;
a disallowed key has logit ``-inf`` and probability exactly 0; the running max may be ``-inf`` (no
key seen yet) and every helper guards that case instead of producing NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..._device import is_interpreter

try:  # threads of the program, for the inline-asm prefetch (CUDA builds of Triton)
    from triton.language.extra.cuda import num_threads
except ImportError:  # pragma: no cover
    num_threads = None
try:  # the multifunction unit's sin/cos; the interpreter has no libdevice
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover
    libdevice = None

FAST_TRIG: tl.constexpr = tl.constexpr(libdevice is not None and not is_interpreter())
LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
# 2*pi split into three float32 parts (Cody-Waite): k * TWO_PI_A is exact for the k we meet.
TWO_PI_A: tl.constexpr = tl.constexpr(6.28125)
TWO_PI_B: tl.constexpr = tl.constexpr(0.0019353071693331003)
TWO_PI_C: tl.constexpr = tl.constexpr(1.0253131677018246e-11)
INV_TWO_PI: tl.constexpr = tl.constexpr(0.15915494309189535)

# Cache element formats (the KV_FORMAT constexpr).
KV_HALF: tl.constexpr = tl.constexpr(0)  # float16 / bfloat16
KV_FP8: tl.constexpr = tl.constexpr(1)  # float8_e4m3fn raw values
KV_NVFP4: tl.constexpr = tl.constexpr(2)  # uint8, two e2m1 codes a byte, e4m3 scale per 16 elements
# fp8 again, read as 32-bit words and converted to float16 in registers (GPU only: inline PTX; the
# launcher picks it when every row of the cache is 4-byte aligned). See load_kv_tile.
KV_FP8_WORDS: tl.constexpr = tl.constexpr(3)
# NVFP4 again, its codes and block scales read as 32-bit words and converted in registers (GPU
# only: inline PTX; the launcher picks it when every row of codes and of scales is 4-byte aligned,
# D a multiple of 64, and the GPU converts fp8 pairs). See load_kv_tile.
KV_NVFP4_WORDS: tl.constexpr = tl.constexpr(4)
FP8_MAX: tl.constexpr = tl.constexpr(448.0)


# ---------------------------------------------------------------------------------------------
# online softmax
# ---------------------------------------------------------------------------------------------
@triton.jit
def online_softmax_step(m_i, l_i, s, KEYS_FIRST: tl.constexpr = False):
    """One tile of the streaming softmax.

    ``s [M, N]`` base-2 logits (-inf: disallowed), or ``[N, M]`` with ``KEYS_FIRST`` (a tile
    computed as ``K Q^T``); ``m_i, l_i [M]`` running max / denominator. Returns
    ``(m_new, l_new, p, alpha)`` (``p`` shaped like ``s``): the caller rescales its accumulator by
    ``alpha`` and adds ``p @ V``.
    """
    KEY_AXIS: tl.constexpr = 0 if KEYS_FIRST else 1
    m_new = tl.maximum(m_i, tl.max(s, KEY_AXIS))
    # A row that has seen no allowed key keeps m = -inf; subtracting 0 instead keeps p = 0, alpha = 0.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    if KEYS_FIRST:
        p = tl.exp2(s - m_safe[None, :])
    else:
        p = tl.exp2(s - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, KEY_AXIS)
    return m_new, l_new, p, alpha


@triton.jit
def softmax_finalize(acc, m_i, l_i, sink2, HAS_SINKS: tl.constexpr):
    """``(o, lse2)`` of a finished row: ``o = acc / (l + sink term)``, ``lse2 = m + log2(l)``.

    ``sink2 [M]``: the rows' sinks in base-2 units (denominator only, never in the max or the LSE).
    Rows without an allowed key give o = 0 and lse2 = -inf.
    """
    lse2 = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    denom = l_i
    if HAS_SINKS:
        m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
        denom = l_i + tl.exp2(sink2 - m_safe)
    o = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    return o, lse2


@triton.jit
def merge_partials(part_o_ptr, part_lse_ptr, p_row, row_ok, split_stride, num_splits,
                   HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, UNROLL: tl.constexpr):
    """``(m, den, acc)`` of rows merged from their split partials, for :func:`softmax_finalize`.

    ``p_row [R]`` int64: each row's index in split 0 of ``part_lse [num_splits, split_stride]``
    (base-2 LSEs, -inf: an empty split) and of ``part_o [num_splits, split_stride, HEAD_DIM]``
    (normalised outputs). Returns the running max ``m [R]``, ``den [R] = sum_s 2^(lse_s - m)`` and
    ``acc [R, D] = sum_s 2^(lse_s - m) o_s``: the softmax state of all the rows' keys, so
    ``softmax_finalize(acc, m, den, ...)`` gives the exact output and LSE.

    ``BLOCK_S`` splits a round, their loads issued together, in one of two forms (measured on an
    H100, benchmarks/NOTES.md): one ``[S, R, D]`` tile summed over S (the combine kernel's; at the
    end of the decode kernel it took ~5 us a round), or with ``UNROLL`` S separate ``[R]`` and
    ``[R, D]`` tiles folded in turn, elementwise (the decode kernel's in-kernel merge: ~one L2
    round trip a round). Loads go to L2 (``.cg``): a program merging other programs' partials must
    not read its SM's L1.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    m = tl.full(p_row.shape, float("-inf"), dtype=tl.float32)
    den = tl.zeros(p_row.shape, dtype=tl.float32)
    acc = tl.zeros([p_row.shape[0], HEAD_DIM], dtype=tl.float32)
    stride64 = tl.zeros_like(p_row) + split_stride  # [R] int64: offsets past 2^31 stay exact
    for s0 in range(0, num_splits, BLOCK_S):
        if UNROLL:
            m_new = m
            for j in tl.static_range(BLOCK_S):
                lse_j = tl.load(part_lse_ptr + p_row + stride64 * (s0 + j), mask=(s0 + j < num_splits) & row_ok,
                                other=float("-inf"), cache_modifier=".cg")
                m_new = tl.maximum(m_new, lse_j)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)  # 0 while m is -inf
            den = den * alpha
            acc = acc * alpha[:, None]
            for j in tl.static_range(BLOCK_S):
                row_j = p_row + stride64 * (s0 + j)
                ok_j = (s0 + j < num_splits) & row_ok
                lse_j = tl.load(part_lse_ptr + row_j, mask=ok_j, other=float("-inf"), cache_modifier=".cg")
                o_j = tl.load(part_o_ptr + row_j[:, None] * HEAD_DIM + offs_d[None, :], mask=ok_j[:, None], other=0.0,
                              cache_modifier=".cg")
                w_j = tl.exp2(lse_j - m_safe)
                den += w_j
                acc += w_j[:, None] * o_j
        else:
            offs_s = tl.arange(0, BLOCK_S)
            rows = (s0 + offs_s).to(tl.int64)[:, None] * split_stride + p_row[None, :]  # [S, R]
            ok = (s0 + offs_s < num_splits)[:, None] & row_ok[None, :]
            lse_i = tl.load(part_lse_ptr + rows, mask=ok, other=float("-inf"), cache_modifier=".cg")
            o_i = tl.load(part_o_ptr + rows[:, :, None] * HEAD_DIM + offs_d[None, None, :], mask=ok[:, :, None],
                          other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse_i, 0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)
            w = tl.exp2(lse_i - m_safe[None, :])
            den = den * alpha + tl.sum(w, 0)
            acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * o_i, 0)
        m = m_new
    return m, den, acc


# ---------------------------------------------------------------------------------------------
# split-KV work division
# ---------------------------------------------------------------------------------------------
@triton.jit
def split_bounds(kv_len, kv_lo, num_splits, BLOCK_N: tl.constexpr):
    """``chunk``: the keys ``[kv_lo, kv_len)`` cut into chunks of ``chunk`` tokens (a multiple of
    BLOCK_N), balanced for this request; split ``s`` takes ``[kv_lo + s * chunk, +chunk)``, clipped
    to ``kv_len`` (empty for the splits a short request leaves idle)."""
    span = tl.maximum(kv_len - kv_lo, 0)
    chunk = tl.cdiv(tl.cdiv(span, num_splits), BLOCK_N) * BLOCK_N
    return tl.maximum(chunk, BLOCK_N)


# ---------------------------------------------------------------------------------------------
# masking rules
# ---------------------------------------------------------------------------------------------
@triton.jit
def window_causal_allowed(row_pos, offs_n, window_left, HAS_WINDOW: tl.constexpr):
    """bool ``[M, N]``: key ``j`` is visible to a query at ``p`` iff ``j <= p`` and ``p - j <= w``."""
    dist = row_pos[:, None] - offs_n[None, :]
    ok = dist >= 0
    if HAS_WINDOW:
        ok = ok & (dist <= window_left)
    return ok


@triton.jit
def spec_draft_allowed(row_idx, row_ok, c, mask_row_ptr, stride_mask_r, q_len, HAS_MASK: tl.constexpr):
    """bool ``[M, N]``: draft key ``c`` (index among the request's ``q_len`` drafts, negative for
    older keys) visible to draft row ``row_idx``: mask bit ``c % 16`` of word ``c // 16`` of the
    row, or ``c <= row`` (causal) without a mask. False where ``c < 0``.

    ``mask_row_ptr``: the request's ``[q_len, words]`` uint16 rows (loaded as int16).
    """
    is_draft = (c >= 0) & (c < q_len)
    if HAS_MASK:
        cc = tl.where(is_draft, c, 0)
        ld = is_draft & row_ok[:, None]
        word = tl.load(mask_row_ptr + row_idx[:, None] * stride_mask_r + cc // 16, mask=ld, other=0)
        bit = (word.to(tl.int32) >> (cc % 16)) & 1
        return ld & (bit != 0)
    else:
        return is_draft & (c <= row_idx[:, None])


@triton.jit
def sink_logits2(sinks_ptr, heads, row_ok, HAS_SINKS: tl.constexpr):
    """The rows' sinks in base-2 units (float32 ``[Hq]`` in natural units), 0 without sinks."""
    if HAS_SINKS:
        return tl.load(sinks_ptr + heads, mask=row_ok, other=0.0).to(tl.float32) * LOG2E
    else:
        return tl.zeros(heads.shape, dtype=tl.float32)


# ---------------------------------------------------------------------------------------------
# page addressing
# ---------------------------------------------------------------------------------------------
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


@triton.constexpr_function
def is_nvfp4(kv_format):
    """Whether a KV_FORMAT is NVFP4, read byte by byte (KV_NVFP4) or as words (KV_NVFP4_WORDS)."""
    return kv_format in (KV_NVFP4.value, KV_NVFP4_WORDS.value)


@triton.jit
def kv_token_offsets(page, slot, head, stride_page, stride_slot, stride_head, stride_sf_page, stride_sf_slot,
                     stride_sf_head, KV_FORMAT: tl.constexpr):
    """``(tok_off, sf_off)``: :func:`token_offsets` of each token's vector in the cache and, for an
    NVFP4 cache, of its row of block scales (others: ``tok_off`` again, unused)."""
    tok_off = token_offsets(page, slot, head, stride_page, stride_slot, stride_head)
    sf_off = tok_off
    if is_nvfp4(KV_FORMAT):
        sf_off = token_offsets(page, slot, head, stride_sf_page, stride_sf_slot, stride_sf_head)
    return tok_off, sf_off


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
    decode_kernels).
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


# ---------------------------------------------------------------------------------------------
# dequantisation
# ---------------------------------------------------------------------------------------------
@triton.jit
def e2m1_values(code):
    """float16 values of 4-bit e2m1 codes (int32 0..15): sign bit 3, magnitude index
    ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``.

    The code's sign, exponent and mantissa bits moved to a float16's (bits 15, 11-10, 9) read as
    the value times 2^-14, zero and the subnormal 0.5 included; one exact multiply restores it.
    A few integer operations an element instead of an exp2 and selects.
    """
    bits = ((code & 7) << 9) | ((code & 8) << 12)
    return bits.to(tl.int16).to(tl.float16, bitcast=True) * 16384.0


def _nvfp4_pairs_ptx() -> str:
    """PTX of :func:`nvfp4_words_f16`: for j < 4, nibbles j and j + 4 of the code word ``$8`` into
    the two halves of one register (magnitude bits to 9-11: shift 9 - 4j; sign to 15: shift
    12 - 4j), the value times 2^-14; then times the block scale ``$9`` (exact: a multiple of 2^-24
    under 0.17) and 2^14 (``k``); out as ``$2j, $2j+1``."""
    lines = [".reg .b32 a, b, x, m, k, s;", "mov.b32 m, 0x0E000E00;", "mov.b32 k, 0x74007400;",
             "mov.b32 s, {$9, $9};"]
    for j in range(4):
        mag, sign = 9 - 4 * j, 12 - 4 * j
        lines.append(f"shl.b32 a, $8, {mag};" if mag > 0 else f"shr.u32 a, $8, {-mag};")
        if sign:
            lines += [f"shl.b32 b, $8, {sign};", "and.b32 b, b, 0x80008000;"]
        else:
            lines.append("and.b32 b, $8, 0x80008000;")
        lines += ["lop3.b32 x, a, m, b, 0xEA;", "mul.rn.f16x2 x, x, s;", "mul.rn.f16x2 x, x, k;",
                  f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, x;"]
    return "{\n" + "\n".join(lines) + "\n}"


NVFP4_PAIRS_PTX: tl.constexpr = tl.constexpr(_nvfp4_pairs_ptx())


@triton.jit
def nvfp4_words_f16(w, scale):
    """float16 ``[R, 8 C]``: the e2m1 codes of int32 words ``w [R, C]`` in memory order (nibble j
    of word c, from the least significant, is element 8c + j) times their block's float16
    ``scale [R, C]`` (a word's eight codes share one block). As :func:`e2m1_values` computes the
    codes, but two at a time (codes j and j + 4 of a word in the halves of one register), with the
    scale applied in the same packed instructions (``NVFP4_PAIRS_PTX``). GPU only."""
    e0, e4, e1, e5, e2, e6, e3, e7 = tl.inline_asm_elementwise(
        NVFP4_PAIRS_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [w, scale], dtype=(tl.float16,) * 8, is_pure=True,
        pack=1)
    # flat position k = 4a + 2b + c of join(join(join(., .)_a, .)_b, .)_c: e_k at c = k & 1,
    # b = (k >> 1) & 1, a = k >> 2
    t = tl.join(tl.join(tl.join(e0, e4), tl.join(e2, e6)), tl.join(tl.join(e1, e5), tl.join(e3, e7)))
    return tl.reshape(t, (w.shape[0], 8 * w.shape[1]))


@triton.jit
def e4m3_words_f16(w):
    """float16 ``[R, 4 C]`` of the fp8-e4m3 bytes of int32 words ``w [R, C]`` in memory order
    (byte j of word c is element 4c + j): exact, two conversions a word (GPU only: inline PTX)."""
    # bytes 0..3 of a word -> elements 4i .. 4i+3 (cvt: the upper byte goes to the upper half)
    e0, e1, e2, e3 = tl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        .reg .b32 x, y;
        mov.b32 {lo, hi}, $4;
        cvt.rn.f16x2.e4m3x2 x, lo;
        cvt.rn.f16x2.e4m3x2 y, hi;
        mov.b32 {$0, $1}, x;
        mov.b32 {$2, $3}, y;
        }""",
        "=h,=h,=h,=h,r", [w], dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=1)
    # join(join(e0, e2), join(e1, e3))[i, w, m, j] = e(2m + j): flattened in element order
    return tl.reshape(tl.join(tl.join(e0, e2), tl.join(e1, e3)), (w.shape[0], 4 * w.shape[1]))


@triton.jit
def tma_kv_tile(desc, kvh, start, COL0: tl.constexpr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    """``[ROWS, WIDTH]`` tile of a contiguous 16-bit cache by TMA: tokens ``start ..`` of head
    ``kvh``, columns ``COL0 ..``. ``desc`` views the cache as ``[Hkv, L, D]`` with a ``[1, ROWS,
    WIDTH]`` box; tokens past ``L`` read as zeros (TMA's out-of-bounds fill), and the caller masks
    every key outside its range in the scores, as it does for masked register loads."""
    return tl.reshape(desc.load([kvh, start, COL0]), (ROWS, WIDTH))


@triton.jit
def opaque(x):
    """``x`` (a 16-bit tile) unchanged, through an identity the compiler cannot look behind.

    Why: Triton 3.6 sizes a tensor-core product's register packing (kWidth, mma.sync) from the
    narrowest load behind either operand, halved when a join is on the way. A V tile rebuilt from
    fp8 words by joins gives its P.V product kWidth 4: P then goes through shared memory and back
    every tile. Behind this boundary the product gets kWidth 2, P stays in registers and V is read
    with ldmatrix (sm_90a fp8 decode loop: 964 -> 791 instructions a 128-key tile; H100 fp8
    64x8192 0.883 -> 0.924 of copy bandwidth, benchmarks/NOTES.md). The K tile keeps kWidth 4:
    behind the boundary it would be staged through shared memory as well, which measured slower.
    ptxas removes the move itself.
    """
    return tl.inline_asm_elementwise("mov.b16 $0, $1;", "=h,h", [x], dtype=x.dtype, is_pure=False, pack=1)


@triton.constexpr_function
def l2_policy(evict_first):
    """``tl.load``'s ``eviction_policy`` for a constexpr flag: ``"evict_first"`` or the default."""
    return "evict_first" if evict_first else ""


@triton.jit
def load_words(base_ptr, row_off, WORD0: tl.constexpr, WORDS: tl.constexpr, ok, EVICT_FIRST: tl.constexpr):
    """int32 ``[N, WORDS]``: words ``WORD0 ..`` of the 4-byte aligned rows at byte offsets
    ``row_off [N]`` of ``base_ptr`` (rows not ``ok`` read as 0)."""
    offs_w = WORD0 + tl.arange(0, WORDS)
    w_ptr = (base_ptr + row_off[:, None]).to(tl.pointer_type(tl.int32), bitcast=True) + offs_w[None, :]
    return tl.load(w_ptr, mask=ok[:, None], other=0, eviction_policy=l2_policy(EVICT_FIRST))


@triton.jit
def float16_operand(x):
    """``x`` as a float16 product operand, saturated to float16's range: the products with fp8 and
    NVFP4 caches take float16 operands (both convert to it exactly, fp8 in one instruction a pair),
    and a (far-fetched) bfloat16 query beyond 65504 must stay finite."""
    return tl.minimum(tl.maximum(x.to(tl.float32), -65504.0), 65504.0).to(tl.float16)


@triton.jit
def load_kv_tile(
    base_ptr,  # [..., D_STORED] cache elements (the token offsets point at one head's vector)
    sf_ptr,  # [..., D / 16] e4m3 block scales (NVFP4 only)
    tok_off,  # [N] int64 offsets of the tokens' vectors in base_ptr
    sf_off,  # [N] int64 offsets of the tokens' scale rows in sf_ptr (NVFP4 only)
    ok,  # [N] tokens to load; the others read as 0
    COL0: tl.constexpr,  # first logical column (element index along D) of the tile
    WIDTH: tl.constexpr,  # logical columns in the tile
    KV_FORMAT: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    PV_OPERAND: tl.constexpr = False,  # the tile feeds a P.V product: fp8 / NVFP4 words end in `opaque`
    EVICT_FIRST: tl.constexpr = False,  # loads marked evict_first in L2
):
    """``[N, WIDTH]`` tile of logical columns ``COL0 ..`` in ``OUT_DTYPE``; masked tokens are 0.

    fp8 values convert exactly to float16/bfloat16; NVFP4 values (e2m1 x e4m3, at most 6
    significant bits) do too, so the dot products see the cache's exact values. Triton 3.6 keeps
    ``EVICT_FIRST`` on register loads only: a software-pipelined (cp.async) load drops it.
    """
    if KV_FORMAT == KV_NVFP4_WORDS and WIDTH % 64 == 0 and COL0 % 64 == 0:
        # Why words: eight codes and four block scales a 4-byte load (1-byte loads are no async
        # copy, so Triton 3.6 kept some tile shapes' scales out of the software pipeline), the
        # codes converted two at a time with their scale in the same packed instructions (~3
        # instructions an element, was ~10), and the V tile behind `opaque` (kWidth 2, as fp8).
        # H100, NVFP4 64x8192 D128: 0.24 -> 0.49 of copy bandwidth (benchmarks/NOTES.md, session f).
        sf = e4m3_words_f16(load_words(sf_ptr, sf_off, COL0 // 64, WIDTH // 64, ok, EVICT_FIRST))
        ROWS: tl.constexpr = tok_off.shape[0]
        word_scale = tl.reshape(tl.broadcast_to(sf[:, :, None], (ROWS, WIDTH // 16, 2)), (ROWS, WIDTH // 8))
        vals = nvfp4_words_f16(load_words(base_ptr, tok_off, COL0 // 8, WIDTH // 8, ok, EVICT_FIRST), word_scale)
        vals = vals.to(OUT_DTYPE)
        if PV_OPERAND and OUT_DTYPE == tl.float16:
            vals = opaque(vals)
        return vals
    elif is_nvfp4(KV_FORMAT):
        offs_b = COL0 // 2 + tl.arange(0, WIDTH // 2)
        packed = tl.load(base_ptr + tok_off[:, None] + offs_b[None, :], mask=ok[:, None], other=0,
                         eviction_policy=l2_policy(EVICT_FIRST)).to(tl.int32)
        lo = e2m1_values(packed & 15)
        hi = e2m1_values(packed >> 4)
        vals = tl.reshape(tl.join(lo, hi), (tok_off.shape[0], WIDTH))  # element 2i: low nibble
        offs_s = COL0 // 16 + tl.arange(0, WIDTH // 16)
        sf = tl.load(sf_ptr + sf_off[:, None] + offs_s[None, :], mask=ok[:, None], other=0.0,
                     eviction_policy=l2_policy(EVICT_FIRST)).to(tl.float16)
        # float16 products are exact: at most 6 significant bits, magnitudes 2^-10 .. 2688
        vals = tl.reshape(tl.reshape(vals, (tok_off.shape[0], WIDTH // 16, 16)) * sf[:, :, None],
                          (tok_off.shape[0], WIDTH))
        return vals.to(OUT_DTYPE)
    elif KV_FORMAT == KV_FP8_WORDS and OUT_DTYPE == tl.float16:
        # Why words: converted from fp8 after the copy to shared memory, a tile feeding the
        # P.V product (keys along its reduction dim, i.e. transposed) is gathered byte by byte
        # (one LDS.U8 per element, 128 a thread a 128-key tile); words converted in registers
        # reach the tensor cores through a 16-bit transposing ldmatrix instead.
        tile = e4m3_words_f16(load_words(base_ptr, tok_off, COL0 // 4, WIDTH // 4, ok, EVICT_FIRST))
        if PV_OPERAND:
            tile = opaque(tile)
        return tile
    else:
        offs_d = COL0 + tl.arange(0, WIDTH)
        x = tl.load(base_ptr + tok_off[:, None] + offs_d[None, :], mask=ok[:, None], other=0.0,
                    eviction_policy=l2_policy(EVICT_FIRST))
        return x.to(OUT_DTYPE)


# ---------------------------------------------------------------------------------------------
# positional terms
# ---------------------------------------------------------------------------------------------
@triton.jit
def rope_freqs(rope_theta, rope_scale, HALF: tl.constexpr):
    """float64 ``[HALF]``: ``theta^(-2i/D) / rope_scale`` for ``i < D/2`` (D = 2 * HALF).

    Float64 because positions reach 2^20 and beyond: a float32 frequency, or its float32 product
    with a position, is off by up to ~0.1 rad there. Only per-tile / per-split angles use it.
    """
    i = tl.arange(0, HALF).to(tl.float64)
    zero = tl.zeros([HALF], dtype=tl.float64)  # lifts the float32 scalars (Python floats when interpreted)
    return tl.exp2(-(i / HALF) * tl.log2(zero + rope_theta)) / (zero + rope_scale)


@triton.jit
def rope_angle(pos, freqs):
    """float32 ``pos * freqs`` reduced to about ``[-pi, pi]``: ``pos`` integer positions, ``freqs``
    from :func:`rope_freqs` (broadcastable). The product and its reduction run in float64, so the
    angle is as exact as float32 can hold whatever the position."""
    a = (tl.zeros_like(freqs) + pos) * freqs  # float64 whatever pos is (an int tensor or scalar)
    k = tl.floor(a * INV_TWO_PI + 0.5)
    return (((a - k * TWO_PI_A) - k * TWO_PI_B) - k * TWO_PI_C).to(tl.float32)


@triton.jit
def rope_table(N: tl.constexpr, freqs):
    """float32 ``(cos, sin)`` ``[N, HALF]`` of ``t * freq`` for ``t < N`` (``freqs`` from
    :func:`rope_freqs`): the per-key offsets inside a tile, built once per program.

    The angles are reduced to [-pi, pi] first, where the approximate (multifunction-unit) sin/cos
    are within ~1e-6 of the exact values; each entry is used once per tile, never accumulated, and
    lands in a 16-bit operand, so the approximation is invisible. Precise ``tl.cos``/``tl.sin``
    cost ~30 instructions each, ~1000 a thread for a 32 x 64 table: a third of a short program.
    """
    ang = rope_angle(tl.arange(0, N)[:, None], freqs[None, :])
    if FAST_TRIG:
        return libdevice.fast_cosf(ang), libdevice.fast_sinf(ang)
    else:
        return tl.cos(ang), tl.sin(ang)


@triton.jit
def rope_rotate(x1, x2, cos, sin):
    """Rotate-half rotary: ``(x1 cos - x2 sin, x2 cos + x1 sin)`` for the two halves of D."""
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def rope_query_per_key(u1, u2, t_cos, t_sin):
    """``[N, HALF]`` halves of ``R(-t) u`` for ``t < N``: ``u1, u2 [1, HALF]``, ``t_cos, t_sin
    [N, HALF]`` the cos / sin of ``t * freq``.

    With ``u = R(p - j0) q`` row ``t`` is the query as key ``j0 + t`` must see it:
    ``<R(p) q, R(j) k> = <R(p - j) q, k>``, so the keys enter the product unrotated.
    """
    return rope_rotate(u1, u2, t_cos, -t_sin)


@triton.jit
def alibi_slopes(heads, alibi_n):
    """ALiBi slope of each head: ``2^(-8 (h+1) / n)`` for ``h < n`` (n = 2^floor(log2 Hq)), then
    ``2^(-4 (2k+1) / n)`` for the ``k``-th head past ``n``."""
    n = alibi_n.to(tl.float32)
    hf = heads.to(tl.float32)
    first = tl.exp2(-8.0 * (hf + 1.0) / n)
    rest = tl.exp2(-4.0 * (2.0 * (hf - n) + 1.0) / n)
    return tl.where(heads < alibi_n, first, rest)


@triton.jit
def soft_cap(s, cap):
    """``cap * tanh(s / cap)``, written with exp2 so large |s| saturate to +-cap without NaN."""
    t = tl.exp2((2.0 * LOG2E / cap) * s)  # exp(2 s / cap)
    return cap * (1.0 - 2.0 / (t + 1.0))


@triton.jit
def round_to_e4m3(x):
    """float32 ``x`` rounded to the nearest float8_e4m3fn value (ties to even), saturating at
    +-448, still in float32: the cast that follows is then exact whatever rounding the target
    (or the interpreter) applies to a float8 conversion."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) & 0xFF, 127 - 6)  # below 2^-6 the grid is the subnormal step 2^-9
    quantum = ((e - 3) << 23).to(tl.float32, bitcast=True)  # 3 mantissa bits
    y = x / quantum
    y = (y + 12582912.0) - 12582912.0  # 1.5 * 2^23: float32 addition rounds to an integer, ties to even
    return tl.minimum(tl.maximum(y * quantum, -FP8_MAX), FP8_MAX)


@triton.jit
def store_scaled(ptr, o, mask, OUT_FP8: tl.constexpr):
    """Store float32 ``o`` in ``ptr``'s dtype; fp8: round to nearest even, saturating at +-448."""
    if OUT_FP8:
        o = round_to_e4m3(o)
    tl.store(ptr, o.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def e2m1_codes(x):
    """4-bit e2m1 codes (int32 0..15) of float32 ``x``: the nearest of ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``
    (clamped at 6), ties to the even index, sign in bit 3 (none for a zero code) -- what
    ``formats.e2m1_encode`` computes. The grid's midpoints are exact in float32, so comparing with
    them picks the nearest value exactly; ``>=`` at a midpoint whose upper neighbour has the even
    index, ``>`` where the lower one has it."""
    mag = tl.abs(x)
    idx = ((mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
           + (mag >= 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
           + (mag > 5.0).to(tl.int32))
    return tl.where((x < 0) & (idx > 0), idx | 8, idx)


@triton.jit
def quantize_nvfp4_rows(y, sf_div, BLOCKS: tl.constexpr):
    """NVFP4 of float32 ``y [M, 16 * BLOCKS]``, bit for bit ``formats.quantize_nvfp4(y, 1 / s)``
    (an output's ``o_sf_scale = s``; ``sf_div`` = float32 ``1 / s``): per run of 16 elements
    ``x = y / sf_div``, ``sf = e4m3(amax(|x|) / 6)``, ``code = e2m1(clamp(x / sf, -6, 6))`` (0 where
    ``sf == 0``). IEEE divisions (``div_rn``), as torch's float32 ops on the CPU.

    Returns ``(packed uint8 [M, 8 * BLOCKS]`` (element ``2i`` in the low nibble),
    ``sf float32 [M, BLOCKS]`` holding exact e4m3 values).
    """
    M: tl.constexpr = y.shape[0]
    x = tl.reshape(tl.math.div_rn(y, sf_div), (M, BLOCKS, 16))
    amax = tl.max(tl.abs(x), 2)
    sf = round_to_e4m3(tl.math.div_rn(amax, 6.0))
    safe = tl.where(sf > 0, sf, 1.0)
    q = tl.math.div_rn(x, safe[:, :, None])
    q = tl.minimum(tl.maximum(q, -6.0), 6.0)
    codes = tl.where(sf[:, :, None] > 0, e2m1_codes(q), 0)
    even, odd = tl.split(tl.reshape(codes, (M, BLOCKS * 8, 2)))
    return (even | (odd << 4)).to(tl.uint8), sf


# ---------------------------------------------------------------------------------------------
# tile products
# ---------------------------------------------------------------------------------------------
@triton.jit
def tile_scores(q, k, USE_DOT: tl.constexpr):
    """float32 ``[M, N]`` = ``q [M, W] . k [N, W]^T``.

    USE_DOT: tensor cores (M >= 16, operands in float16/bfloat16). Otherwise CUDA-core FMAs in
    float32 for a single query row (M == 1), where a padded MMA would waste 15/16 of its work.
    """
    if USE_DOT:
        return tl.dot(q, tl.trans(k))
    else:
        return tl.sum(q.to(tl.float32) * k.to(tl.float32), axis=1)[None, :]


@triton.jit
def tile_diagonal(s):
    """``[N]`` diagonal of a square ``[N, N]`` tile, laid out along its columns: a tensor-core
    tile splits columns across warps and rows within one, so the sum stays inside each warp and
    its result broadcasts over the rows of another tile of the same layout without a conversion."""
    offs = tl.arange(0, s.shape[0])
    return tl.sum(tl.where(offs[:, None] == offs[None, :], s, 0.0), 0)


@triton.jit
def tile_pv(p, v, USE_DOT: tl.constexpr):
    """float32 ``[M, W]`` = ``p [M, N] . v [N, W]`` (p rounded to v's dtype on the tensor-core path,
    as every flash-attention kernel does)."""
    if USE_DOT:
        return tl.dot(p.to(v.dtype), v)
    else:
        return tl.sum(tl.trans(p) * v.to(tl.float32), axis=0)[None, :]
