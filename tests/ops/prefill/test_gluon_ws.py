"""The warp-specialised Gluon prefill kernel (``kvattn.ops.prefill.plan_gluon_ws``).

CPU tier: which launches the host hands to it (every other one keeps the Triton kernel), the
TMA views of each page form, and what the kernel compiles to for sm_90a under the Triton in use
(run this file under both venvs): three partitions with their registers moved by ``setmaxnreg``,
the wgmma counts, the score product of tile j + 1 waited for alone before the softmax of tile j
(the overlap, checked in the SASS: ptxas keeps the wait for ``P V`` after the exponentials),
the shared-memory budget and no spill in the loops.

GPU tier: the public function against the oracles of ``test_prefill`` (fresh random inputs, NaN
in every unused cache slot, permuted pages, wild table entries past each request's pages,
poisoned outputs), with a spy proving the Gluon kernel ran: lengths off the tile and the page,
empty requests, chunked prefill (queries fewer than keys), windows at tile edges, sinks, scales as
floats or device tensors, negative logit scales, HND / NHD, every cache form, split tables, pages
of 64 / 128 / 256, head dims 64 / 128 / 256, GQA groups 1 to 32; the persistent loop with many
tiles a program. (CUDA-graph replay through this kernel: ``test_prefill``'s graph test, whose
pages of 64 it serves on Hopper.)
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from triton.experimental.gluon import language as gl

import kvattn
from kvattn.formats import FP8_DTYPE
from kvattn.ops.prefill import configs as prefill_configs
from kvattn.ops.prefill import kernels_gluon_ws as prefill_ws_kernels
from kvattn.ops.prefill import plan_gluon_ws as prefill_ws
from kvattn.ops.prefill import staging

from ..sm90 import compile_sm90, skip_unless_gpu_verified
from .test_prefill import kernel_launches, prefill_case

ON_GPU = torch.cuda.is_available()
GPU_ONLY = pytest.mark.skipif(not ON_GPU, reason="the Gluon kernel runs on a Hopper GPU only")


# ---------------------------------------------------------------------------------------------
# host decisions (CPU)
# ---------------------------------------------------------------------------------------------
BASE_FACTS = dict(hopper=True, gluon_on=True, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                  out_dtype=torch.bfloat16, head_dim=128, page=64, skip=False, nvfp4_out=False)


@pytest.mark.parametrize("change,expected", [
    ({}, True),
    ({"q_dtype": torch.float16, "kv_dtype": torch.float16, "out_dtype": torch.float16}, True),
    ({"q_dtype": torch.float16, "kv_dtype": torch.float16}, True),  # bf16 output of an fp16 query
    ({"page": 128}, True), ({"page": 256}, True), ({"head_dim": 64}, True), ({"head_dim": 256}, True),
    ({"hopper": False}, False),  # sm_100 / sm_80: no wgmma
    ({"gluon_on": False}, False),  # KVATTN_GLUON=0
    ({"page": 8}, True), ({"page": 16}, True), ({"page": 32}, True),  # several whole pages a key tile
    ({"page": 4}, False), ({"page": 96}, False), ({"page": 24}, False),
    ({"page": 192}, False),  # 128-key tiles: the second tile of a page would run past it
    ({"page": 192, "head_dim": 256}, True),  # 64-key tiles: three a page
    # fp8 caches: converted to float16 operands by a converter partition; D256 with a 16-bit query
    # would need 256 KB of shared memory; NVFP4 caches (uint8 codes) stay on the Triton kernel.
    ({"kv_dtype": FP8_DTYPE}, True), ({"kv_dtype": FP8_DTYPE, "head_dim": 64}, True),
    ({"kv_dtype": FP8_DTYPE, "head_dim": 256}, False), ({"kv_dtype": FP8_DTYPE, "page": 16}, True),
    ({"q_dtype": torch.float16, "kv_dtype": FP8_DTYPE}, True),
    ({"q_dtype": FP8_DTYPE, "kv_dtype": FP8_DTYPE}, True), ({"q_dtype": FP8_DTYPE, "kv_dtype": FP8_DTYPE,
                                                             "head_dim": 256}, True),
    ({"q_dtype": FP8_DTYPE, "kv_dtype": torch.bfloat16}, False), ({"kv_dtype": torch.uint8}, False),
    ({"kv_dtype": torch.float16}, False),  # a cache of another 16-bit type
    ({"out_dtype": FP8_DTYPE}, False), ({"nvfp4_out": True}, False),
    ({"skip": True}, False), ({"head_dim": 96}, False),
], ids=lambda x: str(x) if not isinstance(x, dict) else "-".join(f"{k}={v}" for k, v in x.items()) or "base")
def test_eligible_launches(change, expected):
    """16-bit query and cache of one dtype, a 16-bit or fp8 query over an fp8 cache, 16-bit output,
    pages of 8 tokens or more that tile the key tiles, Hopper, no skip-softmax: the Gluon kernel;
    anything else stays on the Triton kernel."""
    assert prefill_ws.eligible(**dict(BASE_FACTS, **change)) is expected


def test_values_of_another_type_only_as_staged_float16_under_an_fp8_query():
    """V's pages may differ from K's only as float16 pages staged for an fp8 query over an fp8
    cache, which take their own tiles (``"fp8qk-staged"``)."""
    f16, bf16 = torch.float16, torch.bfloat16
    assert prefill_ws.values_fit(FP8_DTYPE, FP8_DTYPE, f16) and prefill_ws.values_fit(bf16, bf16, bf16)
    assert not prefill_ws.values_fit(bf16, FP8_DTYPE, f16) and not prefill_ws.values_fit(FP8_DTYPE, FP8_DTYPE, bf16)
    assert prefill_ws.kind_of(FP8_DTYPE, FP8_DTYPE, f16) == "fp8qk-staged"
    assert prefill_ws.kind_of(FP8_DTYPE, FP8_DTYPE, FP8_DTYPE) == prefill_ws.kind_of(FP8_DTYPE, FP8_DTYPE) == "fp8qk"
    assert prefill_ws.config_for(FP8_DTYPE, FP8_DTYPE, 128, f16) == prefill_configs.ws_config(128, "fp8qk-staged")
    assert prefill_ws.config_for(FP8_DTYPE, FP8_DTYPE, 128) == prefill_configs.ws_config(128, "fp8qk")


def test_a_config_for_every_head_dim_within_shared_memory():
    """Every head_dim the kernel takes has tiles, and they fit the 227 KB an H100 program gets
    (query 2 x [64, D] + K and V rings, 16-bit)."""
    for d in prefill_ws.HEAD_DIMS:
        cfg = prefill_configs.ws_config(d)
        assert cfg is not None and cfg.block_n % 64 == 0 and cfg.stages >= 2, d
        slots = prefill_ws_kernels._q_slots(gl.bfloat16, False, False, d, cfg.block_n, cfg.stages)
        assert 2 * (2 * slots * 64 * d + 2 * cfg.stages * cfg.block_n * d) <= 227 * 1024, d
    # the second query slot where it fits: D64 and D128, not D256 (its rings take 128 KB)
    assert [prefill_ws_kernels._q_slots(gl.bfloat16, False, False, d, prefill_configs.ws_config(d).block_n,
                                prefill_configs.ws_config(d).stages) for d in (64, 128, 256)] == [2, 2, 1]
    assert prefill_configs.ws_config(96) is None
    # fp8 caches add the converter's rings of bytes (K's only for a 16-bit query); an fp8 query's q
    # and K are bytes, its V float16.
    for (kind, d), cfg in prefill_configs._SM90_WS_FP8.items():
        qk = 1 if kind == "fp8qk" else 2
        slots = prefill_ws_kernels._q_slots(gl.float8e4nv if kind == "fp8qk" else gl.bfloat16, True, False, d, cfg.block_n,
                                    cfg.stages)
        byte_rings = (1 if kind == "fp8qk" else 2) * cfg.stages * cfg.block_n * d
        total = qk * (2 * slots * 64 * d + cfg.stages * cfg.block_n * d) + 2 * cfg.stages * cfg.block_n * d + byte_rings
        assert total <= 227 * 1024, (kind, d)
    assert prefill_configs.ws_config(256, "fp8") is None and prefill_configs.ws_config(128, "nvfp4") is None
    # an fp8 query's V staged as float16: q and K bytes, V float16, no byte ring
    for d in prefill_ws.HEAD_DIMS:
        cfg = prefill_configs.ws_config(d, "fp8qk-staged")
        slots = prefill_ws_kernels._q_slots(gl.float8e4nv, True, True, d, cfg.block_n, cfg.stages)
        assert 2 * slots * 64 * d + cfg.stages * cfg.block_n * d * (1 + 2) <= 227 * 1024, d


def test_tma_views_of_each_page_form():
    """The 2-D ``[rows, cols]`` view TMA reads for each cache form: HND rows are a head's slots,
    pages ``rows_per_page`` rows apart; NHD rows hold every head side by side. Misaligned or
    non-dense pages get none."""
    P, S, H, D = 6, 64, 2, 128
    hnd = torch.zeros(P, 2, H, S, D, dtype=torch.bfloat16)  # stacked HND; the launcher's NHD views:
    k, v = hnd[:, 0].transpose(1, 2), hnd[:, 1].transpose(1, 2)
    for t in (k, v):
        assert prefill_ws.tma_view(t, S) == (2 * H * S, (P - 1) * 2 * H * S + H * S, S, 0, D, D)
    nhd = torch.zeros(P, 1, S, H, D, dtype=torch.float16)[:, 0]  # shared NHD
    assert prefill_ws.tma_view(nhd, S) == (S, (P - 1) * S + S, 0, D, H * D, H * D)
    nhd2 = torch.zeros(P, 2, S, H, D, dtype=torch.float16)[:, 1]  # stacked NHD, V
    assert prefill_ws.tma_view(nhd2, S) == (2 * S, (P - 1) * 2 * S + S, 0, D, H * D, H * D)
    flat = torch.zeros(P * S * H * D + 8, dtype=torch.bfloat16)
    assert prefill_ws.tma_view(flat[1:1 + P * S * H * D].view(P, S, H, D), S) is None  # 2 bytes off
    assert prefill_ws.tma_view(torch.zeros(P, S, H, D + 8)[..., :D], S) is None  # rows of D + 8
    assert prefill_ws.tma_view(k, 128) is None  # not this page size


def _ws_facts(q, k, *, window_left=-1, has_sinks=False):
    """The host facts ``plan_gluon_ws.launch`` reads of a call (``plan.PrefillFacts``' fields)."""
    import types

    return types.SimpleNamespace(q_shape=q.shape, q_stride=q.stride(), out_stride=q.stride(), batch=2,
                                 window_left=window_left, has_sinks=has_sinks, has_logit=False, has_out_scale=False,
                                 causal=True)


def test_launch_names_every_kernel_parameter():
    """The launch passes every kernel parameter by its name, once (per call from the call's values,
    fixed, or constexpr), and the options apart (``fast_launch.Launch`` refuses it otherwise); K and
    V reach the kernel as descriptors of the views ``tma_view`` gives, in boxes of a page's rows."""
    q = torch.zeros(70, 8, 128, dtype=torch.bfloat16)
    k = prefill_ws.pages_of(torch.zeros(6, 64, 2, 128, dtype=torch.bfloat16))
    view = prefill_ws.tma_view(k, 64)
    launch = prefill_ws.launch(prefill_configs.ws_config(128), _ws_facts(q, k), k, k, view, view,
                               kt_stride=(3, 1), vt_stride=(3, 1), max_q_len=64, sm_count=132, capacity=192)
    assert launch.kernel is prefill_ws_kernels.prefill_ws_kernel
    names = [*launch.per_call, *launch.fixed, *launch.constexprs]
    assert sorted(names) == sorted(prefill_ws_kernels.prefill_ws_kernel.arg_names)
    assert launch.options == dict(num_warps=4, maxnreg=prefill_ws.MAXNREG)
    assert launch.grid == (min(8 * 2 * 1, 132),) and launch.fixed["capacity"] == 192
    assert [(d.tensor, d.shape, d.strides) for d in launch.descriptors] == [
        (name, (view[1], view[4]), (view[5], 1)) for name in ("k", "v")]
    assert all(d.block_shape[0] == 64 and d.layout is not None for d in launch.descriptors)


def test_fp8_caches_take_two_buffers_a_ring():
    """Converted rings of more than 2 buffers gave NaN rows on the H100 (D64 at 4, D128 64-key tiles
    at 3): every fp8 table entry has 2, and a launch with another count is refused."""
    assert all(cfg.stages == 2 for cfg in prefill_configs._SM90_WS_FP8.values())
    q = torch.zeros(70, 8, 128, dtype=torch.bfloat16)
    k = prefill_ws.pages_of(torch.zeros(6, 64, 2, 128, dtype=FP8_DTYPE))
    view = prefill_ws.tma_view(k, 64)
    with pytest.raises(ValueError, match="2 buffers"):
        prefill_ws.launch(prefill_configs.WSConfig(128, 3, False), _ws_facts(q, k), k, k, view, view,
                          kt_stride=(3, 1), vt_stride=(3, 1), max_q_len=64, sm_count=132, capacity=192)


def test_plan_is_none_off_the_gpu():
    kv = prefill_ws.pages_of(torch.zeros(3, 64, 2, 128, dtype=torch.bfloat16))
    assert prefill_ws.plan(device=torch.device("cpu"), gluon_on=True, q_dtype=torch.bfloat16, head_dim=128, k=kv,
                           v=kv, out_dtype=torch.bfloat16, skip=False, nvfp4_out=False, interpreter=False) is None


# ---------------------------------------------------------------------------------------------
# sm_90a compile (CPU; run under each Triton version)
# ---------------------------------------------------------------------------------------------
ROW_SMEM = ("NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False, "
            "fp4_padded=False, cga_layout=[])")
WS_PTRS = {"k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32", "cum_q_ptr": "*i32",
           "sinks_ptr": "*fp32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32"}
WS_BASE = dict(HEAD_DIM=128, PAGE_SIZE=64, GROUP=4, BLOCK_N=128, STAGES=2, HAS_WINDOW=False, HAS_SINKS=False,
               LOGIT_PTR=False, OUT_PTR=False, PINGPONG=False, KV_FP8=False, V_STAGED=False, CAUSAL=True)


def compile_ws(dtype: str = "bf16", kv: str | None = None, v: str | None = None, **constexprs) -> dict:
    """``dtype``: the query's; ``kv``: the cache's (the query's by default; ``"fp8e4nv"`` sets
    KV_FP8); ``v``: V's pages where they differ (``"fp16"`` staged under an fp8 query sets
    V_STAGED); the output bf16 for an fp8 query, else the query's type."""
    kv = kv or dtype
    v = v or kv
    cfg = dict(WS_BASE, KV_FP8=kv == "fp8e4nv", V_STAGED=v != kv, **constexprs)
    sub = min(cfg["PAGE_SIZE"], cfg["BLOCK_N"])

    def desc(elem):
        esize = 1 if elem == "fp8e4nv" else 2
        smem = ROW_SMEM if esize == 2 else ROW_SMEM.replace("element_bitwidth=16", "element_bitwidth=8").replace(
            "swizzle_byte_width=128", f"swizzle_byte_width={min(128, cfg['HEAD_DIM'])}")
        return f"tensordesc<{elem}[{sub}, {min(cfg['HEAD_DIM'], 128 // esize)}],{smem}>"

    out = "bf16" if dtype == "fp8e4nv" else dtype
    return compile_sm90("kvattn.ops.prefill.kernels_gluon_ws.prefill_ws_kernel", cfg, ptrs=dict(WS_PTRS, q_ptr=f"*{dtype}",
                        out_ptr=f"*{out}"), floats=("logit_factor", "out_factor"), warps=4, gluon=True,
                        descs={"k_desc": desc(kv), "v_desc": desc(v)}, sass=True,
                        options={"maxnreg": prefill_ws.MAXNREG})


def loop_overlaps(sass: str) -> int:
    """How many times the SASS waits for one wgmma group (``DEPBAR.LE gsb0, 0x1``: the score
    product retired, ``P V`` still running) and then runs at least 32 exponentials before waiting
    for the last group: the consumer loops whose softmax overlaps ``P V``."""
    events = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([01])|MUFU\.EX2", sass)
    count, run = 0, None
    for e in events:
        if e == "1":
            run = 0
        elif e == "0":
            if run is not None and run >= 32:
                count += 1
            run = None
        elif run is not None:
            run += 1
    return count


def bounds_fixed_before_the_loop(ttgir: str) -> list[str]:
    """Upper bounds of nested ``scf.for`` loops defined before the loop that encloses them. The
    tile loop's key loops must take a bound computed in (or carried through) the tile loop:
    Triton's loop-aware CSE (3.6, 3.7) replaces a carried value used only as an inner bound by its
    first iteration's value, so every later tile would run the first tile's key count (and the
    producer and consumers would disagree: a hang)."""
    lines = ttgir.splitlines()
    fors = []
    for i, line in enumerate(lines):
        m = re.search(r"= scf\.for %\S+ = %\S+ to (%[\w.]+) step", line)
        if m:
            fors.append((i, len(line) - len(line.lstrip()), m.group(1)))
    def end_of(j, j_indent):  # the line closing the loop's region
        return next((k for k in range(j + 1, len(lines))
                     if lines[k].strip().startswith("}") and len(lines[k]) - len(lines[k].lstrip()) == j_indent),
                    len(lines))

    bad = []
    for i, indent, bound in fors:
        enclosing = [j for j, j_indent, _ in fors if j < i < end_of(j, j_indent)]
        if not enclosing:
            continue
        defs = [k for k in range(i) if re.search(rf"{re.escape(bound)}(:\d+)? = ", lines[k])]
        if defs and max(defs) < max(enclosing):
            bad.append(bound)
    return bad


def test_bound_check_catches_a_bound_from_before_the_loop():
    ok = """    %n = arith.maxsi %a, %b : i32
    %r:2 = scf.for %t = %c0 to %num step %c1 iter_args(%x = %n) -> (i32) {
      %m = arith.addi %x, %c1 : i32
      %s = scf.for %j = %c0 to %m step %c1 iter_args(%y = %c0) -> (i32) {"""
    assert bounds_fixed_before_the_loop(ok) == []
    assert bounds_fixed_before_the_loop(ok.replace("to %m step", "to %n step")) == ["%n"]
    assert bounds_fixed_before_the_loop(ok.replace("to %m step", "to %x step")) == []  # carried
    # A loop before it in the same region (closed) does not enclose it.
    sibling = """    %n = arith.maxsi %a, %b : i32
    %r:2 = scf.for %t = %c0 to %num step %c1 iter_args(%x = %n) -> (i32) {
      %q = scf.for %u = %c0 to %n step %c1 iter_args(%z = %c0) -> (i32) {
      }
      %k = arith.addi %x, %c1 : i32
      %s = scf.for %j = %c0 to %k step %c1 iter_args(%y = %c0) -> (i32) {"""
    assert bounds_fixed_before_the_loop(sibling) == ["%n"]  # (the scan's own bound, from before the tile loop)
    assert bounds_fixed_before_the_loop(sibling.replace("to %n step %c1 iter_args(%z", "to %x step %c1 iter_args(%z")) == []


@pytest.mark.codegen
@pytest.mark.parametrize("kw,n_by_shape", [
    ({}, {"m64n128k16": 2 * (8 + 8 + 8 + 8)}),
    ({"HEAD_DIM": 64, "STAGES": 4}, {"m64n128k16": 2 * (4 + 4), "m64n64k16": 2 * (8 + 8)}),
    ({"HEAD_DIM": 256, "BLOCK_N": 64}, {"m64n64k16": 2 * (16 + 16), "m64n256k16": 2 * (4 + 4)}),
    ({"PINGPONG": True}, {"m64n128k16": 64}),
    ({"PAGE_SIZE": 128}, {"m64n128k16": 64}),
    ({"PAGE_SIZE": 256, "HAS_WINDOW": True, "HAS_SINKS": True, "LOGIT_PTR": True, "OUT_PTR": True},
     {"m64n128k16": 64}),
    ({"dtype": "fp16"}, {"m64n128k16": 64}),
    ({"PAGE_SIZE": 16}, {"m64n128k16": 64}),
    ({"PAGE_SIZE": 8, "HAS_WINDOW": True}, {"m64n128k16": 64}),
    ({"CAUSAL": False}, {"m64n128k16": 64}),
], ids=["D128-p64", "D64-p64", "D256-p64", "D128-pingpong", "D128-p128",
        "D128-p256-window-sinks-device-scales", "fp16", "D128-p16", "D128-p8-window", "D128-p64-noncausal"])
def test_kernel_compiles_to_its_schedule(kw, n_by_shape):
    kw = dict(kw)
    dtype = kw.pop("dtype", "bf16")
    got = compile_ws(dtype, **kw)
    ptx, sass = got["ptx"], got.get("sass", "")
    cfg = dict(WS_BASE, **kw)
    ptx_type = {"bf16": "bf16", "fp16": "f16"}[dtype]
    # Two consumer warpgroups: each one S product before its loop, S and P.V in it, a last P.V.
    for shape, n in n_by_shape.items():
        assert len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.{shape}\.f32\.{ptx_type}", ptx)) == n, shape
    assert "wgmma.wait_group.sync.aligned 1;" in ptx  # S of tile j retired alone
    assert bounds_fixed_before_the_loop(got["ttgir"]) == []
    # Registers handed from the producer's warpgroup to the consumers'.
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    # TMA, all in the one producer: (BLOCK_N / box rows) x (D / 64) boxes a key tile, for K and V.
    sub = min(cfg["PAGE_SIZE"], cfg["BLOCK_N"])
    copies = 2 * (cfg["BLOCK_N"] // sub) * (cfg["HEAD_DIM"] // 64)
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) == copies
    slots = query_slots(dtype, cfg)
    smem = 2 * (2 * slots * 64 * cfg["HEAD_DIM"] + 2 * cfg["STAGES"] * cfg["BLOCK_N"] * cfg["HEAD_DIM"])
    assert smem <= got["shared"] <= 227 * 1024
    assert_query_copies(ptx, cfg, 2, slots)
    skip_unless_gpu_verified("ptxas 12.9 of Triton 3.9 spills 1-2 values in the key loops of D128 and D256, "
                             "32-40 bytes of stack")
    if "reg" in got:
        assert got["reg"] <= prefill_ws.MAXNREG
        # A few scalars pass through local memory at entry and at tile boundaries (the partitions'
        # arguments; 24 bytes in the full-featured case), never between a key tile's products.
        assert got["stack"] <= 32
        assert spills_in_key_loops(sass) == 0
        assert loop_overlaps(sass) == 2, "the softmax no longer runs under P.V in both consumer loops"


def query_slots(q: str, cfg: dict, kv: str | None = None, v: str | None = None) -> int:
    """The kernel's query slots a consumer warpgroup (``gluon_ws._q_slots``) for a compile's types."""
    types = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp8e4nv": gl.float8e4nv}
    kv = kv or q
    return prefill_ws_kernels._q_slots(types[q], kv == "fp8e4nv", (v or kv) != kv, cfg["HEAD_DIM"], cfg["BLOCK_N"],
                               cfg["STAGES"])


def assert_query_copies(ptx: str, cfg: dict, q_bytes: int, slots: int) -> None:
    """With two query slots, each consumer warpgroup copies its 64 rows of a tile by ``cp.async``
    (16 bytes a thread an instruction) from three places: before the tile loop, under a tile's
    first score product, and at the end of a tile without one; with one slot, none (the rows go
    through registers)."""
    per_site = 64 * cfg["HEAD_DIM"] * q_bytes // 16 // 128
    assert len(re.findall(r"cp\.async\.c[ag]\.shared\.global", ptx)) == (3 * 2 * per_site if slots == 2 else 0)


def assert_products(ptx: str, products: dict) -> None:
    """The wgmma instructions of each shape (``products``: shape and types -> count), and no other."""
    for shape, n in products.items():
        assert len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.{re.escape(shape)}", ptx)) == n, shape
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == sum(products.values())


def assert_fp8_schedule_fits(got: dict, sass: str) -> None:
    """Loop bounds carried through the tile loop, within shared memory, and (where ptxas is the
    one verified on a GPU) no spill in the key loops and the softmax under P.V in both consumers."""
    assert bounds_fixed_before_the_loop(got["ttgir"]) == []
    assert got["shared"] <= 227 * 1024
    skip_unless_gpu_verified("ptxas 12.9 of Triton 3.9 spills 1-2 values in the key loops of D128 and D256, "
                             "32-40 bytes of stack")
    if "reg" in got:
        assert got["stack"] <= 32
        assert spills_in_key_loops(sass) == 0
        assert loop_overlaps(sass) == 2, "the softmax no longer runs under P.V in both consumer loops"


@pytest.mark.codegen
@pytest.mark.parametrize("q,kw,products", [
    ("bf16", {}, {"m64n128k16.f32.f16.f16": 64}),
    ("fp16", {"HEAD_DIM": 64}, {"m64n128k16.f32.f16.f16": 16, "m64n64k16.f32.f16.f16": 32}),
    ("bf16", {"PAGE_SIZE": 16, "HAS_WINDOW": True, "HAS_SINKS": True, "LOGIT_PTR": True}, {"m64n128k16.f32.f16.f16": 64}),
    ("fp8e4nv", {}, {"m64n128k32.f32.e4m3.e4m3": 16, "m64n128k16.f32.f16.f16": 32}),
    ("fp8e4nv", {"HEAD_DIM": 256, "BLOCK_N": 64}, {"m64n64k32.f32.e4m3.e4m3": 32, "m64n256k16.f32.f16.f16": 16}),
], ids=["bf16q-D128", "fp16q-D64", "bf16q-D128-p16-window-sinks-device-scale", "fp8q-D128", "fp8q-D256"])
def test_fp8_cache_kernel_compiles_to_its_schedule(q, kw, products):
    """fp8 caches: a fourth partition (two converter warps beside the producer warp, 40 registers;
    the consumers 232) turns the copied bytes into float16 operands (one e4m3-pair instruction a
    pair); the scores of an fp8 query stay on e4m3 products over the copied K; the same overlap of
    the softmax with P.V, no spill in the key loops, within shared memory."""
    got = compile_ws(q, kv="fp8e4nv", **kw)
    ptx, sass = got["ptx"], got.get("sass", "")
    cfg = dict(WS_BASE, **kw)
    assert_products(ptx, products)
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;", ptx)
    assert "cvt.rn.f16x2.e4m3x2" in ptx
    assert "fence.proxy.async.shared::cta" in ptx  # the converter's stores made visible to wgmma
    sub = min(cfg["PAGE_SIZE"], cfg["BLOCK_N"])
    copies = 2 * (cfg["BLOCK_N"] // sub) * max(1, cfg["HEAD_DIM"] // 128)  # 128-byte boxes of bytes
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) == copies
    assert_query_copies(ptx, cfg, 1, query_slots(q, cfg, kv="fp8e4nv"))
    assert (query_slots(q, cfg, kv="fp8e4nv") == 2) == (q == "fp8e4nv")  # a 16-bit query is converted
    assert_fp8_schedule_fits(got, sass)


@pytest.mark.codegen
@pytest.mark.parametrize("kw,products", [
    ({}, {"m64n128k32.f32.e4m3.e4m3": 16, "m64n128k16.f32.f16.f16": 32}),
    ({"STAGES": 3}, {"m64n128k32.f32.e4m3.e4m3": 16, "m64n128k16.f32.f16.f16": 32}),
    ({"HEAD_DIM": 256, "BLOCK_N": 64}, {"m64n64k32.f32.e4m3.e4m3": 32, "m64n256k16.f32.f16.f16": 16}),
    ({"HEAD_DIM": 64, "PAGE_SIZE": 16, "HAS_WINDOW": True, "STAGES": 3},
     {"m64n128k32.f32.e4m3.e4m3": 8, "m64n64k16.f32.f16.f16": 32}),
], ids=["D128", "D128-3-stages", "D256", "D64-p16-window-3-stages"])
def test_staged_values_kernel_compiles_to_its_schedule(kw, products):
    """An fp8 query over an fp8 cache whose V pages are staged as float16 (``staging``): scores on
    e4m3 products over the copied K, P.V float16 over the staged V, no converter partition (the
    three partitions and registers of the 16-bit kernel, no e4m3 conversion), V boxes of 64
    16-bit columns."""
    got = compile_ws("fp8e4nv", kv="fp8e4nv", v="fp16", **kw)
    ptx, sass = got["ptx"], got.get("sass", "")
    cfg = dict(WS_BASE, **kw)
    assert_products(ptx, products)
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    assert "cvt.rn.f16x2.e4m3x2" not in ptx
    sub = min(cfg["PAGE_SIZE"], cfg["BLOCK_N"])
    copies = (cfg["BLOCK_N"] // sub) * (max(1, cfg["HEAD_DIM"] // 128) + cfg["HEAD_DIM"] // 64)
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) == copies
    assert_query_copies(ptx, cfg, 1, query_slots("fp8e4nv", cfg, kv="fp8e4nv", v="fp16"))
    assert_fp8_schedule_fits(got, sass)


def spills_in_key_loops(sass: str) -> int:
    """Local-memory loads / stores between a consumer's wait for S (``DEPBAR.LE gsb0, 0x1``) and
    its wait for P.V (``DEPBAR.LE gsb0, 0x0``): the softmax under the products."""
    count, inside = 0, False
    for line in sass.splitlines():
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            inside = True
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line:
            inside = False
        elif inside and re.search(r"\b(LDL|STL)\b", line):
            count += 1
    return count


def test_overlap_check_catches_a_hoisted_wait():
    """``loop_overlaps`` counts what it claims: a wait for both groups before the exponentials
    (what ptxas does when the softmax and the wait share a basic block) is not an overlap."""
    wait1, wait0, exp = "WARPGROUP.DEPBAR.LE gsb0, 0x1 ;", "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", "MUFU.EX2 R1, R1 ;"
    assert loop_overlaps(wait1 + exp * 40 + wait0) == 1
    assert loop_overlaps(wait1 + wait0 + exp * 40) == 0
    assert loop_overlaps(wait1 + exp * 8 + wait0 + exp * 32) == 0


# ---------------------------------------------------------------------------------------------
# GPU: against the oracles
# ---------------------------------------------------------------------------------------------
def ws_param(id, **kw):
    return pytest.param(kw, id=id, marks=GPU_ONLY)


STAGED_WS = 64 << 20  # bytes: room for every staged case's pages (the default 64 KB stages none)
# Lq = 1, chunked (Lq < L, off the tile and page), an empty request, a request without queries.
LENS, LQ = [1, 300, 0, 777, 1029, 64], [1, 300, 0, 129, 700, 0]

WS_CASES = [
    *[ws_param(f"bf16-{layout}-{form}-p{page}", lens=LENS, lq=LQ, layout=layout, form=form, page=page, d=128,
               qdt=torch.bfloat16, seed=page)
      for layout in ("HND", "NHD") for form, page in (("stacked", 64), ("tuple", 128), ("shared", 256))],
    *[ws_param(f"bf16-D{d}-G{g}-{layout}", lens=[1, 77, 513, 700], lq=[1, 77, 300, 700], d=d, group=g,
               hkv=max(1, 8 // g), layout=layout, page=64, qdt=torch.bfloat16, seed=d + g)
      for d in (64, 128, 256) for g in (1, 4, 8) for layout in ("HND", "NHD")],
    ws_param("bf16-G32-Hkv1", lens=[1200, 100], lq=[1200, 5], hkv=1, group=32, d=128, page=64, qdt=torch.bfloat16),
    ws_param("fp16-D128-p64", lens=LENS, lq=LQ, d=128, page=64, qdt=torch.float16),
    ws_param("fp16-q-bf16-out", lens=LENS, lq=LQ, d=128, page=64, qdt=torch.float16, out_kind=torch.bfloat16),
    *[ws_param(f"bf16-window{w}", lens=[1, 16, 17, 64, 65, 200, 1100], lq=[1, 16, 10, 64, 1, 200, 900], window=w,
               page=64, d=128, qdt=torch.bfloat16, sinks=w % 2 == 1, seed=w)
      for w in (0, 1, 63, 64, 127, 128, 129, 255, 1000, 5000)],
    ws_param("bf16-sinks-device-scales-uint32-int64-cum", lens=LENS, lq=LQ, page=64, d=128, qdt=torch.bfloat16,
             sinks=True, tensor_scales=True, uint32=True, cum_dtype=torch.int64),
    ws_param("bf16-negative-bmm1", lens=LENS, lq=LQ, page=64, d=128, qdt=torch.bfloat16, bmm1=-0.15, sinks=True),
    ws_param("bf16-negative-device-bmm1", lens=LENS, lq=LQ, page=64, d=128, qdt=torch.bfloat16, bmm1=-0.15,
             tensor_scales=True),
    ws_param("bf16-zero-bmm1", lens=LENS, lq=LQ, page=64, d=128, qdt=torch.bfloat16, bmm1=0.0),
    *[ws_param(f"bf16-split-tables-{form}-{layout}-p{page}", lens=LENS, lq=LQ, split=True, form=form, layout=layout,
               page=page, d=128, qdt=torch.bfloat16, window=500, sinks=True)
      for form in ("stacked", "tuple") for layout in ("NHD", "HND") for page in (64, 128)],
    # pages smaller than a key tile: a box a page, ids read one a box, the tile past the last page
    *[ws_param(f"bf16-{layout}-p{page}", lens=LENS, lq=LQ, layout=layout, page=page, d=128, qdt=torch.bfloat16,
               seed=page + 1) for layout in ("HND", "NHD") for page in (8, 16, 32)],
    ws_param("bf16-split-tables-p16-window-sinks", lens=LENS, lq=LQ, split=True, form="tuple", page=16, d=128,
             qdt=torch.bfloat16, window=70, sinks=True),
    ws_param("bf16-D64-p16", lens=LENS, lq=LQ, page=16, d=64, qdt=torch.bfloat16),
    ws_param("bf16-D256-p16", lens=LENS, lq=LQ, page=16, d=256, qdt=torch.bfloat16),
    ws_param("bf16-max_q_len-above-lengths", lens=[300, 30], lq=[50, 30], max_q_len=250, page=64, d=128,
             qdt=torch.bfloat16),
    ws_param("bf16-Hq32-Hkv8-long", lens=[2100, 700, 64], lq=[1100, 700, 3], hkv=8, group=4, d=128, page=64,
             qdt=torch.bfloat16),
    # fp8 caches (the converter partition): 16-bit queries over fp8, fp8 queries and caches
    *[ws_param(f"bf16q-fp8kv-{layout}-{form}-p{page}", lens=LENS, lq=LQ, layout=layout, form=form, page=page, d=128,
               qdt=torch.bfloat16, fmt="fp8", seed=page + 7)
      for layout in ("HND", "NHD") for form, page in (("stacked", 64), ("tuple", 128), ("shared", 16))],
    *[ws_param(f"{name}q-fp8kv-D{d}-G{g}", lens=[1, 77, 513, 700], lq=[1, 77, 300, 700], d=d, group=g,
               hkv=max(1, 8 // g), page=64, qdt=qdt, fmt="fp8", seed=d + g + 3)
      for name, qdt in (("bf16", torch.bfloat16), ("fp16", torch.float16)) for d in (64, 128) for g in (1, 8)],
    *[ws_param(f"bf16q-fp8kv-window{w}", lens=[1, 16, 17, 64, 65, 200, 1100], lq=[1, 16, 10, 64, 1, 200, 900],
               window=w, page=64, d=128, qdt=torch.bfloat16, fmt="fp8", sinks=w % 2 == 1, seed=w)
      for w in (0, 127, 128, 1000)],
    ws_param("bf16q-fp8kv-split-tables-sinks-device-scales-negative", lens=LENS, lq=LQ, split=True, form="tuple",
             page=32, d=128, qdt=torch.bfloat16, fmt="fp8", window=500, sinks=True, tensor_scales=True, bmm1=-0.1),
    *[ws_param(f"fp8q-fp8kv-D{d}-{layout}-p{page}", lens=LENS, lq=LQ, d=d, page=page, layout=layout,
               qdt=FP8_DTYPE, seed=d + page)
      for d in (64, 128, 256) for layout, page in (("HND", 64), ("NHD", 16))],
    ws_param("fp8q-fp8kv-window-sinks-device-scales-negative", lens=[1, 16, 17, 64, 65, 200, 1100],
             lq=[1, 16, 10, 64, 1, 200, 900], window=127, sinks=True, tensor_scales=True, bmm1=-0.12, page=64,
             d=128, qdt=FP8_DTYPE),
    ws_param("fp8q-fp8kv-fp16-out", lens=LENS, lq=LQ, page=64, d=128, qdt=FP8_DTYPE, out_kind=torch.float16),
    # quantised caches whose pages fit the workspace: staged once a call (ops.prefill.staging), then
    # the 16-bit kernel (an fp8 query: its K as copied, V staged as float16)
    *[ws_param(f"staged-{name}q-{fmt}kv-D{d}-{layout}-p{page}", lens=LENS, lq=LQ, d=d, page=page, layout=layout,
               qdt=qdt, fmt=fmt, ws_bytes=STAGED_WS, seed=d + page + 11)
      for name, qdt in (("bf16", torch.bfloat16), ("fp16", torch.float16)) for fmt in ("fp8", "nvfp4")
      for d, layout, page in ((128, "HND", 64), (64, "NHD", 16), (256, "HND", 128))
      if name == "bf16" or d == 128],
    *[ws_param(f"staged-fp8q-fp8kv-D{d}-{layout}-p{page}", lens=LENS, lq=LQ, d=d, page=page, layout=layout,
               qdt=FP8_DTYPE, ws_bytes=STAGED_WS, seed=d + page + 13)
      for d, layout, page in ((128, "HND", 64), (64, "NHD", 16), (256, "NHD", 64))],
    *[ws_param(f"staged-bf16q-fp8kv-window{w}-chunked", lens=[1, 16, 17, 64, 65, 200, 1100, 2000],
               lq=[1, 16, 10, 64, 1, 200, 900, 70], window=w, page=64, d=128, qdt=torch.bfloat16, fmt="fp8",
               sinks=w % 2 == 1, ws_bytes=STAGED_WS, seed=w)
      for w in (0, 127, 128, 1000)],
    ws_param("staged-bf16q-nvfp4kv-split-tables-sinks-device-scales-negative", lens=LENS, lq=LQ, split=True,
             form="tuple", page=32, d=128, qdt=torch.bfloat16, fmt="nvfp4", window=500, sinks=True,
             tensor_scales=True, bmm1=-0.1, ws_bytes=STAGED_WS),
    ws_param("staged-fp8q-fp8kv-split-tables-window-sinks", lens=LENS, lq=LQ, split=True, form="tuple", page=64,
             d=128, qdt=FP8_DTYPE, window=127, sinks=True, tensor_scales=True, ws_bytes=STAGED_WS),
    # 16-bit caches in pages under 64 tokens: staged in pages of 64
    *[ws_param(f"staged-{name}-D{d}-{layout}-p{page}", lens=LENS, lq=LQ, d=d, page=page, layout=layout, qdt=qdt,
               ws_bytes=STAGED_WS, seed=d + page + 17)
      for name, qdt, d, layout, page in (("bf16", torch.bfloat16, 128, "HND", 16), ("bf16", torch.bfloat16, 64, "NHD", 8),
                                         ("fp16", torch.float16, 256, "HND", 32), ("bf16", torch.bfloat16, 128, "NHD", 32))],
    # causal=False (FlashInfer 0.7.2.post1): every row over all its request's keys
    *[ws_param(f"noncausal-bf16-D{d}-{layout}-p{page}", lens=LENS, lq=LQ, d=d, page=page, layout=layout,
               qdt=torch.bfloat16, causal=False, seed=d + page + 19)
      for d, layout, page in ((64, "NHD", 64), (128, "HND", 64), (256, "HND", 128), (128, "NHD", 16))],
    ws_param("noncausal-bf16q-fp8kv-sinks", lens=LENS, lq=LQ, page=64, d=128, qdt=torch.bfloat16, fmt="fp8",
             sinks=True, causal=False),
    ws_param("noncausal-fp8q-fp8kv-device-scales", lens=LENS, lq=LQ, page=64, d=128, qdt=FP8_DTYPE,
             tensor_scales=True, causal=False),
    ws_param("noncausal-staged-bf16q-nvfp4kv", lens=LENS, lq=LQ, page=64, d=128, qdt=torch.bfloat16, fmt="nvfp4",
             causal=False, ws_bytes=STAGED_WS),
    ws_param("staged-bf16-p16-split-tables-window-sinks-chunked", lens=[1, 16, 17, 64, 65, 200, 1100, 2000],
             lq=[1, 16, 10, 64, 1, 200, 900, 70], split=True, form="tuple", page=16, d=128, qdt=torch.bfloat16,
             window=127, sinks=True, tensor_scales=True, bmm1=-0.1, ws_bytes=STAGED_WS),
]


def stage_always(monkeypatch):
    """Stage fp8 pages whatever the query rows (the table stages only calls with many)."""
    for kind in prefill_configs.STAGE_MIN_ROWS:
        monkeypatch.setitem(prefill_configs.STAGE_MIN_ROWS, kind, 0)


@pytest.mark.parametrize("kw", WS_CASES)
def test_matches_oracles(kw, triton_backend, monkeypatch):
    launches = kernel_launches(monkeypatch, prefill_ws, "prefill_ws_kernel")
    stagings = kernel_launches(monkeypatch, staging, "stage_pages_kernel")
    if "ws_bytes" in kw:  # (staged whatever the rows: these cases are small)
        stage_always(monkeypatch)
    prefill_case(torch.device("cuda"), monkeypatch, **kw)
    assert len(launches) == 1, "the Gluon kernel did not take the launch"
    assert len(stagings) == ("ws_bytes" in kw), "staged where the pages fit the workspace, else not"


@pytest.mark.parametrize("sms,variant,qdt,fmt", [
    (1, None, torch.bfloat16, None), (3, None, torch.bfloat16, None),
    (7, prefill_configs.WSConfig(128, 3, False), torch.bfloat16, None),
    (5, prefill_configs.WSConfig(64, 4, False), torch.bfloat16, None),
    (2, prefill_configs.WSConfig(128, 2, True), torch.bfloat16, None),
    (1, None, torch.bfloat16, "fp8"), (3, None, FP8_DTYPE, None),
    (5, prefill_configs.WSConfig(64, 2, False), torch.bfloat16, "fp8"),
], ids=["1-program", "3-programs", "7-programs-3-stages", "5-programs-64-key-tiles-4-stages", "2-programs-pingpong",
        "1-program-fp8-cache", "3-programs-fp8-query", "5-programs-fp8-cache-64-key-tiles"])
@GPU_ONLY
def test_persistent_programs_walk_many_tiles(sms, variant, qdt, fmt, triton_backend, monkeypatch):
    """A grid of a few programs, each taking dozens of tiles in turn: the rings' buffers and phases
    and the warpgroups' turns carry over from tile to tile (and over tiles without rows); other
    ring depths and tiles too; the converter's rings of an fp8 cache likewise."""
    monkeypatch.setattr(kvattn.runtime.device, "sm_count", lambda device: sms)
    if variant is not None:
        monkeypatch.setitem(prefill_configs._SM90_WS, 128, variant)
        for kind in ("fp8", "fp8qk"):
            monkeypatch.setitem(prefill_configs._SM90_WS_FP8, (kind, 128), variant)
    launches = kernel_launches(monkeypatch, prefill_ws, "prefill_ws_kernel")
    prefill_case(torch.device("cuda"), monkeypatch, lens=[1, 300, 0, 777, 1029, 64, 500], lq=[1, 300, 0, 129, 700, 0, 250],
                 d=128, page=64, qdt=qdt, fmt=fmt, window=300 if sms == 3 else -1, sinks=sms == 3, seed=sms)
    assert len(launches) == 1


@GPU_ONLY
def test_staging_leaves_the_decode_counters_at_zero(triton_backend, monkeypatch):
    """A staged call writes the workspace past the decode kernels' merge counters only: a decode
    call sharing the workspace then finds them at zero, as they must be at rest."""
    from kvattn.runtime.workspace import ALIGN, COUNTER_BYTES
    from kvattn.testing import make_paged_kv

    stage_always(monkeypatch)
    device = torch.device("cuda")
    case = make_paged_kv([700, 300], num_kv_heads=2, head_dim=128, page_size=64, kv_format="fp8", layout="HND",
                         device=device, seed=5)
    q = torch.randn(1000, 8, 128, device=device, dtype=torch.bfloat16)
    ws = torch.zeros(STAGED_WS, dtype=torch.uint8, device=device)
    cq = torch.tensor([0, 700, 1000], dtype=torch.int32, device=device)
    kvattn.prefill.trtllm_batch_context_with_kv_cache(q, case.kv_cache, ws, case.block_tables, case.seq_lens, 700,
                                                      700, 0.1, 1.0, 2, cq, cq)
    start = (-ws.data_ptr()) % ALIGN
    assert ws[start:start + COUNTER_BYTES].eq(0).all()
    assert ws[start + COUNTER_BYTES:].ne(0).any()  # (the pages were staged)


@pytest.mark.parametrize("case", ["gluon-off", "page4", "page192", "page96", "fp8-out", "skip", "nvfp4-cache",
                                  "fp8-cache-D256", "query-rows-padded-8", "query-rows-padded-16-fp16-page8"])
@GPU_ONLY
def test_other_launches_keep_the_triton_kernel(case, triton_backend, monkeypatch):
    """KVATTN_GLUON=0, pages that do not tile the key tiles, fp8 outputs, skip-softmax, NVFP4
    caches and fp8 caches under a 16-bit query at D256 whose pages do not fit the workspace (64 KB
    here; staged, both take the Gluon kernel), a query whose strides are not multiples of 16
    elements (found by the fuzzer: the kernel's row copies did not compile): the Triton kernel
    (still correct). Strides that are multiples of 16 keep the Gluon kernel."""
    launches = kernel_launches(monkeypatch, prefill_ws, "prefill_ws_kernel")
    kw = dict(lens=[1, 300, 77], lq=[1, 200, 77], d=128, page=64, qdt=torch.bfloat16, seed=4)
    if case == "gluon-off":
        monkeypatch.setenv("KVATTN_GLUON", "0")
    elif case.startswith("page"):
        kw["page"] = int(case[4:])
    elif case == "fp8-out":
        kw["out_kind"] = FP8_DTYPE
    elif case == "skip":
        kw.update(skip=4.0, q_shared=8.0, lens=[700, 1300], lq=[700, 1000])
    elif case == "nvfp4-cache":
        kw["fmt"] = "nvfp4"
    elif case == "query-rows-padded-8":
        kw["q_pad"] = 8
    elif case == "query-rows-padded-16-fp16-page8":  # (16 elements: the Gluon kernel)
        kw.update(q_pad=16, qdt=torch.float16, page=8, hkv=1, group=1)
    else:
        kw.update(fmt="fp8", d=256)
    prefill_case(torch.device("cuda"), monkeypatch, **kw)
    assert (launches != []) == (case == "query-rows-padded-16-fp16-page8")


@pytest.mark.parametrize("shape,pad,expected", [
    ((5, 4, 128), 0, True), ((5, 4, 128), 8, False), ((5, 4, 128), 16, True), ((5, 1, 64), 8, False),
    ((1, 1, 128), 4, False),
], ids=["contiguous", "rows-padded-8", "rows-padded-16", "one-head-padded-8", "one-token-padded-4"])
def test_query_rows_copy_in_whole_pieces(shape, pad, expected):
    from kvattn.ops.prefill.plan import q_copies_whole

    rows = torch.zeros(*shape[:2], shape[2] + pad, dtype=torch.float16)
    assert q_copies_whole(rows[..., : shape[2]]) == expected
    flat = torch.zeros(math.prod(shape) + 1, dtype=torch.float16)
    assert not q_copies_whole(flat[1:].view(shape))  # a base 2 bytes off


