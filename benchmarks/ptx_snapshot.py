"""One hash of sm_90a PTX per production kernel configuration, to prove a move left the machine code
unchanged.

Compiles (no GPU needed: ``tests/ops/sm90.py``'s ``compile_sm90``) every kvattn kernel in the
configurations its launchers pick on an H100/H200 (decode split and combine from the main, long,
short, streaming and one-row tables, single-decode RoPE by TMA, the MLA Triton and both Gluon
kernels, prefill Triton and the warp-specialised Gluon kernel in bf16 and fp8, append, merge,
ragged packing, page staging), with every constexpr given (a missing one would compile as an i32
argument: the tool refuses it). The PTX is normalised before hashing: no ``.loc`` / ``.file``
lines, no debug sections, no comments, parameter names numbered instead of named after the kernel's
module. Configurations are named, not pathed, so a kernel that moves to another module keeps its
key (``KERNELS`` maps each kernel to where it lives now).

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/ptx_snapshot.py --out lab/results/ptx/after.json
    PYTHONPATH=src python benchmarks/ptx_snapshot.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib
import inspect
import json
import re
import sys

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

# Where each kernel lives (the only thing to edit when a kernel moves).
KERNELS = {
    "decode_split": "kvattn.ops.decode.kernels.decode_split_kernel",
    "decode_combine": "kvattn.ops.common.combine.decode_combine_kernel",
    "balanced_combine": "kvattn.ops.common.combine.balanced_combine_kernel",
    "ragged_pack": "kvattn.ops.decode.kernels_ragged.ragged_pack_kernel",
    "ragged_unpack": "kvattn.ops.decode.kernels_ragged.ragged_unpack_kernel",
    "mla_split": "kvattn.ops.mla.kernels.mla_split_kernel",
    "mla_gluon": "kvattn.ops.mla.kernels_gluon.mla_gluon_kernel",
    "mla_gluon_ws": "kvattn.ops.mla.kernels_gluon_ws.mla_gluon_ws_kernel",
    "context": "kvattn.ops.prefill.kernels.context_kernel",
    "prefill_ws": "kvattn.ops.prefill.kernels_gluon_ws.prefill_ws_kernel",
    "stage_pages": "kvattn.ops.prefill.kernels_staging.stage_pages_kernel",
    "append_kv": "kvattn.ops.append.kernels.append_kv_kernel",
    "merge_states": "kvattn.ops.merge.kernels.merge_states_kernel",
    "local_lengths": "kvattn.ops.merge.kernels.local_lengths_kernel",
}
# Kernels with tuple parameters: where their members are named (a configuration names each member
# as a parameter of its own; compile_sm90 builds the tuples)
TUPLES = {
    "decode_split": "kvattn.ops.decode.kernels.SPLIT_TUPLES",
    "context": "kvattn.ops.prefill.kernels.CONTEXT_TUPLES",
}
FLOATS = ("logit_factor", "out_factor", "soft_cap_value", "rope_theta", "rope_scale", "k_scale_factor",
          "v_scale_factor", "sf_div", "skip_factor")

# decode_split_kernel (Llama-like GQA: 32 query heads over 8 KV heads, D128, pages of 16)
_DEC_PTRS = {"k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32", "kv_start_ptr": "*i32",
             "mask_ptr": "*i16", "sinks_ptr": "*fp32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32",
             "lse_ptr": "*fp32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "counter_ptr": "*i32",
             "k_sf_ptr": "*u8", "v_sf_ptr": "*u8"}
_DEC = dict(HEAD_DIM=128, PAGE_SIZE=16, NUM_KV_HEADS=8, GROUP=4, Q_LEN=1, BLOCK_M=16, BLOCK_N=64, M_BLOCKS=1,
            KEYS_IN_M=False, KV_FORMAT=0, PAGED=True, SAME_TABLE=True, HAS_WINDOW=False, HAS_MASK=False,
            HAS_SINKS=False,
            LOGIT_PTR=False, OUT_PTR=False, OUT_FP8=False, STORE_LSE=False, ROPE=False, ALIBI=False,
            SOFT_CAP=False, USE_DOT=True, PAGE_AHEAD=True, PREFETCH=0, KV_EVICT_FIRST=False, KV_TMA=False,
            MERGE=True, MERGE_ROWS=4, MERGE_BLOCK_S=8, PERSISTENT=False, USE_PDL=True, HAS_KV_START=False,
            SPLIT_SPAN=0, BALANCED=False, BLOCK_B=1, MIN_CHUNK=0, DEAL_SLOT=0, LANES=False, LANE_CAP=0, MERGE_UNITS=0,
            PAGE_OFFSETS=2)
# (PAGE_RUNS: the plan's rule, dec() below)
_COMBINE = dict(NUM_HEADS=32, HEAD_DIM=128, BLOCK_S=16, HAS_SINKS=False, OUT_PTR=False, OUT_FP8=False,
                STORE_LSE=False, USE_PDL=True)
_MLA_PTRS = {"table_ptr": "*i32", "seq_lens_ptr": "*i32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32",
             "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32"}
_MLA = dict(CKV_DIM=512, KPE_DIM=64, PAGE_SIZE=64, BLOCK_H=64, BLOCK_N=64, H_BLOCKS=2, KV_FORMAT=0,
            LOGIT_PTR=False, OUT_PTR=False, QK_FP8=False, HEADS_AS_N=False, SPLIT_SCORES=True, STORE_LSE=False,
            SPLIT_SPAN=0, Q_LEN=1, BALANCED=False, BLOCK_B=1, MIN_CHUNK=0, UNITS_CAP=1)
_MLA_GLUON = dict(CKV_DIM=512, KPE_DIM=64, PAGE_SIZE=64, BLOCK_H=64, BLOCK_N=64, H_BLOCKS=2, LOGIT_PTR=False,
                  OUT_PTR=False, STORE_LSE=False, SPLIT_SPAN=0, Q_LEN=1, BALANCED=False, BLOCK_B=1, MIN_CHUNK=0,
                  UNITS_CAP=1)
_MLA_BALANCED = dict(BALANCED=True, BLOCK_B=32, MIN_CHUNK=256, UNITS_CAP=64)
_MLA_WS = {k: v for k, v in _MLA_GLUON.items() if k != "STORE_LSE"}
_SMEM16 = ("NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False, "
           "fp4_padded=False, cga_layout=[])")
_SMEM8 = ("NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2, transposed=False, "
          "fp4_padded=False, cga_layout=[])")
_CTX_PTRS = {"k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32", "cum_q_ptr": "*i32",
             "sinks_ptr": "*fp32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32", "lse_ptr": "*fp32",
             "k_sf_ptr": "*u8", "v_sf_ptr": "*u8", "out_sf_ptr": "*u8"}
_CTX = dict(HEAD_DIM=128, PAGE_SIZE=16, GROUP=4, BLOCK_M=128, BLOCK_N=128, KV_FORMAT=0, QK_FP8=False,
            SAME_TABLE=True, HAS_WINDOW=False, HAS_SINKS=False, SKIP=False, LOGIT_PTR=False, OUT_PTR=False,
            OUT_FP8=False, OUT_NVFP4=False, TMA=False, Q_SIGN=1, STORE_LSE=False, CAUSAL=True)
_WS_PTRS = {"k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32", "cum_q_ptr": "*i32",
            "sinks_ptr": "*fp32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32"}
_WS = dict(HEAD_DIM=128, PAGE_SIZE=64, GROUP=4, BLOCK_N=128, STAGES=2, HAS_WINDOW=False, HAS_SINKS=False,
           LOGIT_PTR=False, OUT_PTR=False, PINGPONG=False, KV_FP8=False, V_STAGED=False, CAUSAL=True)
_WS_MAXNREG = 168  # ops/prefill/plan_gluon_ws.MAXNREG: a launch option, not a constexpr


def _decode_table(kind: str, kv_format: str = "bfloat16", rope: bool = False) -> dict:
    """BLOCK_N / warps / stages of a decode table entry (D128, 16 rows a program)."""
    from kvattn.ops.decode import configs

    cfg = configs.config("sm90", kv_format, 128, 16, rope, kind)
    return dict(constexprs=dict(BLOCK_N=cfg.block_n, PAGE_AHEAD=cfg.page_ahead, KV_EVICT_FIRST=cfg.evict_first),
                warps=cfg.num_warps, stages=cfg.num_stages)


def _tuples(kernel: str) -> dict:
    """The tuple parameters of kernel ``kernel`` (a key of KERNELS), each by its members' names."""
    if kernel not in TUPLES:
        return {}
    module, attr = TUPLES[kernel].rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)


def configs() -> dict[str, dict]:
    """Every configuration: name -> ``compile_sm90`` keywords (``kernel`` by its key in KERNELS)."""
    out: dict[str, dict] = {}

    def dec(name, table, kv="bfloat16", ptr="*bf16", rope=False, _descs=None, **over):
        from kvattn.ops.decode.plan import page_runs_rule

        t = _decode_table(table, kv, rope)
        cx = dict(_DEC, **dict(t["constexprs"], **over))
        # the plan's page runs (these configurations' strides fit int32)
        cx["PAGE_RUNS"] = page_runs_rule(
            page_offsets=cx["PAGE_OFFSETS"] if cx["PAGED"] else 0, whole_tiles=not (cx["HAS_WINDOW"] or cx["HAS_KV_START"]),
            page_size=cx["PAGE_SIZE"], block_n=cx["BLOCK_N"], num_warps=t["warps"])
        descs = _descs
        out[f"decode_split/{name}"] = dict(
            kernel="decode_split", constexprs=cx, ptrs=dict(_DEC_PTRS, k_ptr=ptr, v_ptr=ptr), floats=FLOATS,
            warps=t["warps"], stages=t["stages"], descs=descs,
            ptx_hints=bool(cx["KV_TMA"] and cx["KV_EVICT_FIRST"]), tuples=_tuples("decode_split"))

    dec("main-bf16-p16", "main")
    dec("main-bf16-p16-lse-window-sinks", "main", STORE_LSE=True, HAS_WINDOW=True, HAS_SINKS=True)
    dec("main-fp8-p16", "main", kv="fp8", ptr="*fp8e4nv", KV_FORMAT=3)
    dec("long-bf16-p64", "long", PAGE_SIZE=64)
    dec("short-bf16-p64", "short", PAGE_SIZE=64)
    dec("short-fp8-p16", "short", kv="fp8", ptr="*fp8e4nv", KV_FORMAT=3)
    dec("stream-bf16-p16", "stream")
    dec("balanced-bf16-p16", "main", BALANCED=True, BLOCK_B=64, MIN_CHUNK=512, DEAL_SLOT=1022, MERGE_BLOCK_S=16,
        LANE_CAP=0)
    dec("lanes-bf16-p16", "main", BALANCED=True, BLOCK_B=64, MIN_CHUNK=512, DEAL_SLOT=1022, MERGE_BLOCK_S=16,
        LANES=True, LANE_CAP=32)
    dec("lanes-fp8-p16", "main", kv="fp8", ptr="*fp8e4nv", KV_FORMAT=3, BALANCED=True, BLOCK_B=32, MIN_CHUNK=512,
        DEAL_SLOT=1022, MERGE_BLOCK_S=8, LANES=True, LANE_CAP=32)
    dec("invariant-bf16-p16", "main", MERGE=False, SPLIT_SPAN=1024)
    dec("mtp4-bf16-p16", "main", Q_LEN=4, MERGE_ROWS=16)
    dec("contig-one-row", "contig", PAGED=False, PAGE_OFFSETS=0, PAGE_SIZE=1, NUM_KV_HEADS=32, GROUP=1, MERGE_ROWS=1,
        STORE_LSE=True, PREFETCH=1)
    # single decode with RoPE: the one-row kernel, K/V by TMA with the L2 evict_first hint
    dec("single-rope-tma", "rope_stream", rope=True, PAGED=False, PAGE_OFFSETS=0, PAGE_SIZE=1, NUM_KV_HEADS=32, GROUP=1,
        MERGE_ROWS=1, STORE_LSE=True, ROPE=True, KV_TMA=True, KV_EVICT_FIRST=True,
        _descs={"k_ptr": "tensordesc<bf16[1, 32, 64]>", "v_ptr": "tensordesc<bf16[1, 32, 128]>"})
    dec("single-rope-contig", "main", rope=True, PAGED=False, PAGE_OFFSETS=0, PAGE_SIZE=1, NUM_KV_HEADS=32, GROUP=1,
        MERGE_ROWS=1, STORE_LSE=True, ROPE=True, PREFETCH=1)
    cptr = {"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "sinks_ptr": "*fp32", "out_scale_ptr": "*fp32",
            "lse_ptr": "*fp32"}
    out["decode_combine/gqa-d128"] = dict(kernel="decode_combine", constexprs=_COMBINE, ptrs=cptr, floats=FLOATS,
                                          warps=4, stages=2)
    out["decode_combine/lse-sinks"] = dict(kernel="decode_combine", constexprs=dict(
        _COMBINE, HAS_SINKS=True, STORE_LSE=True), ptrs=cptr, floats=FLOATS, warps=4, stages=2)
    out["decode_combine/mla-d512"] = dict(kernel="decode_combine", constexprs=dict(
        _COMBINE, NUM_HEADS=128, HEAD_DIM=512, BLOCK_S=16, USE_PDL=True), ptrs=cptr, floats=FLOATS,
        warps=4, stages=2)
    out["ragged_pack/q4"] = dict(kernel="ragged_pack", constexprs=dict(
        Q_LEN=4, HEAD_DIM=128, BLOCK_H=32, WORDS=4, BLOCK_W=4, HAS_MASK=False, MAKE_MASK=True, HAS_WINDOW=False),
        ptrs={"cu_ptr": "*i32", "mask_ptr": "*i16", "mask_pad_ptr": "*i16"}, warps=4, stages=1)
    out["ragged_unpack/q4"] = dict(kernel="ragged_unpack", constexprs=dict(Q_LEN=4, HEAD_DIM=128, BLOCK_H=32,
                                                                                    HAS_LSE=True),
                                   ptrs={"cu_ptr": "*i32", "lse_pad_ptr": "*fp32", "lse_ptr": "*fp32"}, warps=4,
                                   stages=1)
    # MLA (DeepSeek: 512 + 64 columns, pages of 64)
    for name, over, warps, stages in (("bf16-h64-split", {}, 8, 2),
                                      ("bf16-h16", dict(BLOCK_H=16, H_BLOCKS=1, SPLIT_SCORES=False), 8, 3),
                                      ("fp8-h32", dict(BLOCK_H=32, KV_FORMAT=3, SPLIT_SCORES=False), 8, 3),
                                      ("fp8qk-h16-heads-as-n", dict(BLOCK_H=16, H_BLOCKS=1, KV_FORMAT=1,
                                                                    QK_FP8=True, HEADS_AS_N=True), 8, 3)):
        kv = "*fp8e4nv" if over.get("KV_FORMAT") in (1, 3) else "*bf16"
        q = "*fp8e4nv" if over.get("QK_FP8") else "*bf16"
        out[f"mla_split/{name}"] = dict(kernel="mla_split", constexprs=dict(_MLA, **over),
                                        ptrs=dict(_MLA_PTRS, kv_ptr=kv, q_ptr=q), floats=FLOATS, warps=warps,
                                        stages=stages)
    # the balanced split of ragged batches (mla/plan.py: up to 256 requests, 64 units a request)
    out["mla_split/bf16-h16-balanced"] = dict(kernel="mla_split", constexprs=dict(
        _MLA, BLOCK_H=16, H_BLOCKS=1, SPLIT_SCORES=False, **_MLA_BALANCED),
        ptrs=dict(_MLA_PTRS, kv_ptr="*bf16", q_ptr="*bf16"), floats=FLOATS, warps=8, stages=3)
    out["mla_split/fp8qk-h16-heads-as-n-balanced"] = dict(kernel="mla_split", constexprs=dict(
        _MLA, BLOCK_H=16, H_BLOCKS=1, KV_FORMAT=1, QK_FP8=True, HEADS_AS_N=True, **_MLA_BALANCED),
        ptrs=dict(_MLA_PTRS, kv_ptr="*fp8e4nv", q_ptr="*fp8e4nv"), floats=FLOATS, warps=8, stages=3)
    out["balanced_combine/mla-d512"] = dict(kernel="balanced_combine", constexprs=dict(
        NUM_HEADS=128, HEAD_DIM=512, BLOCK_S=16, BLOCK_S_FEW=2, OUT_PTR=False, STORE_LSE=False, MIN_CHUNK=256, BLOCK_N=64,
        BLOCK_B=32, UNITS_CAP=64, USE_PDL=True), ptrs={"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "seq_lens_ptr": "*i32",
                                         "out_scale_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32"},
        floats=FLOATS, warps=4, stages=2)
    gptrs = dict(_MLA_PTRS, q_ptr="*bf16")

    def rows(elem, over):  # the cache's TMA box: a tile's 64 rows, or a page's over pages of 16 / 32
        return {"kv_desc": f"tensordesc<{elem}[{min(over.get('PAGE_SIZE', 64), 64)}, 64],"
                           f"{_SMEM8 if elem == 'fp8e4nv' else _SMEM16}>"}

    for name, over in (("p64", {}), ("p64-lse", dict(STORE_LSE=True)), ("p64-mtp4", dict(Q_LEN=4)),
                       ("p64-balanced", _MLA_BALANCED), ("p16", dict(PAGE_SIZE=16)), ("p32", dict(PAGE_SIZE=32)),
                       ("p16-balanced", dict(PAGE_SIZE=16, **_MLA_BALANCED))):
        out[f"mla_gluon/{name}"] = dict(kernel="mla_gluon", constexprs=dict(_MLA_GLUON, **over), ptrs=gptrs,
                                        floats=FLOATS, warps=8, gluon=True, descs=rows("bf16", over))
    for name, over in (("p64", {}), ("p256", dict(PAGE_SIZE=256)), ("invariant", dict(SPLIT_SPAN=1024)),
                       ("p64-balanced", _MLA_BALANCED), ("p16", dict(PAGE_SIZE=16)), ("p32", dict(PAGE_SIZE=32)),
                       ("p16-balanced", dict(PAGE_SIZE=16, **_MLA_BALANCED))):
        out[f"mla_gluon_ws/bf16-{name}"] = dict(kernel="mla_gluon_ws", constexprs=dict(_MLA_WS, **over), ptrs=gptrs,
                                                floats=FLOATS, warps=4, gluon=True, descs=rows("bf16", over))
    for name, over in (("p64", {}), ("p64-balanced", _MLA_BALANCED), ("p16", dict(PAGE_SIZE=16)),
                       ("p32", dict(PAGE_SIZE=32))):
        out[f"mla_gluon_ws/fp8-{name}"] = dict(kernel="mla_gluon_ws", constexprs=dict(_MLA_WS, **over),
                                               ptrs=dict(gptrs, q_ptr="*fp8e4nv"), floats=FLOATS, warps=4,
                                               gluon=True, descs=rows("fp8e4nv", over))
    # prefill (Triton): 16-bit gathers, fp8 pages, NVFP4 pages
    for name, over, kv, warps, stages in (
            ("bf16-d128", {}, "*bf16", 8, 2),
            ("bf16-d128-lse-window-sinks", dict(STORE_LSE=True, HAS_WINDOW=True, HAS_SINKS=True), "*bf16", 8, 2),
            ("fp8-d128", dict(KV_FORMAT=3), "*fp8e4nv", 8, 2),
            ("nvfp4-d128", dict(KV_FORMAT=4), "*u8", 8, 2),
            ("bf16-d64", dict(HEAD_DIM=64), "*bf16", 8, 2),
            ("bf16-d256", dict(HEAD_DIM=256, BLOCK_N=32), "*bf16", 8, 2)):
        out[f"context/{name}"] = dict(kernel="context", constexprs=dict(_CTX, **over),
                                      ptrs=dict(_CTX_PTRS, q_ptr="*bf16", out_ptr="*bf16", k_ptr=kv, v_ptr=kv),
                                      floats=FLOATS, warps=warps, stages=stages, tuples=_tuples("context"))

    def ws(name, dtype="bf16", kv=None, v=None, **over):
        kv = kv or dtype
        v = v or kv
        cfg = dict(_WS, KV_FP8=kv == "fp8e4nv", V_STAGED=v != kv, **over)
        sub = min(cfg["PAGE_SIZE"], cfg["BLOCK_N"])

        def desc(elem):
            esize = 1 if elem == "fp8e4nv" else 2
            smem = _SMEM16 if esize == 2 else _SMEM16.replace("element_bitwidth=16", "element_bitwidth=8").replace(
                "swizzle_byte_width=128", f"swizzle_byte_width={min(128, cfg['HEAD_DIM'])}")
            return f"tensordesc<{elem}[{sub}, {min(cfg['HEAD_DIM'], 128 // esize)}],{smem}>"

        o = "bf16" if dtype == "fp8e4nv" else dtype
        out[f"prefill_ws/{name}"] = dict(kernel="prefill_ws", constexprs=cfg,
                                         ptrs=dict(_WS_PTRS, q_ptr=f"*{dtype}", out_ptr=f"*{o}"), floats=FLOATS,
                                         warps=4, gluon=True, descs={"k_desc": desc(kv), "v_desc": desc(v)},
                                         options={"maxnreg": _WS_MAXNREG})

    ws("bf16-d128-p64")
    ws("bf16-d64-p64", HEAD_DIM=64, STAGES=4)
    ws("bf16-d256-p64", HEAD_DIM=256, BLOCK_N=64)
    ws("bf16-d128-p16-window-sinks", PAGE_SIZE=16, HAS_WINDOW=True, HAS_SINKS=True)
    ws("fp8-d128-p64", dtype="fp8e4nv", kv="fp8e4nv")
    ws("fp8-d128-staged-v", dtype="fp8e4nv", kv="fp8e4nv", v="fp16", STAGES=3)
    out["stage_pages/fp8-k"] = dict(kernel="stage_pages", constexprs=dict(
        HEAD_DIM=128, PAGE_SIZE=16, DST_PAGE=64, TOKENS=64, KV_FORMAT=3, STAGE_K=True, HAS_WINDOW=False,
        KEY_ALIGN=64), ptrs={"k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv", "k_sf_ptr": "*u8", "v_sf_ptr": "*u8",
                             "k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32",
                             "cum_q_ptr": "*i32", "k_dst_ptr": "*fp16", "v_dst_ptr": "*fp16",
                             "dst_table_ptr": "*i32"}, warps=4, stages=1)
    for fmt, code, ptr in (("bf16", 0, "*bf16"), ("fp8", 1, "*u8"), ("nvfp4", 2, "*u8")):
        out[f"append_kv/{fmt}-d128"] = dict(kernel="append_kv", constexprs=dict(
            NUM_HEADS=8, HEAD_DIM=128, PAGE_SIZE=16, BLOCK_H=8, BLOCK_D=128, KV_FORMAT=code, HAS_V=True,
            K_SCALE_TENSOR=True, V_SCALE_TENSOR=False),
            ptrs={"k_ptr": ptr, "v_ptr": ptr, "k_sf_ptr": "*u8", "v_sf_ptr": "*u8", "table_ptr": "*i32",
                  "batch_ptr": "*i32", "pos_ptr": "*i32", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32"},
            floats=FLOATS, warps=4, stages=3)
    mptrs = {"lse_ptr": "*fp32", "lse2_ptr": "*fp32", "sinks_ptr": "*fp32", "out_lse_ptr": "*fp32"}
    out["merge_states/states-d128"] = dict(kernel="merge_states", constexprs=dict(
        BLOCK_R=16, BLOCK_D=128, PAIR=False, HAS_SINKS=False, STORE_LSE=True), ptrs=mptrs, warps=4, stages=3)
    out["merge_states/pair-sinks"] = dict(kernel="merge_states", constexprs=dict(
        BLOCK_R=16, BLOCK_D=128, PAIR=True, HAS_SINKS=True, STORE_LSE=False), ptrs=mptrs, warps=4, stages=3)
    out["local_lengths/round-robin"] = dict(kernel="local_lengths", constexprs=dict(
        ROUND_ROBIN=True, LAST=False, HAS_WINDOW=True, BLOCK=128), ptrs={}, default_ptr="*i32", warps=4, stages=3)
    return out


def _check_constexprs(name: str, case: dict) -> None:
    """Refuse a configuration that leaves a constexpr (or a member of a constexpr tuple) out: it
    would compile as an i32 argument."""
    module, attr = KERNELS[case["kernel"]].rsplit(".", 1)
    fn = getattr(importlib.import_module(module), attr)
    fn = getattr(fn, "fn", fn)  # the Python function (a JIT or an interpreted kernel wraps it)
    while hasattr(fn, "fn"):
        fn = fn.fn
    tuples = case.get("tuples", {})
    want = {member for name, p in inspect.signature(fn).parameters.items() if "constexpr" in str(p.annotation)
            for member in tuples.get(name, (name,))}  # a constexpr tuple's members by their names
    got = set(case["constexprs"])
    if want != got:
        raise SystemExit(f"{name}: constexprs missing {sorted(want - got)}, unknown {sorted(got - want)}")


_DROP = re.compile(r"^\s*(\.loc|\.file|//|@@|\$L__tmp\d+:$)")  # ($L__tmp: debug-scope labels, no branch targets)


def normalise(ptx: str) -> str:
    """The PTX without what a move may change and the machine code does not: debug line info,
    debug sections, comments, and parameter names (``<kernel>_param_3`` -> ``param_3``)."""
    text = re.sub(r"\.section\s+\.debug\w*\s*\{.*?\n\s*\}", "", ptx, flags=re.S)
    lines = [re.sub(r"\s*//.*$", "", ln) for ln in text.splitlines() if not _DROP.match(ln)]
    text = "\n".join(ln for ln in lines if ln.strip())
    return re.sub(r"\b\w+?_param_(\d+)\b", r"param_\1", text)


def _compile(name: str, case: dict) -> tuple[str, dict]:
    from tests.ops.sm90 import compile_sm90

    kw = {k: v for k, v in case.items() if k not in ("kernel", "constexprs")}
    kw["floats"] = tuple(kw.get("floats", ()))
    got = compile_sm90(KERNELS[case["kernel"]], case["constexprs"], **kw)
    ptx = normalise(got["ptx"])
    return name, {"ptx_sha256": hashlib.sha256(ptx.encode()).hexdigest(), "shared": got["shared"],
                  **({"reg": got["reg"]} if "reg" in got else {}), "ptx_lines": ptx.count("\n") + 1}


def snapshot(jobs: int, only: str | None = None) -> dict:
    import triton

    cases = {k: v for k, v in configs().items() if only is None or re.search(only, k)}
    for name, case in cases.items():
        _check_constexprs(name, case)
    result: dict = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for name, entry in pool.map(lambda kv: _compile(*kv), cases.items()):
            result[name] = entry
            print(f"{name:48s} {entry['ptx_sha256'][:16]} shared={entry['shared']}", flush=True)
    return {"triton": triton.__version__, "target": "cuda:90a", "kernels": dict(sorted(result.items()))}


def compare(a_path: str, b_path: str) -> int:
    """Print the configurations whose hash (or presence) differs; 1 if any do."""
    a = json.load(open(a_path))["kernels"]
    b = json.load(open(b_path))["kernels"]
    diff = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {a_path if name in a else b_path}")
            diff += 1
        elif a[name]["ptx_sha256"] != b[name]["ptx_sha256"]:
            print(f"{name}: PTX differs ({a[name]['ptx_lines']} -> {b[name]['ptx_lines']} lines)")
            diff += 1
    print(f"{len(set(a) & set(b)) - sum(1 for n in set(a) & set(b) if a[n]['ptx_sha256'] != b[n]['ptx_sha256'])}"
          f" of {len(set(a) | set(b))} configurations identical")
    return 1 if diff else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the snapshot JSON here")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="print where two snapshots differ")
    ap.add_argument("--only", help="regex of configuration names to compile")
    ap.add_argument("--jobs", type=int, default=2, help="compiles in flight")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    snap = snapshot(args.jobs, args.only)
    text = json.dumps(snap, indent=1) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
