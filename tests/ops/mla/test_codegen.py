"""What the MLA decode kernels compile to for Hopper (sm_90a): the split score products, and the
schedules of the two Gluon kernels (``ops/mla/kernels_gluon.py``, ``ops/mla/kernels_gluon_ws.py``).

Compiled (not run) for an sm_90a target, so no GPU is needed (``tests/ops/sm90.py``). Pins the
Triton 3.6 behaviour the ``"split"`` table entries rest on (``ops/mla/kernels.py``
``_mla_tile_scores``, ``lab/notes/mla.md`` "MLA: the score tile split between the warpgroups"):
a score product whose result reaches the P.V product gets all 8 warps along its 64 rows, so both
warpgroups compute the whole score tile; behind the layout fences each warpgroup computes half of
it, and the row loads stay software-pipelined.
"""

from __future__ import annotations

import collections
import re

import pytest

from ..sm90 import compile_sm90, skip_unless_gpu_verified

pytestmark = pytest.mark.codegen  # compiled, not run: CI runs these (pyproject.toml markers)

PTRS = {"table_ptr": "*i32", "seq_lens_ptr": "*i32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32",
        "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32"}
BASE = dict(CKV_DIM=512, KPE_DIM=64, PAGE_SIZE=64, BLOCK_H=64, BLOCK_N=64, H_BLOCKS=2, KV_FORMAT=0,
            LOGIT_PTR=False, OUT_PTR=False, QK_FP8=False, HEADS_AS_N=False, STORE_LSE=False, SPLIT_SPAN=0, Q_LEN=1,
            BALANCED=False, BLOCK_B=1, MIN_CHUNK=0, UNITS_CAP=1)
# The balanced split of a ragged batch (mla/plan.py: 32 requests, 64 units a request at most)
BALANCED = dict(BALANCED=True, BLOCK_B=32, MIN_CHUNK=256, UNITS_CAP=64)


def _compile(split: bool, **constexprs) -> dict:
    got = compile_sm90("kvattn.ops.mla.kernels.mla_split_kernel", dict(BASE, SPLIT_SCORES=split, **constexprs),
                       ptrs=PTRS, floats=("logit_factor", "out_factor"), warps=8, stages=2)
    return {"score_wgmmas": len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16", got["ptx"])),
            "warps": sorted(set(re.findall(r"warpsPerCTA = \[(\d+), (\d+)\], instrShape = \[16, 32, 16\]",
                                           got["ttgir"]))),
            "cp_async": len(re.findall(r"cp\.async\.c[ag]", got["ptx"])), "stack": got.get("stack"),
            "reg": got.get("reg")}


@pytest.mark.parametrize("split", [False, True], ids=["chained", "split"])
def test_score_products_split_between_warpgroups(split):
    """bf16, 64 heads x 64 keys, 8 warps: 36 k-steps (512 + 64 columns / 16) of m64n32k16 a
    warpgroup when each computes half of the keys, twice that when both compute all of them."""
    got = _compile(split)
    assert got["warps"] == ([("4", "2")] if split else [("8", "1")])
    assert got["score_wgmmas"] == (36 if split else 72)
    assert got["cp_async"] > 0


# ---------------------------------------------------------------------------------------------
# The Gluon kernel (16-bit caches on Hopper, kvattn.ops.mla.kernels_gluon)
# ---------------------------------------------------------------------------------------------
GLUON_PTRS = dict(PTRS, q_ptr="*bf16")
GLUON_BASE = dict(CKV_DIM=512, KPE_DIM=64, PAGE_SIZE=64, BLOCK_H=64, BLOCK_N=64, H_BLOCKS=2, LOGIT_PTR=False,
                  OUT_PTR=False, STORE_LSE=False, SPLIT_SPAN=0, Q_LEN=1, BALANCED=False, BLOCK_B=1, MIN_CHUNK=0,
                  UNITS_CAP=1)
ROW_SMEM = ("NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False, "
            "fp4_padded=False, cga_layout=[])")
# Pages of 64+ tokens, and of 16 and 32: a 64-key tile over 4 / 2 pages, copied one box of a page's
# rows a page (mla/plan.py _tile_pages); the descriptor's box is [min(page, 64), 64].
PAGES = [pytest.param(64, id="p64"), pytest.param(256, id="p256"), pytest.param(16, id="p16"),
         pytest.param(32, id="p32")]


def _stack_free(got: dict) -> None:
    """No stack frame (where the compile reports one): a fact of the GPU-verified Tritons (3.6 and
    3.7.1). Triton 3.9's ptxas gives the warp-specialised kernel one (24 bytes for its copy warp
    over pages of 16; 8-16 bytes at every page size once the final rows go through a free buffer),
    so there the test stops, skipped, at this check."""
    if got.get("stack"):
        skip_unless_gpu_verified("Triton 3.9's ptxas gives the warp-specialised kernel an 8-24-byte stack frame")
    assert got.get("stack", 0) == 0


def _kv_desc(page: int, elem: str = "bf16", smem: str = ROW_SMEM) -> dict:
    return {"kv_desc": f"tensordesc<{elem}[{min(page, 64)}, 64],{smem}>"}


def _boxes_a_tile(page: int) -> int:
    """TMA boxes a 64-column piece of a tile: one, or one a page over pages smaller than the tile."""
    return 64 // min(page, 64)


@pytest.mark.parametrize("page,extra", [*(pytest.param(p.values[0], {}, id=p.id) for p in PAGES),
                                        pytest.param(64, BALANCED, id="p64-balanced"),
                                        pytest.param(16, BALANCED, id="p16-balanced")])
def test_gluon_kernel_compiles_to_its_schedule(page, extra):
    """The Gluon MLA kernel still compiles with this Triton (its language is experimental), and to
    what its docstring promises: whole-tile m64n64 score wgmmas in each warpgroup (36 k-steps of
    512 + 64 columns) and m64n256 P.V ones, nine + nine TMA copies before the loop and nine in it
    (each one a page over pages of 16 / 32: 4 / 2 times as many, the expected bytes a tile's), the
    query and two row buffers in shared memory (216 KB of the 227 an H100 gives a program), and no
    register spill; the balanced split's unit decode at the program's start changes none of it."""
    got = compile_sm90("kvattn.ops.mla.kernels_gluon.mla_gluon_kernel", dict(GLUON_BASE, PAGE_SIZE=page, **extra),
                       ptrs=GLUON_PTRS, floats=("logit_factor", "out_factor"), warps=8, gluon=True,
                       descs=_kv_desc(page))
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)) == 36
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16", ptx)) == 4
    assert len(re.findall(r"cp\.async\.bulk\.tensor", ptx)) == 27 * _boxes_a_tile(page)
    expects = re.findall(r"expect_tx\.shared(?:::cta)?\.b64 _, \[%r\d+\], (\d+);", ptx)
    assert expects == [str(64 * 576 * 2)] * 3
    assert 216 * 1024 < got["shared"] <= 227 * 1024
    if "stack" in got:
        assert got["stack"] == 0 and got["reg"] <= 255


def test_gluon_kernel_stores_the_lse_without_spilling():
    """``return_lse`` (STORE_LSE): the final rows' LSE stored from the kernel's epilogue, still no
    register spill and the same loop."""
    got = compile_sm90("kvattn.ops.mla.kernels_gluon.mla_gluon_kernel", dict(GLUON_BASE, STORE_LSE=True), ptrs=GLUON_PTRS,
                       floats=("logit_factor", "out_factor"), warps=8, gluon=True,
                       descs={"kv_desc": f"tensordesc<bf16[64, 64],{ROW_SMEM}>"})
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)) == 36
    assert len(re.findall(r"st\.global[.a-z0-9]*\.b32", ptx)) > 0
    if "stack" in got:
        assert got["stack"] == 0 and got["reg"] <= 255


# ---------------------------------------------------------------------------------------------
# The warp-specialised Gluon kernel (the Gluon kernel's launches on sm90, kvattn.ops.mla.kernels_gluon_ws)
# ---------------------------------------------------------------------------------------------
# Every constexpr: one left out would compile as an i32 argument. (STORE_LSE is the Gluon kernel's
# only: a launch asking for an LSE keeps that kernel.)
WS_BASE = {k: v for k, v in GLUON_BASE.items() if k != "STORE_LSE"}
WS_KERNEL = "kvattn.ops.mla.kernels_gluon_ws.mla_gluon_ws_kernel"
ROW_SMEM8 = ("NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2, transposed=False, "
             "fp4_padded=False, cga_layout=[])")
FP8_PTRS = dict(GLUON_PTRS, q_ptr="*fp8e4nv")


def _compile_ws(fp8: bool = False, kernel: str = WS_KERNEL, *, out: str = "bf16", part: str = "fp32",
                sass: bool = False, **constexprs) -> dict:
    """The warp-specialised kernel (or a patched copy, ``kernel``) compiled for sm_90a: its 16-bit
    form, or with ``fp8`` its e4m3 form; ``out`` the output's dtype, ``part`` the split partials';
    constexprs over ``WS_BASE``."""
    page = constexprs.get("PAGE_SIZE", 64)
    ptrs = dict(FP8_PTRS if fp8 else GLUON_PTRS, out_ptr=f"*{out}", part_o_ptr=f"*{part}")
    return compile_sm90(kernel, dict(WS_BASE, **constexprs), ptrs=ptrs,
                        floats=("logit_factor", "out_factor"), warps=4, gluon=True, sass=sass,
                        descs=_kv_desc(page, "fp8e4nv", ROW_SMEM8) if fp8 else _kv_desc(page))


@pytest.mark.parametrize("page", PAGES)
def test_ws_kernel_compiles_to_its_schedule(page):
    """Per pair of 64-key tiles: each warpgroup's score tile as m64n64 wgmmas (36 k-steps of
    64 + 512 columns, two warpgroups), its two half P.V products as m64n256 ones (4 k-steps each),
    18 TMA boxes from the copy warp (rope 2 x 1, values 4 x 4; one a page over pages of 16 / 32:
    4 / 2 times as many, each part's expected bytes unchanged); registers 240 / 240 / 24 for the
    two warpgroups and the copy warp (the pair's page ids one a lane there: no spill at 24);
    shared memory within 227 KB; no spill; and the wgmmas left
    asynchronous by ptxas: a handful of waits (one a product), not one after every wgmma, which is
    what ptxas emits when it serialises them (C7514 / C7515: a P.V product in flight across the
    loop's back edge did it, lab/notes/mla.md "MLA: seesaw (warp-specialised Gluon kernel)")."""
    got = _compile_ws(PAGE_SIZE=page, sass=True)
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16", ptx)) == 72
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16", ptx)) == 16
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) == 18 * _boxes_a_tile(page)
    expects = re.findall(r"expect_tx\.shared(?:::cta)?\.b64 _, \[%r\d+\], (\d+);", ptx)
    assert sorted(expects) == ["32768"] * 4 + ["8192"] * 2
    regs = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert {"240", "24"} <= regs
    assert 216 * 1024 < got["shared"] <= 227 * 1024
    _stack_free(got)
    if "reg" in got:
        assert got["reg"] <= 255
    if "sass" in got:
        assert len(re.findall(r"\bHGMMA\.", got["sass"])) == 88
        assert len(re.findall(r"WARPGROUP\.DEPBAR", got["sass"])) <= 8


@pytest.mark.parametrize("kernel", ["balanced_combine_kernel", "decode_combine_kernel"])
def test_combines_fold_bfloat16_partials_without_a_layout_change(kernel):
    """The combines' merge of bfloat16 partials (``merge_partials`` folds 16-bit partials split by
    split) crosses shared memory no more than the float32 merge: the summed tile of 16-bit loads
    went through shared memory to change layout, a 3x slower combine."""
    cx = dict(NUM_HEADS=64, HEAD_DIM=512, BLOCK_S=16, OUT_PTR=False, STORE_LSE=False, USE_PDL=True)
    cx.update(dict(BLOCK_S_FEW=2, MIN_CHUNK=256, BLOCK_N=64, BLOCK_B=64, UNITS_CAP=64) if kernel.startswith("balanced")
              else dict(HAS_SINKS=False, OUT_FP8=False))
    shared = []
    for part in ("fp32", "bf16"):
        ptrs = dict(part_o_ptr=f"*{part}", part_lse_ptr="*fp32", seq_lens_ptr="*i32", out_scale_ptr="*fp32",
                    out_ptr="*bf16", lse_ptr="*fp32", sinks_ptr="*fp32")
        ptx = compile_sm90(f"kvattn.ops.common.combine.{kernel}", cx, ptrs=ptrs, floats=("out_factor",))["ptx"]
        shared.append((len(re.findall(r"st\.shared", ptx)), len(re.findall(r"bar\.sync", ptx))))
    assert shared[1][0] <= shared[0][0] and shared[1][1] <= shared[0][1], shared


@pytest.mark.parametrize("fp8", [pytest.param(False, id="bf16"), pytest.param(True, id="fp8")])
def test_ws_kernel_stages_bfloat16_partials_like_its_final_rows(fp8):
    """bfloat16 split partials (plan.partials16) leave through the warpgroup's stage with the final
    rows: the accumulator's 128 8-byte stores of float32 partials are gone, the stage's 32 16-byte
    row stores serve both, and registers and shared memory are those of the float32 form."""
    f32, b16 = (_compile_ws(fp8, part=p, **BALANCED) for p in ("fp32", "bf16"))
    stores = [collections.Counter(re.findall(r"st\.global[.\w]*", g["ptx"])) for g in (f32, b16)]
    assert stores[0]["st.global.v2.b32"] == 128 and stores[1]["st.global.v2.b32"] == 0
    assert stores[0]["st.global.v4.b32"] == stores[1]["st.global.v4.b32"] == 32
    assert b16["shared"] == f32["shared"]
    _stack_free(b16)


@pytest.mark.parametrize("fp8", [pytest.param(False, id="bf16"), pytest.param(True, id="fp8")])
def test_ws_kernel_stages_the_query_in_one_cp_async_group(fp8):
    """The query goes to shared memory as one group of 16-byte ``cp.async`` copies (nine 64-column
    pieces of 64 rows, 128 threads: 4 copies a thread and piece in 16 bits, 2 in e4m3), rows past
    Hq zero-filled (a source size of 0), never through registers (no vector global load: staged
    through registers, ptxas serialised the pieces into five round trips)."""
    got = _compile_ws(fp8)
    ptx = got["ptx"]
    copies = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]+\], \[[^]]+\], 0x10, (%r\d+);", ptx)
    assert len(copies) == 9 * (2 if fp8 else 4)
    assert len(re.findall(r"cp\.async\.commit_group", ptx)) == 1
    assert len(re.findall(r"cp\.async\.wait_group\s+0;", ptx)) == 1
    # the source size of each copy: 16 bytes for a real head's row, 0 (zero fill) past Hq
    assert all(re.search(rf"selp\.b32\s+{re.escape(r)}, 16, 0, %p\d+;", ptx) for r in set(copies))
    assert not re.findall(r"ld\.global[.a-z0-9]*\.v4", ptx)
    _stack_free(got)


@pytest.mark.parametrize("fp8", [pytest.param(False, id="bf16"), pytest.param(True, id="fp8")])
@pytest.mark.parametrize("splits", [pytest.param(1, id="one-split"), pytest.param(None, id="splits")])
@pytest.mark.parametrize("out", ["bf16", "fp32"], ids=["out-bf16", "out-fp32"])
def test_ws_kernel_writes_its_final_rows_through_a_free_buffer(out, splits, fp8):
    """bfloat16 final rows leave through a free buffer of each warpgroup (the 16-bit form: its
    column half of the query buffer; the e4m3 form: one of its float16 value buffers seen as
    bfloat16) as 16-byte stores, a warp a row: 16 a thread and warpgroup, 32 in all; float32 rows
    (twice the buffer's bytes) and the split partials keep the accumulator's stores; the
    ``syncstore`` form (the stores before) has no vector store; both the same products, shared
    memory and no spill, also as a one-split launch specialises them."""
    forms = {}
    extra = {} if splits is None else {"num_splits": splits}
    for name, kernel in (("library", WS_KERNEL), ("before", "benchmarks.mla_ws_floors.floor_kernel_syncstore")):
        got = _compile_ws(fp8, kernel, out=out, **extra)
        ptx = got["ptx"]
        forms[name] = dict(vector=len(re.findall(r"st\.global[.a-z0-9]*\.v4\.b32", ptx)),
                           pairs=len(re.findall(r"st\.global[.a-z0-9]*\.v2\.f32", ptx)),
                           wgmma=len(re.findall(r"wgmma\.mma_async", ptx)), shared=got["shared"],
                           stack=got.get("stack", 0))
    assert forms["library"]["vector"] == (32 if out == "bf16" else 0) and forms["before"]["vector"] == 0
    assert forms["library"]["pairs"] == forms["before"]["pairs"]
    for key in ("wgmma", "shared"):
        assert forms["library"][key] == forms["before"][key]
    _stack_free(forms["before"])
    _stack_free(forms["library"])


@pytest.mark.parametrize("fp8", [pytest.param(False, id="bf16"), pytest.param(True, id="fp8")])
def test_ws_kernel_compiles_as_a_one_split_launch_specialises_it(fp8):
    """On the GPU Triton specialises an integer argument of 1 into a constant, so a launch of one
    split compiles ``num_splits == 1`` as a constant (its partial stores gone): that form must
    compile too (an epilogue form that passed the unspecialised compile failed there in Triton
    3.6's LLVM lowering, lab/notes/mla-program-ends.md "What one program pays"), with the query's
    copies and no spill."""
    got = _compile_ws(fp8, num_splits=1)
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", got["ptx"])) == 9 * (2 if fp8 else 4)
    _stack_free(got)


@pytest.mark.parametrize("page", [pytest.param(64, id="p64"), pytest.param(16, id="p16")])
def test_ws_kernel_keeps_its_budget_in_batch_invariant_mode(page):
    """Fixed-span splits (SPLIT_SPAN, lab/notes/robustness.md "Batch-invariant mode") change only the
    split bounds: the same registers, no spill, the same shared memory."""
    got = _compile_ws(SPLIT_SPAN=1024, PAGE_SIZE=page)
    regs = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", got["ptx"]))
    assert {"240", "24"} <= regs
    assert 216 * 1024 < got["shared"] <= 227 * 1024
    _stack_free(got)
    if "reg" in got:
        assert got["reg"] <= 255


# The e4m3 form (an fp8 query over an fp8 cache: the same kernel, its FP8 branch)
def _compile_fp8(kernel: str = WS_KERNEL, **constexprs) -> dict:
    return _compile_ws(True, kernel, sass=True, **constexprs)


@pytest.mark.parametrize("page", PAGES)
def test_ws_fp8_kernel_compiles_to_its_schedule(page):
    """The e4m3 form, per pair of 64-key tiles: each warpgroup's score tile as m64n64k32 e4m3
    wgmmas (18 k-steps of 64 + 512 byte columns, two warpgroups), the half P.V products on float16
    as m64n256k16 (4 k-steps each); 18 TMA boxes of 64 bytes x 64 rows (4 KB: 4096 / 16384 bytes
    a part); each value converted once, e4m3 pairs to float16 by one instruction (4 halves of
    64 x 256 a pair: 256 a thread), read and written 16 bytes at a time and no byte loads in the
    loop; registers 240 / 240 / 24, no spill; shared memory 214 KB (the query, two byte tiles,
    three float16 value halves, P); and the wgmmas left asynchronous by ptxas (a handful of waits,
    not one after each: lab/notes/mla.md "MLA: seesaw (warp-specialised Gluon kernel)"). Pages of
    16 / 32: 4 / 2 times the boxes, one a page, the same bytes a part."""
    got = _compile_fp8(PAGE_SIZE=page)
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.f32\.e4m3\.e4m3", ptx)) == 36
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.f16\.f16", ptx)) == 16
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == 52
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) == 18 * _boxes_a_tile(page)
    expects = re.findall(r"expect_tx\.shared(?:::cta)?\.b64 _, \[%r\d+\], (\d+);", ptx)
    assert sorted(expects) == ["16384"] * 4 + ["4096"] * 2
    assert len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", ptx)) == 256
    regs = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert {"240", "24"} <= regs
    assert 200 * 1024 < got["shared"] <= 216 * 1024
    _stack_free(got)
    if "reg" in got:
        assert got["reg"] <= 255
    if "sass" in got:
        sass = got["sass"]
        assert len(re.findall(r"\bQGMMA\.", sass)) == 36 and len(re.findall(r"\bHGMMA\.", sass)) == 16
        assert len(re.findall(r"WARPGROUP\.DEPBAR", sass)) <= 8
        assert len(re.findall(r"F2FP\.F16\.E4M3\.UNPACK", sass)) == 256
        # (one byte load in the partitions' prologue, as in the 16-bit form)
        assert len(re.findall(r"\bLDS\.U8\b", sass)) <= 1
        assert len(re.findall(r"\bLDS\.128\b", sass)) >= 32 and len(re.findall(r"\bSTS\.128\b", sass)) >= 64


def test_ws_fp8_timing_floors_compile():
    """The e4m3 form's timing floors (patched copies of the kernel's source built by
    ``benchmarks/mla_ws_floors.py``: no copies, no value conversion) compile within the same
    budget, the no-conversion floor without any conversion instruction; the library's kernel has
    no such switch."""
    for floor in ("nocopies", "noconvert"):
        got = _compile_fp8(f"benchmarks.mla_ws_floors.floor_kernel_{floor}")
        assert got["shared"] <= 216 * 1024
        _stack_free(got)
        assert len(re.findall(r"cvt\.rn\.f16x2\.e4m3x2", got["ptx"])) == (0 if floor == "noconvert" else 256)
        assert len(re.findall(r"cp\.async\.bulk\.tensor", got["ptx"])) == (0 if floor == "nocopies" else 18)


@pytest.mark.parametrize("fp8", [pytest.param(False, id="bf16"), pytest.param(True, id="fp8")])
def test_ws_nocopies_floor_copies_nothing_over_small_pages(fp8):
    """Over pages of 16 the copy warp copies page by page (``_copy_part_pages``), apart from the
    path of pages of 64+: the ``nocopies`` floor patches both, so its copy warp issues no TMA load
    and expects no bytes where the library's kernel issues a box a page (4 x 18) against each part's
    byte count; the products are the same, so the floor times the kernel less its copies."""
    page = 16
    wgmma = r"m64n64k32\.f32\.e4m3\.e4m3" if fp8 else r"m64n64k16\.f32\.bf16\.bf16"
    counts = {}
    for name, kernel in (("library", WS_KERNEL), ("floor", "benchmarks.mla_ws_floors.floor_kernel_nocopies")):
        ptx = _compile_ws(fp8, kernel, PAGE_SIZE=page)["ptx"]
        counts[name] = {"tma": len(re.findall(r"cp\.async\.bulk\.tensor", ptx)),
                        "expect": len(re.findall(r"expect_tx", ptx)),
                        "scores": len(re.findall(r"wgmma\.mma_async\.sync\.aligned\." + wgmma, ptx))}
    assert counts["library"]["tma"] == 18 * _boxes_a_tile(page) and counts["library"]["expect"] == 6
    assert counts["floor"]["tma"] == 0 and counts["floor"]["expect"] == 0
    assert counts["floor"]["scores"] == counts["library"]["scores"] == (36 if fp8 else 72)

# ---------------------------------------------------------------------------------------------
# Multi-token prediction (Q_LEN > 1): the per-row key limits cost no product, register or buffer
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", [pytest.param(64, id="p64"), pytest.param(16, id="p16")])
def test_ws_kernel_with_four_tokens_keeps_its_schedule(page):
    """Q_LEN 4 (16 heads x 4 tokens in the 64 rows): the same products, TMA boxes, registers and
    shared memory as one token, no spill; the per-row limits are a mask, not a second schedule."""
    got = _compile_ws(Q_LEN=4, PAGE_SIZE=page)
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16", ptx)) == 72
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16", ptx)) == 16
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) == 18 * _boxes_a_tile(page)
    assert {"240", "24"} <= set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert 216 * 1024 < got["shared"] <= 227 * 1024
    if "stack" in got:
        skip_unless_gpu_verified("Triton 3.9's ptxas gives the 4-token kernel an 8-byte stack frame")
        assert got["stack"] == 0 and got["reg"] <= 255


def test_ws_fp8_kernel_with_four_tokens_keeps_its_schedule():
    got = _compile_fp8(Q_LEN=4)
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k32\.f32\.e4m3\.e4m3", ptx)) == 36
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.f16\.f16", ptx)) == 16
    assert 200 * 1024 < got["shared"] <= 216 * 1024
    if "stack" in got:
        skip_unless_gpu_verified("Triton 3.9's ptxas gives the 4-token kernel an 8-byte stack frame")
        assert got["stack"] == 0 and got["reg"] <= 255


def test_gluon_kernel_with_four_tokens_keeps_its_schedule():
    got = compile_sm90("kvattn.ops.mla.kernels_gluon.mla_gluon_kernel", dict(GLUON_BASE, Q_LEN=4, STORE_LSE=True),
                       ptrs=GLUON_PTRS, floats=("logit_factor", "out_factor"), warps=8, gluon=True,
                       descs={"kv_desc": f"tensordesc<bf16[64, 64],{ROW_SMEM}>"})
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", got["ptx"])) == 36
    assert got["shared"] <= 227 * 1024
    if "stack" in got:
        assert got["stack"] == 0 and got["reg"] <= 255


# ---------------------------------------------------------------------------------------------
# The balanced split (BALANCED: common.balance / common.gluon_balance): the unit decode at each
# program's start costs no product, buffer or spill
# ---------------------------------------------------------------------------------------------
def test_triton_kernel_balanced_keeps_its_products():
    """The Triton kernel's balanced form: the same split score products, the row loads still
    pipelined and no more stack than the uniform split's (the plan is scalar work before the loop)."""
    got, uniform = _compile(True, **BALANCED), _compile(True)
    assert got["warps"] == [("4", "2")] and got["score_wgmmas"] == 36 and got["cp_async"] > 0
    if got["stack"] is not None:
        if got["stack"] > uniform["stack"]:
            skip_unless_gpu_verified("Triton 3.9's ptxas gives the balanced Triton kernel a 16-byte stack frame "
                                     "(the uniform one 8)")
        assert got["stack"] <= uniform["stack"] and got["reg"] <= 255


@pytest.mark.parametrize("page", [pytest.param(64, id="p64"), pytest.param(16, id="p16")])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_ws_kernel_balanced_keeps_its_budget(fp8, page):
    """The warp-specialised kernel's balanced form (bf16 and e4m3, pages of 64 and 16): the same
    products, TMA boxes, registers 240 / 240 / 24 and shared memory as the uniform split, no spill."""
    if fp8:
        got = _compile_fp8(PAGE_SIZE=page, **BALANCED)
        wgmmas, shared = (r"m64n64k32\.f32\.e4m3\.e4m3", 36), (200 * 1024, 216 * 1024)
    else:
        got = _compile_ws(PAGE_SIZE=page, **BALANCED)
        wgmmas, shared = (r"m64n64k16\.f32\.bf16\.bf16", 72), (216 * 1024, 227 * 1024)
    ptx = got["ptx"]
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\." + wgmmas[0], ptx)) == wgmmas[1]
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) == 18 * _boxes_a_tile(page)
    assert {"240", "24"} <= set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert shared[0] < got["shared"] <= shared[1]
    _stack_free(got)
    if "reg" in got:
        assert got["reg"] <= 255
