"""The fuzz oracle: a call's output and LSE against the float64 formulation (:mod:`kvattn.dense`).

The tolerances are ``kvattn check``'s, per output dtype (``kvattn.cli.TOL_16BIT`` for 16-bit and
float32 outputs, ``kvattn.cli.TOL_NVFP4`` for NVFP4; the same numbers are written here because the
command imports this package, and tests/test_fuzz.py holds them equal), plus one for fp8 outputs
(e4m3 keeps three mantissa bits: a rounding of up to 1/16 of a value). They are applied to every (row, head)
vector of the output on its own, not to the norm of the whole output, so a wrong request in a large
batch is not averaged away. A vector's error is ``||out - exact|| / max(||exact||, rms)``, where
``rms`` is the root-mean-square norm of the exact vectors: a vector that a sink or a soft cap pulls
towards zero is held to the error of a typical one, not to its own tiny norm.

An NVFP4 vector is held to at least 1.5 times the error that quantising the exact vector itself
makes (``nvfp4_floor``): with one mantissa bit and an e4m3 scale every 16 values, a vector of
unlucky values errs past ``TOL_NVFP4`` in the format alone (0.16 seen), and a kernel that rounds its
exact float32 value the same way must pass.

NaN or infinity in an output never passes, and neither does a poisoned value left in place (the
buffers are NaN before each call), nor a zero row where the exact one is not.
"""

from __future__ import annotations

import torch

from ..formats import FP8_MAX, FP4Tensor, dequantize_nvfp4_output, quantize_nvfp4_output

TOL_16BIT = 2e-2  # kvattn check's: rounding of a 16-bit output plus fp32 accumulation order
TOL_NVFP4 = 0.15  # kvattn check's: e2m1 values keep one mantissa bit
TOL_FP8 = 0.1  # fp8 (e4m3) outputs: three mantissa bits, a relative rounding of up to 2^-4
TOLERANCES = {"half": TOL_16BIT, "float32": TOL_16BIT, "fp8": TOL_FP8, "nvfp4": TOL_NVFP4}
# LSE: base-2 log-sum-exp of float32 logits from 16-bit operands; absolute error allowed, plus a
# part relative to the value (logits of large magnitude carry the operands' relative rounding).
LSE_ABS, LSE_REL = 2e-2, 1e-2
NVFP4_FLOOR_FACTOR = 1.5  # an NVFP4 vector's allowance over the format's own error of its exact value


def vector_error(out: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Per-vector relative error (last dim is the vector) in float64; NaN/inf in ``out`` -> inf."""
    o = out.double().reshape(-1, out.shape[-1]) if out.numel() else out.double().reshape(0, 1)
    e = exact.double().reshape(o.shape)
    if o.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64)
    norms = e.norm(dim=-1)
    rms = float(norms.square().mean().sqrt()) if norms.numel() else 0.0
    err = (o - e).norm(dim=-1) / norms.clamp_min(max(rms, 1e-12))
    return torch.where(torch.isfinite(o).all(dim=-1), err, torch.full_like(err, float("inf")))


def nvfp4_round_trip(target: torch.Tensor, o_sf_scale: float) -> torch.Tensor:
    """``target [rows, Hq, D]`` stored as an NVFP4 output and read back (float32, on the CPU)."""
    t = target.float().cpu()
    packed = FP4Tensor.empty(t.shape[0], t.shape[1], t.shape[2], t.device, scale_start_index=0)
    quantize_nvfp4_output(t, o_sf_scale, packed)
    return dequantize_nvfp4_output(packed, o_sf_scale)


def nvfp4_floor(target: torch.Tensor, o_sf_scale: float) -> torch.Tensor:
    """Per-vector error of :func:`nvfp4_round_trip` of ``target`` (the format's own error of the
    exact values, as :func:`vector_error` measures it)."""
    return vector_error(nvfp4_round_trip(target, o_sf_scale), target.float().cpu())


def compare(call, out: torch.Tensor, lse, exact_out: torch.Tensor, exact_lse) -> dict:
    """``{"ok", "err", "tol", "lse_err", "why"}`` for one call's results against the exact ones."""
    tol = TOLERANCES[call.out_kind]
    target = exact_out / call.stored_scale
    if call.out_kind == "fp8":
        target = target.clamp(-FP8_MAX, FP8_MAX)
    got = out.detach().float().cpu()
    if tuple(got.shape) != tuple(target.shape):
        return {"ok": False, "err": float("inf"), "tol": tol, "lse_err": None,
                "why": f"output shape {list(got.shape)}, expected {list(target.shape)}"}
    errs = vector_error(got, target)
    allowed = torch.full_like(errs, tol)
    if call.out_kind == "nvfp4" and errs.numel():
        allowed = torch.maximum(allowed, NVFP4_FLOOR_FACTOR * nvfp4_floor(target, call.o_sf_scale))
    err = float(errs.max()) if errs.numel() else 0.0
    result = {"ok": bool((errs <= allowed).all()), "err": err, "tol": tol, "lse_err": None, "why": ""}
    if not result["ok"]:
        worst = int((errs / allowed).argmax())
        result["why"] = (f"output vector {worst} (row {worst // max(got.shape[-2], 1)}, head "
                         f"{worst % max(got.shape[-2], 1)}) has error {float(errs[worst]):.3g} > "
                         f"{float(allowed[worst]):.3g}")
        if err == float("inf"):
            result["why"] += " (NaN/inf: a non-finite value, or a poisoned output left unwritten)"
    if lse is not None:
        lse_err, why = lse_error(lse, exact_lse)
        result["lse_err"] = lse_err
        if why:
            result["ok"] = False
            result["why"] = (result["why"] + "; " if result["why"] else "") + why
    return result


def lse_error(lse: torch.Tensor, exact: torch.Tensor) -> tuple:
    """Largest LSE error in units of its allowance, and why it fails ("" if it does not)."""
    got = lse.detach().double().cpu().reshape(-1)
    e = exact.double().reshape(-1)
    if got.shape != e.shape:
        return float("inf"), f"lse shape {list(lse.shape)}, expected {list(exact.shape)}"
    if torch.isnan(got).any():
        return float("inf"), "lse has NaN (or a poisoned value left unwritten)"
    empty = torch.isinf(e) & (e < 0)
    if not torch.equal(torch.isinf(got) & (got < 0), empty):
        return float("inf"), "lse: -inf where the exact LSE is finite, or finite where no key is visible"
    if torch.isinf(got[~empty]).any():
        return float("inf"), "lse has +inf"
    allowance = LSE_ABS + LSE_REL * e[~empty].abs()
    ratio = ((got[~empty] - e[~empty]).abs() / allowance)
    worst = float(ratio.max()) if ratio.numel() else 0.0
    return worst, ("" if worst <= 1.0 else f"lse error {worst:.3g}x its allowance")
