"""The work each shape must do (``docs/benchmarking.md``, "Metrics"), and fractions of the ceilings.

Decode (memory-bound): bytes = K and V actually read (``sum(seq_lens) x Hkv x D x bytes/elem x 2``,
plus the e4m3 block scales for NVFP4) + q + output. Prefill (compute-bound): FLOPs =
``4 x D x Hq x`` the number of (query, key) pairs the causal mask allows. MLA decode: both, bytes of
576-element latent rows and FLOPs ``2 x Hq x L x (576 + 512)``; its fraction is of whichever ceiling
binds (the larger of bytes / bandwidth and FLOPs / matrix rate).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvattn._formats_table import BY_NAME

from .shapes import Shape

MLA_QK_DIM = 576
MLA_V_DIM = 512


@dataclass(frozen=True)
class Work:
    """Bytes that must move and FLOPs that must run for one call; ``bound`` picks the fraction."""

    bytes: float
    flops: float
    bound: str  # "memory", "compute" or "auto" (the binding ceiling, decided with the ceilings)
    matmul_ceiling: str  # which matrix-rate ceiling applies: "matmul_bf16" or "matmul_fp8"


def _allowed_pairs(lens: list[int], q_lens: list[int], causal: bool = True) -> int:
    """(query, key) pairs when request ``b``'s ``q_lens[b]`` queries are its last tokens, causal
    (or, ``causal=False``, each seeing all ``lens[b]`` keys)."""
    total = 0
    for n, q_len in zip(lens, q_lens, strict=True):
        q = min(q_len, n)
        total += q * n if not causal else q * (n - q) + q * (q + 1) // 2
    return total


def work(shape: Shape) -> Work:
    lens = shape.seq_lens()
    kv_b = BY_NAME[shape.kv_dtype].element_bits / 8
    q_b = BY_NAME[shape.q_dtype].element_bits / 8
    hq, hkv, d = shape.num_qo_heads, shape.num_kv_heads, shape.head_dim
    matmul = "matmul_fp8" if shape.q_dtype == "fp8" else "matmul_bf16"
    if shape.suite == "mla":
        tokens = sum(lens)
        rows = shape.batch * shape.q_len * hq  # (multi-token prediction: q_len query tokens a request)
        nbytes = tokens * MLA_QK_DIM * kv_b + rows * (MLA_QK_DIM * q_b + MLA_V_DIM * 2)
        flops = 2.0 * hq * _allowed_pairs(lens, shape.q_lens()) * (MLA_QK_DIM + MLA_V_DIM)
        return Work(nbytes, flops, "auto", matmul)
    kv_bytes = sum(lens) * hkv * BY_NAME[shape.kv_dtype].row_bytes(d) * 2
    q_lens = shape.q_lens()  # per request: a mixed prefill batch lists them
    rows = sum(q_lens)
    io_bytes = rows * hq * d * q_b + rows * hq * d * 2  # query in, bf16 output out
    flops = 4.0 * d * hq * _allowed_pairs(lens, q_lens, shape.causal)
    bound = "compute" if shape.suite == "prefill" else "memory"
    return Work(kv_bytes + io_bytes, flops, bound, matmul)


def _num(x: float) -> str:
    """Whole numbers at GPU scale, three significant digits below (CPU smoke runs)."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def rates(w: Work, seconds: float, ceilings: dict) -> dict:
    """GB/s, TFLOP/s, their fractions of the ceilings, and the headline ``fraction``."""
    gbps = w.bytes / seconds / 1e9
    tflops = w.flops / seconds / 1e12
    copy = ceilings.get("copy_gbps")
    mm = ceilings.get(f"{w.matmul_ceiling}_tflops") or ceilings.get("matmul_bf16_tflops")
    frac_bw = gbps / copy if copy else None
    frac_mm = tflops / mm if mm else None
    bound = w.bound
    if bound == "auto":
        # The binding ceiling is the one whose floor time is longer.
        t_mem = w.bytes / (copy * 1e9) if copy else 0.0
        t_mm = w.flops / (mm * 1e12) if mm else 0.0
        bound = "compute" if t_mm > t_mem else "memory"
    fraction = frac_mm if bound == "compute" else frac_bw
    return {
        "gbps": gbps,
        "tflops": tflops,
        "fraction_copy_bw": frac_bw,
        "fraction_matmul": frac_mm,
        "fraction": fraction,
        "bound": bound,
        "metric": f"{_num(tflops)} TFLOP/s" if bound == "compute" else f"{_num(gbps)} GB/s",
    }
