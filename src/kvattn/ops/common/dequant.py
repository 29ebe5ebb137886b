"""Reading a cache tile into registers (``@triton.jit``): fp16/bf16 as is, fp8-e4m3 and NVFP4
dequantised to exact float16 values, byte by byte or as 32-bit words (inline PTX), and TMA tiles
of contiguous 16-bit caches. A new cache format adds its branch to :func:`load_kv_tile`."""

from __future__ import annotations

import triton
import triton.language as tl

from .kv_formats import KV_FP8_WORDS, KV_NVFP4_WORDS, is_nvfp4


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
    64x8192 0.883 -> 0.924 of copy bandwidth, lab/notes/formats.md "Formats: fp8 KV in decode"). The K tile keeps kWidth 4:
    behind the boundary it would be staged through shared memory as well, which measured slower.
    ptxas removes the move itself.
    """
    return tl.inline_asm_elementwise("mov.b16 $0, $1;", "=h,h", [x], dtype=x.dtype, is_pure=False, pack=1)


@triton.constexpr_function
def l2_policy(evict_first):
    """``tl.load``'s ``eviction_policy`` for a constexpr flag: ``"evict_first"`` or the default."""
    return "evict_first" if evict_first else ""


@triton.jit
def row_mask(ok, row_off, OFF_VALID: tl.constexpr):
    """bool ``[N, 1]``: the rows to read, ``ok`` or (OFF_VALID) the rows whose offset is >= 0.

    Why OFF_VALID: an ``ok`` computed next to the offsets before they change layout is moved to
    the load's layout by a second shared-memory exchange (its bits then unpacked a row); compared
    after the expansion, the test reads the offsets the load's threads already hold."""
    if OFF_VALID:
        return row_off[:, None] >= 0
    else:
        return ok[:, None]


@triton.jit
def load_words(base_ptr, row_off, WORD0: tl.constexpr, WORDS: tl.constexpr, ok, EVICT_FIRST: tl.constexpr,
               OFF_VALID: tl.constexpr = False, REL_ROWS: tl.constexpr = False):
    """int32 ``[N, WORDS]``: words ``WORD0 ..`` of the 4-byte aligned rows at byte offsets
    ``row_off [N]`` of ``base_ptr`` (rows not ``ok`` read as 0; OFF_VALID: rows of offsets < 0;
    REL_ROWS: as :func:`load_kv_tile`'s, ``row_off`` a multiple of 4)."""
    offs_w = WORD0 + tl.arange(0, WORDS)
    if REL_ROWS:  # the row's words and the column's in one int32 offset (loop-invariant in decode)
        w_ptr = base_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + (row_off[:, None] // 4 + offs_w[None, :])
    else:
        w_ptr = (base_ptr + row_off[:, None]).to(tl.pointer_type(tl.int32), bitcast=True) + offs_w[None, :]
    return tl.load(w_ptr, mask=row_mask(ok, row_off, OFF_VALID), other=0, eviction_policy=l2_policy(EVICT_FIRST))


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
    OFF_VALID: tl.constexpr = False,  # `ok` unused: the tokens to load are those of offsets >= 0 (common.row_mask)
    # tok_off: int32 offsets of the rows from base_ptr (one pointer, or [N, 1]: a row's own), added to
    # the columns' before the pointer, so a loop-invariant row offset and column are one value
    REL_ROWS: tl.constexpr = False,
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
        # H100, NVFP4 64x8192 D128: 0.24 -> 0.49 of copy bandwidth (lab/notes/formats.md "Formats: NVFP4 in decode").
        sf = e4m3_words_f16(load_words(sf_ptr, sf_off, COL0 // 64, WIDTH // 64, ok, EVICT_FIRST, OFF_VALID))
        ROWS: tl.constexpr = tok_off.shape[0]
        word_scale = tl.reshape(tl.broadcast_to(sf[:, :, None], (ROWS, WIDTH // 16, 2)), (ROWS, WIDTH // 8))
        vals = nvfp4_words_f16(load_words(base_ptr, tok_off, COL0 // 8, WIDTH // 8, ok, EVICT_FIRST, OFF_VALID), word_scale)
        vals = vals.to(OUT_DTYPE)
        if PV_OPERAND and OUT_DTYPE == tl.float16:
            vals = opaque(vals)
        return vals
    elif is_nvfp4(KV_FORMAT):
        offs_b = COL0 // 2 + tl.arange(0, WIDTH // 2)
        packed = tl.load(base_ptr + tok_off[:, None] + offs_b[None, :], mask=row_mask(ok, tok_off, OFF_VALID), other=0,
                         eviction_policy=l2_policy(EVICT_FIRST)).to(tl.int32)
        lo = e2m1_values(packed & 15)
        hi = e2m1_values(packed >> 4)
        vals = tl.reshape(tl.join(lo, hi), (tok_off.shape[0], WIDTH))  # element 2i: low nibble
        offs_s = COL0 // 16 + tl.arange(0, WIDTH // 16)
        sf = tl.load(sf_ptr + sf_off[:, None] + offs_s[None, :], mask=row_mask(ok, sf_off, OFF_VALID), other=0.0,
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
        tile = e4m3_words_f16(load_words(base_ptr, tok_off, COL0 // 4, WIDTH // 4, ok, EVICT_FIRST, OFF_VALID,
                                         REL_ROWS))
        if PV_OPERAND:
            tile = opaque(tile)
        return tile
    else:
        offs_d = COL0 + tl.arange(0, WIDTH)
        if REL_ROWS:
            x = tl.load(base_ptr + (tok_off[:, None] + offs_d[None, :]), mask=row_mask(ok, tok_off, OFF_VALID),
                        other=0.0, eviction_policy=l2_policy(EVICT_FIRST))
        else:
            x = tl.load(base_ptr + tok_off[:, None] + offs_d[None, :], mask=row_mask(ok, tok_off, OFF_VALID),
                        other=0.0, eviction_policy=l2_policy(EVICT_FIRST))
        return x.to(OUT_DTYPE)
