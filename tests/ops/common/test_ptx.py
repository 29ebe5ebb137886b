"""The inline PTX of ``ops.common`` that Triton's interpreter cannot run, checked on the CPU.

``NVFP4_PAIRS_PTX`` (the NVFP4 words path of the decode kernels) is executed here by a small
emulator of the few instructions it uses, on every code in every nibble position and every
positive finite e4m3 block scale, against ``formats.e2m1_decode`` times the scale. The GPU suite
runs the real instructions; this tier catches a wrong shift, mask or lookup table in CI.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from kvattn.formats import e2m1_decode
from kvattn.ops import common


def _f16x2(bits: int) -> np.ndarray:
    return np.array([bits & 0xFFFF, bits >> 16], dtype=np.uint16).view(np.float16)


def _b32(halves: np.ndarray) -> int:
    lo, hi = (int(x) for x in np.asarray(halves, dtype=np.float16).view(np.uint16))
    return lo | (hi << 16)


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        index = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> index) & 1) << bit
    return out


def run_ptx(ptx: str, inputs: dict[int, int], num_outputs: int) -> list[int]:
    """Execute ``ptx`` (the subset ``NVFP4_PAIRS_PTX`` uses) with operand ``$n`` bound to
    ``inputs[n]`` (32-bit words, or 16-bit halves for ``h`` operands); the 16-bit outputs
    ``$0 .. $num_outputs-1`` as ints."""
    regs: dict[str, int] = {f"${n}": v for n, v in inputs.items()}

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 0) if re.match(r"^-?(0x[0-9a-fA-F]+|\d+)$", tok) else regs[tok]

    for line in ptx.strip().strip("{}").split(";"):
        line = line.strip()
        if not line or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32" and rest.startswith("{"):  # unpack a register into two halves
            dst, src = re.match(r"\{(.+)\},\s*(\S+)", rest).groups()
            lo, hi = (d.strip() for d in dst.split(","))
            regs[lo], regs[hi] = regs[src] & 0xFFFF, regs[src] >> 16
            continue
        dst, operands = (part.strip() for part in rest.split(",", 1))
        args = [operands] if operands.startswith("{") else [a.strip() for a in operands.split(",")]
        if op == "mov.b32":
            if args[0].startswith("{"):  # pack two halves
                lo, hi = (a.strip() for a in args[0].strip("{}").split(","))
                regs[dst] = (val(lo) & 0xFFFF) | ((val(hi) & 0xFFFF) << 16)
            else:
                regs[dst] = val(args[0]) & 0xFFFFFFFF
        elif op == "shl.b32":
            regs[dst] = (val(args[0]) << val(args[1])) & 0xFFFFFFFF
        elif op == "shr.u32":
            regs[dst] = val(args[0]) >> val(args[1])
        elif op == "and.b32":
            regs[dst] = val(args[0]) & val(args[1])
        elif op == "lop3.b32":
            regs[dst] = _lop3(val(args[0]), val(args[1]), val(args[2]), val(args[3]))
        elif op == "mul.rn.f16x2":  # per half, rounded to nearest even (numpy float16 does)
            regs[dst] = _b32(_f16x2(val(args[0])) * _f16x2(val(args[1])))
        else:
            raise NotImplementedError(f"PTX instruction {op!r} is not emulated")
    return [regs[f"${n}"] for n in range(num_outputs)]


def _e4m3_positive_finite() -> torch.Tensor:
    bits = torch.arange(1, 0x7F, dtype=torch.uint8)  # 0x7F is NaN; 0x80 and up are negative
    return bits.view(torch.float8_e4m3fn).to(torch.float32)


def _nvfp4_pairs(word: int, scale: float) -> np.ndarray:
    """The eight float16 outputs of NVFP4_PAIRS_PTX in element order (outputs $2j, $2j+1 are
    nibbles j and j + 4)."""
    half = int(np.array([scale], dtype=np.float16).view(np.uint16)[0])
    outs = run_ptx(common.NVFP4_PAIRS_PTX.value, {8: word, 9: half}, 8)
    by_nibble = [0] * 8
    for j in range(4):
        by_nibble[j], by_nibble[j + 4] = outs[2 * j], outs[2 * j + 1]
    return np.array(by_nibble, dtype=np.uint16).view(np.float16)


@pytest.mark.parametrize("position", range(8), ids=[f"nibble{j}" for j in range(8)])
def test_nvfp4_pairs_ptx_decodes_every_code_and_scale_exactly(position):
    """Every code (the other nibbles random) at this position, with every positive finite e4m3
    scale: the float16 outputs equal ``e2m1_decode(code) * scale`` exactly, signs and zeros
    included, and no output is NaN or infinite."""
    gen = torch.Generator().manual_seed(position)
    scales = _e4m3_positive_finite()
    for code in range(16):
        for scale in scales[torch.randperm(len(scales), generator=gen)[:24]].tolist() + [scales.min().item(),
                                                                                          scales.max().item()]:
            nibbles = torch.randint(0, 16, (8,), generator=gen)
            nibbles[position] = code
            word = sum(int(n) << (4 * j) for j, n in enumerate(nibbles))
            got = _nvfp4_pairs(word, scale).astype(np.float64)
            expected = (e2m1_decode(nibbles).double() * scale).numpy()
            assert np.isfinite(got).all()
            np.testing.assert_array_equal(got, expected, err_msg=f"word {word:#010x} scale {scale}")
            assert (np.signbit(got) == (nibbles.numpy() >= 8)).all(), "sign of a zero or value lost"


def test_emulator_rejects_unknown_instructions():
    with pytest.raises(NotImplementedError):
        run_ptx("{ add.s32 $0, $1, 1; }", {1: 2}, 1)
