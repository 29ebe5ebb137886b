"""What the MLA decode kernels compile to for Hopper (sm_90a): the split score products, and the
schedules of the two Gluon kernels (``ops/mla/gluon.py``, ``ops/mla/gluon_ws.py``).

Compiled (not run) for an sm_90a target, so no GPU is needed (``tests/ops/sm90.py``). Pins the
Triton 3.6 behaviour the ``"split"`` table entries rest on (``ops/mla/kernels.py``
``_mla_tile_scores``, ``benchmarks/NOTES.md`` "MLA: the score tile split between the warpgroups"):
a score product whose result reaches the P.V product gets all 8 warps along its 64 rows, so both
warpgroups compute the whole score tile; behind the layout fences each warpgroup computes half of
it, and the row loads stay software-pipelined.
"""

from __future__ import annotations

import re

import pytest

from ..sm90 import compile_sm90

PTRS = {"table_ptr": "*i32", "seq_lens_ptr": "*i32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32",
        "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32"}
BASE = dict(CKV_DIM=512, KPE_DIM=64, PAGE_SIZE=64, BLOCK_H=64, BLOCK_N=64, H_BLOCKS=2, KV_FORMAT=0,
            LOGIT_PTR=False, OUT_PTR=False, QK_FP8=False, HEADS_AS_N=False, STORE_LSE=False, SPLIT_SPAN=0)


def _compile(split: bool, **constexprs) -> dict:
    got = compile_sm90("kvattn.ops.mla.kernels.mla_split_kernel", dict(BASE, SPLIT_SCORES=split, **constexprs),
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


# ---------------------------------------------------------------------------------------------
# The Gluon kernel (16-bit caches on Hopper, kvattn.ops.mla.gluon)
# ---------------------------------------------------------------------------------------------
GLUON_PTRS = dict(PTRS, q_ptr="*bf16")
GLUON_BASE = dict(CKV_DIM=512, KPE_DIM=64, PAGE_SIZE=64, BLOCK_H=64, BLOCK_N=64, H_BLOCKS=2, LOGIT_PTR=False,
                  OUT_PTR=False, STORE_LSE=False, SPLIT_SPAN=0)
ROW_SMEM = ("NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False, "
            "fp4_padded=False, cga_layout=[])")


@pytest.mark.parametrize("page", [64, 256], ids=["p64", "p256"])
def test_gluon_kernel_compiles_to_its_schedule(page):
    """The Gluon MLA kernel still compiles with this Triton (its language is experimental), and to
    what its docstring promises: whole-tile m64n64 score wgmmas in each warpgroup (36 k-steps of
    512 + 64 columns) and m64n256 P.V ones, nine + nine TMA copies before the loop and nine in it,
    the query and two row buffers in shared memory (216 KB of the 227 an H100 gives a program), and
    no register spill."""
    got = compile_sm90("kvattn.ops.mla.gluon.mla_gluon_kernel", dict(GLUON_BASE, PAGE_SIZE=page), ptrs=GLUON_PTRS,
                       floats=("logit_factor", "out_factor"), warps=8, gluon=True,
                       descs={"kv_desc": f"tensordesc<bf16[64, 64],{ROW_SMEM}>"})
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)) == 36
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16", ptx)) == 4
    assert len(re.findall(r"cp\.async\.bulk\.tensor", ptx)) == 27
    assert got["shared"] <= 227 * 1024
    if "stack" in got:
        assert got["stack"] == 0 and got["reg"] <= 255


def test_gluon_kernel_stores_the_lse_without_spilling():
    """``return_lse`` (STORE_LSE): the final rows' LSE stored from the kernel's epilogue, still no
    register spill and the same loop."""
    got = compile_sm90("kvattn.ops.mla.gluon.mla_gluon_kernel", dict(GLUON_BASE, STORE_LSE=True), ptrs=GLUON_PTRS,
                       floats=("logit_factor", "out_factor"), warps=8, gluon=True,
                       descs={"kv_desc": f"tensordesc<bf16[64, 64],{ROW_SMEM}>"})
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)) == 36
    assert len(re.findall(r"st\.global[.a-z0-9]*\.b32", ptx)) > 0
    if "stack" in got:
        assert got["stack"] == 0 and got["reg"] <= 255


# ---------------------------------------------------------------------------------------------
# The warp-specialised Gluon kernel (the Gluon kernel's launches on sm90, kvattn.ops.mla.gluon_ws)
# ---------------------------------------------------------------------------------------------
# Every constexpr, its schedule switches too: one left out would compile as an i32 argument.
# (STORE_LSE is the Gluon kernel's only: a launch asking for an LSE keeps that kernel.)
WS_BASE = dict({k: v for k, v in GLUON_BASE.items() if k != "STORE_LSE"}, FLOOR=0, STAGGER=True, PA_REGS=True)


@pytest.mark.parametrize("page", [64, 256], ids=["p64", "p256"])
def test_ws_kernel_compiles_to_its_schedule(page):
    """Per pair of 64-key tiles: each warpgroup's score tile as m64n64 wgmmas (36 k-steps of
    64 + 512 columns, two warpgroups), its two half P.V products as m64n256 ones (4 k-steps each),
    18 TMA boxes from the copy warp (rope 2 x 1, values 4 x 4); registers 240 / 240 / 24 for the
    two warpgroups and the copy warp; shared memory within 227 KB; no spill; and the wgmmas left
    asynchronous by ptxas: a handful of waits (one a product), not one after every wgmma, which is
    what ptxas emits when it serialises them (C7514 / C7515: a P.V product in flight across the
    loop's back edge did it, benchmarks/NOTES.md "MLA: seesaw (warp-specialised Gluon kernel)")."""
    got = compile_sm90("kvattn.ops.mla.gluon_ws.mla_gluon_ws_kernel", dict(WS_BASE, PAGE_SIZE=page),
                       ptrs=GLUON_PTRS, floats=("logit_factor", "out_factor"), warps=4, gluon=True,
                       descs={"kv_desc": f"tensordesc<bf16[64, 64],{ROW_SMEM}>"}, sass=True)
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16", ptx)) == 72
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16", ptx)) == 16
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) == 18
    regs = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert {"240", "24"} <= regs
    assert 216 * 1024 < got["shared"] <= 227 * 1024
    if "stack" in got:
        assert got["stack"] == 0 and got["reg"] <= 255
    if "sass" in got:
        assert len(re.findall(r"\bHGMMA\.", got["sass"])) == 88
        assert len(re.findall(r"WARPGROUP\.DEPBAR", got["sass"])) <= 8


def test_ws_kernel_keeps_its_budget_in_batch_invariant_mode():
    """Fixed-span splits (SPLIT_SPAN, benchmarks/NOTES.md "Batch-invariant mode") change only the
    split bounds: the same registers, no spill, the same shared memory."""
    got = compile_sm90("kvattn.ops.mla.gluon_ws.mla_gluon_ws_kernel", dict(WS_BASE, SPLIT_SPAN=1024),
                       ptrs=GLUON_PTRS, floats=("logit_factor", "out_factor"), warps=4, gluon=True,
                       descs={"kv_desc": f"tensordesc<bf16[64, 64],{ROW_SMEM}>"})
    regs = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", got["ptx"]))
    assert {"240", "24"} <= regs
    assert 216 * 1024 < got["shared"] <= 227 * 1024
    if "stack" in got:
        assert got["stack"] == 0 and got["reg"] <= 255
