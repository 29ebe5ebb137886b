"""Gluon pieces that turn e4m3 tiles in shared memory into float16 operands, shared by the
warp-specialised prefill and MLA kernels (their fp8 caches: the P.V operand must be 16-bit, and
e4m3 converts to float16 exactly, two values an instruction).

Why words. Converting an e4m3 tile with ``.to(float16)`` gives float16 registers that the store
lowering splits into halves and joins again (two PRMT a pair around each conversion, sm_90a
SASS). Reading the bytes as 32-bit words and writing 32-bit words of two float16 values each
keeps the pairs packed (lab/notes/prefill.md "Prefill: fp8 caches in the warp-specialised
kernel").
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_compat import smem_view


@triton.constexpr_function
def row_smem(cols, esize):
    """The shared layout of ``[rows, cols]`` tiles of ``esize``-byte values that TMA boxes fill and
    wgmma reads: a 128-byte swizzle, or the row's bytes where a row is shorter (fp8 rows of 64)."""
    cols = getattr(cols, "value", cols)
    esize = getattr(esize, "value", esize)
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, cols * esize), element_bitwidth=8 * esize, rank=2)


@triton.constexpr_function
def words_smem(cols, esize):
    """:func:`row_smem`'s tile seen as 32-bit words: the same bytes (the swizzle moves 16-byte
    pieces of a row, whatever the element)."""
    swizzle = row_smem(cols, esize).swizzle_byte_width
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=2)


@gluon.jit
def words_view(smem, ROWS: gl.constexpr, COLS: gl.constexpr, ESIZE: gl.constexpr):
    """``smem [ROWS, COLS]`` of ``ESIZE``-byte values under the NVMMA swizzle seen as int32
    ``[ROWS, COLS * ESIZE / 4]`` (:func:`words_smem`)."""
    return smem_view(smem, gl.int32, [ROWS, COLS * ESIZE // 4], words_smem(COLS, ESIZE))


@gluon.jit
def e4m3_words_f16(w):
    """The four e4m3 values of each int32 word ``w`` as two int32 words of two float16 values
    each (the word of the low bytes first), exact; one conversion instruction a pair."""
    return gl.inline_asm_elementwise(
        """{
        .reg .b16 lo, hi;
        mov.b32 {lo, hi}, $2;
        cvt.rn.f16x2.e4m3x2 $0, lo;
        cvt.rn.f16x2.e4m3x2 $1, hi;
        }""",
        "=r,=r,r", [w], dtype=(gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def f16_words(w):
    """``w [R, C]`` e4m3 words -> ``[R, 2 C]`` words of float16 pairs in element order (the two
    words of a source word side by side in the same thread)."""
    lo, hi = e4m3_words_f16(w)
    return gl.join(lo, hi).reshape([w.shape[0], 2 * w.shape[1]])
