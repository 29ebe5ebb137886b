"""Positional terms (``@triton.jit``): rotary embedding (float64 angles, reduced, fast sin/cos)
and ALiBi slopes."""

from __future__ import annotations

import triton
import triton.language as tl

from ...runtime.device import is_interpreter

try:  # the multifunction unit's sin/cos; the interpreter has no libdevice
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover
    libdevice = None


FAST_TRIG: tl.constexpr = tl.constexpr(libdevice is not None and not is_interpreter())


# 2*pi split into three float32 parts (Cody-Waite): k * TWO_PI_A is exact for the k we meet.
TWO_PI_A: tl.constexpr = tl.constexpr(6.28125)


TWO_PI_B: tl.constexpr = tl.constexpr(0.0019353071693331003)


TWO_PI_C: tl.constexpr = tl.constexpr(1.0253131677018246e-11)


INV_TWO_PI: tl.constexpr = tl.constexpr(0.15915494309189535)


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
