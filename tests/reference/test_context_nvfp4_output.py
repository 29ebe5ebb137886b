"""Context attention with an NVFP4 output (``FP4Tensor``), read back independently of kvattn.formats.

Per run of 16 elements of a flattened ``Hq * D`` row: ``sf = e4m3(o_sf_scale * amax / 6)`` and
``code = e2m1_rne(clamp(y * o_sf_scale / sf, -6, 6))``; scales in the 128x4 swizzled layout.
"""

import pytest
import torch
from .refcheck import paged_case, randq, workspace

from kvattn import FP4Tensor, dense
from kvattn.formats import FP8_DTYPE
from kvattn.prefill import trtllm_batch_context_with_kv_cache

pytestmark = pytest.mark.usefixtures("reference_backend")  # the plain-PyTorch backend, explicitly


def swizzle(m: int, k: int, cols: int) -> int:
    """SPEC's 128x4 offset, in plain integers."""
    return (m // 128) * (cols // 4) * 512 + (k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4


def read_scales(t: FP4Tensor, rows: int, blocks: int) -> torch.Tensor:
    flat = t.scale.view(torch.uint8).reshape(-1)
    cols = t.scale.shape[1]
    idx = [[swizzle(m + t.scale_start_index, k, cols) for k in range(blocks)] for m in range(rows)]
    return flat[torch.tensor(idx, dtype=torch.int64)].view(FP8_DTYPE)


def half_step(x: torch.Tensor) -> torch.Tensor:
    """Half the e2m1 grid spacing around magnitude x (in block-scale units)."""
    return torch.where(x <= 2, 0.25, torch.where(x <= 4, 0.5, 1.0))


def check_nvfp4(t: FP4Tensor, ref: torch.Tensor, o_sf_scale: float):
    rows, hq, d = ref.shape
    blocks = hq * d // 16
    assert t.data.shape == (rows, hq, d // 2) and t.data.dtype == torch.uint8
    sf = read_scales(t, rows, blocks)  # [rows, blocks]
    y = (ref.reshape(rows, blocks, 16) * o_sf_scale)
    amax = y.abs().amax(dim=-1)
    want_sf = (amax / 6).to(torch.float32).to(FP8_DTYPE).to(torch.float64)
    got_sf = sf.to(torch.float64)
    assert torch.isfinite(got_sf).all()
    # The kernel's amax comes from its float32 output: the same e4m3 value, or a neighbour on a tie.
    assert ((got_sf - want_sf).abs() <= want_sf * 2.0**-3 + 2.0**-9).all()
    vals = dense.decode_nvfp4(t.data.reshape(rows, blocks * 8), sf).reshape(rows, blocks, 16)
    safe = torch.where(got_sf > 0, got_sf, 1.0).unsqueeze(-1)
    x = y.abs() / safe * 1.001
    # Within the grid: half a step; past 6 (a block scale rounded down, e.g. subnormal): the clamp.
    bound = torch.maximum(half_step(x), x - 6) * safe * 1.001 + 1e-6 * float(y.abs().max())
    err = (vals - y).abs()
    assert (err <= bound).all(), f"worst {float((err / bound).max()):.3g} x the e2m1 half step"
    # Not vacuous: the grid does round (some elements are off), within one half step.
    assert float(err.max()) > 0


@pytest.mark.parametrize("o_sf_scale", [None, 1.0, 0.05, 20.0], ids=lambda s: f"o_sf_scale{s}")
@pytest.mark.parametrize("kv_format", ["bfloat16", "fp8", "nvfp4"])
def test_nvfp4_output(kv_format, o_sf_scale):
    lens, lq = [30, 0, 70], [30, 0, 6]
    case = paged_case(lens, kv_format=kv_format, layout="HND", seed=3)
    q = randq(36, 4, 64, dtype=torch.float16 if kv_format == "nvfp4" else torch.bfloat16, seed=3)
    cq = torch.tensor([0, 30, 30, 36], dtype=torch.int32)
    out = trtllm_batch_context_with_kv_cache(
        q, case.kv_cache, workspace(), case.block_tables, case.seq_lens, 30, 70, 0.125, 1.5, 3, cq,
        torch.tensor([0, 30, 30, 100], dtype=torch.int32),
        out_dtype="nvfp4", o_sf_scale=o_sf_scale, o_sf_vec_size=16, kv_block_scales=case.kv_cache_sf)
    assert isinstance(out, FP4Tensor)
    assert out.scale.shape == (128, 16) and out.scale.dtype == FP8_DTYPE
    ref = dense.context(q, case.kv_cache, case.block_tables, case.seq_lens, cq, 0.125, 1.5,
                        kv_block_scales=case.kv_cache_sf)
    check_nvfp4(out, ref, 1.0 if o_sf_scale is None else o_sf_scale)


@pytest.mark.parametrize("start", [0, 5, 120], ids=lambda s: f"start{s}")
def test_given_fp4tensor_with_scale_start_index(start):
    """Only the data and the scale rows [start, start + rows) are written; other scale bytes stay."""
    rows, hq, d = 20, 8, 64
    case = paged_case([rows], layout="HND", seed=4)
    q = randq(rows, hq, d, seed=4)
    cols = hq * d // 16
    out = FP4Tensor.empty(rows, hq, d, "cpu", scale_start_index=start)
    out.data.fill_(0xFF)
    out.scale.view(torch.uint8).fill_(0xFF)
    cq = torch.tensor([0, rows], dtype=torch.int32)
    got = trtllm_batch_context_with_kv_cache(q, case.kv_cache, workspace(), case.block_tables, case.seq_lens, rows,
                                             rows, 0.125, 1.0, 1, cq, cq, out=out)
    assert got is out
    ref = dense.context(q, case.kv_cache, case.block_tables, case.seq_lens, cq, 0.125, 1.0)
    check_nvfp4(out, ref, 1.0)
    flat = out.scale.view(torch.uint8).reshape(-1)
    written = torch.zeros_like(flat, dtype=torch.bool)
    for m in range(start, start + rows):
        for k in range(cols):
            written[swizzle(m, k, out.scale.shape[1])] = True
    assert (flat[~written] == 0xFF).all()


def test_fp4tensor_out_needs_nvfp4():
    case = paged_case([4], layout="HND", seed=5)
    q = randq(4, 4, 64, seed=5)
    cq = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(TypeError, match="^out:"):
        trtllm_batch_context_with_kv_cache(q, case.kv_cache, workspace(), case.block_tables, case.seq_lens, 4, 4,
                                           0.125, 1.0, 1, cq, cq, out=FP4Tensor.empty(4, 4, 64, "cpu"),
                                           out_dtype=torch.bfloat16)
