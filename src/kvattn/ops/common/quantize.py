"""Output quantisation (``@triton.jit``): fp8-e4m3 rounding and NVFP4 encoding of float32 rows,
bit for bit what :mod:`kvattn.formats` computes on the host."""

from __future__ import annotations

import triton
import triton.language as tl


FP8_MAX: tl.constexpr = tl.constexpr(448.0)


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
