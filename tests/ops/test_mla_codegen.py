"""What the MLA decode kernel compiles to for Hopper (sm_90a): the split score products.

Compiled (not run) for an sm_90a target, so no GPU is needed (``tests/ops/sm90.py``). Pins the
Triton 3.6 behaviour the ``"split"`` table entries rest on (``mla_kernels._mla_tile_scores``,
``benchmarks/NOTES.md`` session h): a score product whose result reaches the P.V product gets all
8 warps along its 64 rows, so both warpgroups compute the whole score tile; behind the layout
fences each warpgroup computes half of it, and the row loads stay software-pipelined.
"""

from __future__ import annotations

import re

import pytest

from .sm90 import compile_sm90

PTRS = {"table_ptr": "*i32", "seq_lens_ptr": "*i32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32",
        "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16"}
BASE = dict(CKV_DIM=512, KPE_DIM=64, PAGE_SIZE=64, BLOCK_H=64, BLOCK_N=64, H_BLOCKS=2, KV_FORMAT=0,
            LOGIT_PTR=False, OUT_PTR=False, QK_FP8=False, HEADS_AS_N=False)


def _compile(split: bool, **constexprs) -> dict:
    got = compile_sm90("kvattn.ops.mla_kernels.mla_split_kernel", dict(BASE, SPLIT_SCORES=split, **constexprs),
                       ptrs=PTRS, floats=("logit_factor", "out_factor"), warps=8, stages=2)
    return {"score_wgmmas": len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16", got["ptx"])),
            "warps": sorted(set(re.findall(r"warpsPerCTA = \[(\d+), (\d+)\], instrShape = \[16, 32, 16\]",
                                           got["ttgir"]))),
            "cp_async": len(re.findall(r"cp\.async\.c[ag]", got["ptx"]))}


@pytest.mark.parametrize("split", [False, True], ids=["chained", "split"])
def test_score_products_split_between_warpgroups(split):
    """bf16, 64 heads x 64 keys, 8 warps: 36 k-steps (512 + 64 columns / 16) of m64n32k16 a
    warpgroup when each computes half of the keys, twice that when both compute all of them."""
    got = _compile(split)
    assert got["warps"] == ([("4", "2")] if split else [("8", "1")])
    assert got["score_wgmmas"] == (36 if split else 72)
    assert got["cp_async"] > 0
