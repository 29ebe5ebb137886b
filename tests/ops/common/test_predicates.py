"""``kvattn.ops.common.as_mask``: a scalar condition widened into a load / store mask.

CPU tier: the masked loads and stores take exactly the lanes the condition selects (under Triton
3.9's interpreter the bare mask, int32 data, is rejected: the kernels' tests fail without it).
Compiled for sm_90a (no GPU needed): the TTGIR and the PTX are those of the bare mask, so the
helper changes nothing on the GPU.
"""

from __future__ import annotations

import os
import re
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from kvattn.ops.common import as_mask

from ..sm90 import compile_sm90


# num_splits is kept a runtime value: Triton makes an int argument equal to 1 a constant, and a
# broadcast of a constant condition is not what the kernels do.
@triton.jit(do_not_specialize=["num_splits"])
def _copy_where(src_ptr, dst_ptr, n, num_splits, N: tl.constexpr):
    # src_ptr, dst_ptr: [N] float32
    offs = tl.arange(0, N)
    ok = as_mask((offs < n) & (num_splits == 1))  # a tensor condition and a scalar one, as the kernels' final rows
    x = tl.load(src_ptr + offs, mask=ok, other=-1.0)
    tl.store(dst_ptr + offs, x, mask=ok)
    # a scalar condition alone, broadcast (the prefill kernel's page-id check)
    tl.store(dst_ptr + N + offs, x, mask=as_mask(tl.broadcast_to(num_splits > 1, offs.shape)))


@pytest.mark.parametrize("n,num_splits", [(5, 1), (0, 1), (16, 1), (5, 2), (16, 3)])
def test_masked_lanes_are_the_conditions(n, num_splits, kernel_device):
    src = torch.arange(1, 17, dtype=torch.float32, device=kernel_device)
    dst = torch.full((32,), float("nan"), device=kernel_device)
    _copy_where[(1,)](src, dst, n, num_splits, N=16)
    got = dst.cpu()
    first = num_splits == 1
    expect = torch.full((32,), float("nan"))
    if first:
        expect[:n] = src[:n].cpu()
    else:
        expect[16:] = -1.0  # the loads' other: every lane masked off
    assert torch.equal(got.isnan(), expect.isnan()) and torch.equal(got.nan_to_num(), expect.nan_to_num())


_KERNEL = """
import triton
import triton.language as tl
from kvattn.ops.common import as_mask


@triton.jit
def kernel(src_ptr, dst_ptr, n, num_splits, N: tl.constexpr):
    offs = tl.arange(0, N)
    ok = {wrap}((offs < n) & (num_splits == 1))
    x = tl.load(src_ptr + offs, mask=ok, other=-1.0)
    tl.store(dst_ptr + offs, x, mask=ok)
    tl.store(dst_ptr + N + offs, x, mask={wrap}(tl.broadcast_to(num_splits > 1, offs.shape)))
"""


def _without_debug_info(got: dict) -> tuple[str, str]:
    """TTGIR and PTX without source locations (the two kernels live in different files)."""
    ttgir = "\n".join(line for line in got["ttgir"].splitlines() if not line.startswith("#loc"))
    ttgir = re.sub(r" loc\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)", "", ttgir)
    ptx = got["ptx"].split("\t.section\t.debug")[0]
    ptx = "\n".join(line for line in ptx.splitlines() if not re.match(r"\s*\.(loc|file)\b", line))
    return ttgir, ptx


@pytest.mark.codegen
def test_as_mask_compiles_to_the_bare_mask(tmp_path, monkeypatch):
    """The same kernel with and without as_mask (one module each, so names match) compiles to the
    same TTGIR and PTX: the comparison with false folds away."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    compiled = []
    for name, wrap in (("bare", ""), ("wrapped", "as_mask")):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(_KERNEL.format(wrap=wrap)))
        got = compile_sm90(f"{name}.kernel", dict(N=128), ptrs={}, default_ptr="*fp32")
        compiled.append(_without_debug_info(got))
    (bare_ttgir, bare_ptx), (ttgir, ptx) = compiled
    assert ttgir == bare_ttgir
    assert ptx == bare_ptx
