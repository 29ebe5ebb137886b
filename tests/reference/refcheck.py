"""Shared helpers of the reference-vs-dense tests: tolerances by output dtype, buffers, inputs.

Tolerances are the rounding of the output dtype (half an ulp, relative) plus a small absolute
term for float32 accumulation (relative to the largest reference value); NaN never passes.
"""

from __future__ import annotations

import torch

from kvattn.formats import FP8_DTYPE, FP8_MAX
from kvattn.testing import make_paged_kv, poison_

# Half an ulp relative to the value: 2^-(mantissa bits + 1).
HALF_ULP = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, FP8_DTYPE: 2.0**-4}
# Half the smallest subnormal step (absolute), where relative rounding stops applying.
HALF_TINY = {torch.float32: 0.0, torch.float16: 2.0**-25, torch.bfloat16: 0.0, FP8_DTYPE: 2.0**-10}
ACCUM_REL = 2e-5  # float32 accumulation slack, times max |reference|


def workspace() -> torch.Tensor:
    return torch.zeros(1 << 16, dtype=torch.uint8)


def poisoned(*shape, dtype) -> torch.Tensor:
    """An output buffer full of NaN (0xFF bytes for fp8) that a call must overwrite entirely."""
    return poison_(torch.empty(*shape, dtype=dtype))


def assert_close(out: torch.Tensor, ref: torch.Tensor, *, stored_scale: float = 1.0, slack: float = 1.0) -> None:
    """``out * stored_scale`` (in ``out``'s dtype) matches the float64 ``ref`` element-wise.

    ``stored_scale``: the output holds ``ref / stored_scale`` (fp8 outputs with an ``o_scale``);
    fp8 outputs saturate at +-448 in stored units. ``slack`` widens the bound (e.g. 2 when the
    inputs were themselves rounded by the call).
    """
    assert out.shape == ref.shape, (out.shape, ref.shape)
    o = out.to(torch.float64)
    assert torch.isfinite(o).all(), f"non-finite values in the output ({int((~torch.isfinite(o)).sum())})"
    r = ref.to(torch.float64) / stored_scale
    if out.dtype == FP8_DTYPE:
        r = r.clamp(-FP8_MAX, FP8_MAX)
    amax = float(r.abs().max()) if r.numel() else 0.0
    bound = slack * (HALF_ULP[out.dtype] * 1.01 * r.abs() + HALF_TINY[out.dtype] + ACCUM_REL * amax) + 1e-300
    err = (o - r).abs()
    worst = float((err / bound).max()) if r.numel() else 0.0
    assert worst <= 1.0, f"error {worst:.3g} x the bound (max abs err {float(err.max()):.3g}, max |ref| {amax:.3g})"


def paged_case(lens, *, hkv=2, d=64, page=16, kv_format="bfloat16", layout="NHD", form="stacked", seed=0, **kw):
    """A NaN-filled paged cache with permuted pages (see :func:`kvattn.testing.make_paged_kv`)."""
    half = torch.float16 if kv_format == "float16" else torch.bfloat16
    return make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=half, kv_format=kv_format,
                         layout=layout, form=form, seed=seed, **kw)


def randq(*shape, dtype=torch.bfloat16, seed=0, scale=1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(*shape, generator=g) * scale
    if dtype == FP8_DTYPE:
        return x.clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return x.to(dtype)


def scale_arg(value: float, as_tensor: bool):
    """A scale as a Python float or as a one-element float32 tensor."""
    return torch.tensor([value], dtype=torch.float32) if as_tensor else value
