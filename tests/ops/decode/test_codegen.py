"""What the decode kernel compiles to for Hopper (sm_90a), where a speed-up rests on a compiler fact.

The kernels are compiled (not run) for an sm_90a target, so these tests need no GPU: a subprocess
without ``TRITON_INTERPRET`` compiles them through Triton's own pipeline and reports the TTGIR /
PTX facts checked here. They pin two Triton 3.6 behaviours the decode tables are built on
(``lab/notes/formats.md`` "Formats: fp8 KV in decode"): the fp8 V tile behind ``common.opaque`` gives its P.V product
kWidth 2, and an ``evict_first`` hint survives only on loads Triton does not software-pipeline.
"""

from __future__ import annotations

import re

import pytest

from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode.kernels import SPLIT_TUPLES
from kvattn.runtime import ptx_hints

from ..sm90 import compile_sm90, gpu_verified_fact

pytestmark = pytest.mark.codegen  # compiled, not run: CI runs these (pyproject.toml markers)

FLOATS = ("logit_factor", "out_factor", "soft_cap_value", "rope_theta", "rope_scale")
PTRS = {"k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32", "kv_start_ptr": "*i32", "mask_ptr": "*i16",
        "sinks_ptr": "*fp32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32", "lse_ptr": "*fp32",
        "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "counter_ptr": "*i32", "k_sf_ptr": "*u8", "v_sf_ptr": "*u8"}
BASE = dict(HEAD_DIM=128, PAGE_SIZE=16, NUM_KV_HEADS=8, GROUP=4, Q_LEN=1, BLOCK_M=16, BLOCK_N=128, M_BLOCKS=1,
            KEYS_IN_M=False,
            KV_FORMAT=0, PAGED=True, SAME_TABLE=True, HAS_WINDOW=False, HAS_MASK=False, HAS_SINKS=False,
            LOGIT_PTR=False, OUT_PTR=False, OUT_FP8=False, STORE_LSE=False, ROPE=False, ALIBI=False,
            SOFT_CAP=False, USE_DOT=True, PAGE_AHEAD=True, PREFETCH=0, KV_EVICT_FIRST=False, KV_TMA=False, MERGE=False,
            MERGE_ROWS=1, MERGE_BLOCK_S=1, PERSISTENT=False, USE_PDL=True, HAS_KV_START=False,
            SPLIT_SPAN=0, BALANCED=False, BLOCK_B=1, MIN_CHUNK=0, DEAL_SLOT=0, LANES=False, LANE_CAP=0, PAGE_OFFSETS=2,
            PAGE_RUNS=False)
# Single decode with RoPE, 32 heads of 128 (the one-row kernel: the query rotated per key) on sm90's table
ROPE_ONE_ROW = dict(PAGE_SIZE=1, NUM_KV_HEADS=32, GROUP=1, BLOCK_N=32, PAGED=False, PAGE_OFFSETS=0, STORE_LSE=True, ROPE=True,
                    PREFETCH=1)


def _compile(constexprs: dict, kv_type: str = "*bf16", warps: int = 4, stages: int = 3, raw: bool = False,
             descs: dict | None = None, sass: bool = False) -> dict:
    got = compile_sm90("kvattn.ops.decode.kernels.decode_split_kernel", dict(BASE, **constexprs),
                       ptrs=dict(PTRS, k_ptr=kv_type, v_ptr=kv_type), floats=FLOATS, warps=warps, stages=stages,
                       descs=descs, sass=sass, tuples=SPLIT_TUPLES,
                       ptx_hints=bool(constexprs.get("KV_TMA") and constexprs.get("KV_EVICT_FIRST")))
    if raw:
        return got
    return {"kwidths": sorted({int(w) for w in re.findall(r"kWidth = (\d+)", got["ttgir"])}),
            "evict_first": got["ptx"].count("evict_first"),
            "cp_async": len(re.findall(r"cp\.async\.c[ag]", got["ptx"]))}


@gpu_verified_fact("Triton 3.9 gives the Q.K^T product kWidth 2 as well")
def test_fp8_pv_product_gets_kwidth_2():
    """fp8 read as words (KV_FORMAT 3): the V tile ends in `opaque`, so the P.V product packs 2
    elements a register (P stays in registers) while Q.K^T keeps the joins' kWidth 4."""
    got = _compile(dict(KV_FORMAT=3), kv_type="*fp8e4nv")
    assert got["kwidths"] == [2, 4]


@pytest.mark.parametrize("stages,hinted", [
    pytest.param(1, True, id="unpipelined"),
    pytest.param(3, False, id="pipelined", marks=gpu_verified_fact(
        "Triton 3.9 keeps the hint on pipelined cp.async copies, as an L2 policy (createpolicy)")),
])
def test_evict_first_survives_only_unpipelined_loads(stages, hinted):
    """The streaming tiles run 1 stage because Triton 3.6 drops the hint on cp.async copies."""
    got = _compile(dict(KV_EVICT_FIRST=True), warps=8, stages=stages)
    assert (got["evict_first"] > 0) is hinted
    assert (got["cp_async"] == 0) is hinted


def test_in_kernel_merge_keeps_the_one_row_rope_kernel_at_4_programs_an_sm():
    """The merge adds no registers where occupancy is at a step (128 registers: 4 programs of 4
    warps an SM; its first form, 32 float32 a thread of merge loads, took 168), and its counter is
    one thread's acq_rel atomic behind a CTA barrier that follows every thread's partial stores."""
    plain = _compile(ROPE_ONE_ROW, raw=True)
    merged = _compile(dict(ROPE_ONE_ROW, MERGE=True, MERGE_BLOCK_S=8), raw=True)
    if "reg" not in merged:
        pytest.skip("Triton ships no cuobjdump here")
    assert plain["reg"] <= 128 and merged["reg"] <= 128, (plain["reg"], merged["reg"])
    ptx = merged["ptx"]
    add = re.search(r"@%p\d+ atom\.global\.gpu\.acq_rel\.add\.u32", ptx)
    assert add and "atom." not in plain["ptx"]
    assert "bar.sync" in ptx[ptx.rfind("st.global", 0, add.start()) : add.start()]
    assert len(re.findall(r"ld\.global\.cg", ptx)) >= 2  # the merge's partial loads skip L1


def test_batch_invariant_split_keeps_the_one_row_rope_kernel_at_4_programs_an_sm():
    """Fixed-span splits (SPLIT_SPAN, lab/notes/robustness.md "Batch-invariant mode") change only the
    split bounds: the one-row RoPE kernel (the tightest budget) stays within 128 registers, with
    the stack of the default mode's kernel (32 bytes under Triton 3.6), no more."""
    plain = _compile(ROPE_ONE_ROW, raw=True)
    got = _compile(dict(ROPE_ONE_ROW, SPLIT_SPAN=1024), raw=True)
    if "reg" not in got:
        pytest.skip("Triton ships no cuobjdump here")
    assert got["reg"] <= 128, got["reg"]
    assert got.get("stack", 0) <= plain.get("stack", 0), (got.get("stack"), plain.get("stack"))


def test_contig_one_row_tiles_fit_four_programs_an_sm():
    """Single decode past the streaming spans (decode_configs._SM90_CONTIG: 64-key, 4-warp,
    unpipelined tiles, merged in the kernel) was measured with 4 programs an SM, which needs at
    most 128 registers a thread; its loads are register loads (no cp.async) without the hint."""
    cfg = decode_configs.config("sm90", "bfloat16", 128, 16, False, "contig")
    got = _compile(dict(PAGE_SIZE=1, NUM_KV_HEADS=32, GROUP=1, PAGED=False, PAGE_OFFSETS=0, STORE_LSE=True, MERGE=True,
                        MERGE_BLOCK_S=16, BLOCK_N=cfg.block_n, KV_EVICT_FIRST=cfg.evict_first),
                   warps=cfg.num_warps, stages=cfg.num_stages, raw=True)
    if "reg" not in got:
        pytest.skip("Triton ships no cuobjdump here")
    assert got["reg"] <= 128, got["reg"]
    assert "cp.async" not in got["ptx"] and "evict_first" not in got["ptx"]


@pytest.mark.skipif(not ptx_hints.HOOK_SUPPORTED, reason="the TMA copies' L2 hint is gated to the stages hook "
                    "of Triton 3.6 / 3.7 (runtime/ptx_hints.py); this Triton compiles them unhinted")
def test_rope_stream_tiles_copy_by_tma_with_a_policy_ptxas_writes():
    """RoPE's streaming tiles (the one-row kernel, K and V by TMA, KV_EVICT_FIRST): every TMA copy
    carries the L2 policy created once at the entry (runtime/ptx_hints.py), no copy is a plain
    cp.async (which ptxas 12.8 miscompiles with a policy: an LDGSTS reading a descriptor register
    nothing writes), and in the SASS every UTMALDG's descriptor register pair is written before
    it. Registers stay at 4 programs an SM."""
    descs = {"k_ptr": "tensordesc<bf16[1, 32, 64]>", "v_ptr": "tensordesc<bf16[1, 32, 128]>"}
    got = _compile(dict(ROPE_ONE_ROW, KV_TMA=True, KV_EVICT_FIRST=True, PREFETCH=0), descs=descs, raw=True,
                   sass=True)
    ptx = got["ptx"]
    copies = re.findall(r"cp\.async\.bulk\.tensor[^;]*;", ptx)
    assert len(copies) >= 3 and all(c.endswith(", %kvattn_l2_evict_first;") and ".L2::cache_hint" in c for c in copies)
    assert ptx.count("createpolicy.fractional.L2::evict_first.b64 %kvattn_l2_evict_first, 1.0;") == 1
    assert not re.search(r"cp\.async\.c[ag]", ptx)
    if "sass" not in got:
        pytest.skip("Triton ships no cuobjdump here")
    assert got["reg"] <= 128, got["reg"]
    written: set[int] = set()
    loads = 0
    for line in got["sass"].splitlines():
        ins = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)\s+(.*?);", line)
        if not ins:
            continue
        if ins.group(1).startswith("UTMALDG"):
            pair = int(re.search(r"desc\[UR(\d+)\]", ins.group(2)).group(1))
            assert {pair, pair + 1} <= written, line
            loads += 1
        dest = re.match(r"UR(\d+)\b", ins.group(2))
        if dest and ins.group(1).startswith("U") or dest and ins.group(1) == "R2UR":
            written.add(int(dest.group(1)))
    assert loads == len(copies)
