"""``benchmarks/decode_floors.py``: timing floors of the paged decode kernel from a patched copy of
its source, and ``benchmarks/tune_decode.py``'s ``floor_*`` variants that launch them.

The patches must apply to the current kernel (each replaced text found exactly once, a moved one
failing loudly), the patched modules import, and each floor compiles for sm_90a (no GPU: a
subprocess runs Triton's pipeline, ``tests/ops/sm90.py``) into code that lacks what it claims to
take out: the codegen tests, marked as the other sm_90a compile tests are.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import decode_floors, tune_decode  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402
from kvattn.ops.decode import kernels as decode_kernels  # noqa: E402
from kvattn.ops.decode import plan as decode_launch  # noqa: E402

FLOORS = tuple(decode_floors.PATCHES)


@pytest.mark.parametrize("floor", FLOORS)
def test_every_patch_applies_once_and_the_module_imports(floor):
    text = Path(decode_kernels.__file__).read_text()
    for old, new in decode_floors.PATCHES[floor]:
        assert text.count(old) == 1, (floor, old)
        assert old != new
    patched = decode_floors.patched_source(floor)
    assert patched != text
    module = decode_floors.floor_module(floor)
    assert module.__name__ == f"kvattn.ops.decode.kernels_floor_{floor}"
    kernel = decode_floors.floor_kernel(floor)
    assert kernel is not decode_kernels.decode_split_kernel
    assert kernel.arg_names == decode_kernels.decode_split_kernel.arg_names
    assert getattr(decode_floors, f"floor_kernel_{floor}") is kernel


def test_a_moved_text_fails_loudly(monkeypatch):
    monkeypatch.setitem(decode_floors.PATCHES, "gone", [("    this text is not in the kernel\n", "")])
    with pytest.raises(RuntimeError, match="0 copies"):
        decode_floors.patched_source("gone")
    monkeypatch.setitem(decode_floors.PATCHES, "twice", [("    if ", "    if ")])  # many copies
    with pytest.raises(RuntimeError, match="expected 1"):
        decode_floors.patched_source("twice")


def test_the_library_kernel_has_no_floor_switch():
    text = Path(decode_kernels.__file__).read_text()
    assert "floor" not in text.lower()


def test_fp8_floors_apply_to_fp8_caches_only():
    bf16, fp8 = Shape("decode", 4, 1024), Shape("decode", 4, 1024, kv_dtype="fp8")
    for name in ("floor_fp8mma", "floor_fp8mma_k"):
        assert tune_decode.applies(name, fp8) and not tune_decode.applies(name, bf16)
    for name in ("default", "floor_rows64", "floor_nomerge", "floor_mergecount", "floor_noloads"):
        assert tune_decode.applies(name, fp8) and tune_decode.applies(name, bf16)


def test_floor_variants_swap_the_split_kernel_and_restore_it():
    library = decode_launch.decode_split_kernel
    for floor in FLOORS:
        with tune_decode.variant(f"floor_{floor}"):
            assert decode_launch.decode_split_kernel is decode_floors.floor_kernel(floor)
        assert decode_launch.decode_split_kernel is library
    with tune_decode.variant("default"):
        assert decode_launch.decode_split_kernel is library


def test_sweep_rows_by_comma_separated_filters(monkeypatch):
    """``--sweep`` takes the sweep's paged decode rows; ``--filter`` lists several ids, comma-separated,
    or names one whole (a ragged id holds a comma)."""
    seen = []
    monkeypatch.setattr(tune_decode, "_run", lambda args, names, shapes: seen.append((names, shapes)) or 0)
    variants = "default,floor_fp8mma,floor_nomerge"
    assert tune_decode.main(["--sweep", "--filter", "sw36 ,sw49 ,sw07 ", "--variants", variants]) == 0
    names, shapes = seen.pop()
    assert names == variants.split(",")
    assert [s.label for s in shapes] == ["sw07", "sw36", "sw49"]
    assert [s.kv_dtype for s in shapes] == ["bfloat16", "fp8", "fp8"]
    assert tune_decode.main(["--sweep", "--filter", "ragged22x[1,88289]"]) == 0
    assert [s.label for s in seen.pop()[1]] == ["sw07"]
    assert tune_decode.main(["--filter", "64x8192"]) == 0  # the registry's shapes without --sweep
    assert all("64x8192" in s.id and not s.label for s in seen.pop()[1])


@pytest.mark.parametrize("kv_format", ["float16", "fp8"])
def test_floors_run_in_place_of_the_kernel(kv_format, kernel_device, triton_backend):
    """Each floor runs where the variant puts it (Triton's interpreter on the CPU): ``rows64``
    computes the library's output (the padded rows are masked), the fp8 floors an approximation
    (e4m3 Q and P), ``noloads`` something else (constant K / V); ``nomerge`` / ``mergecount`` leave
    the split launch's output unwritten."""
    import torch

    from kvattn.decode import xqa_batch_decode_with_kv_cache
    from kvattn.testing import make_paged_kv

    dtype = torch.float16  # (the interpreter has no bfloat16 arithmetic)
    cache = make_paged_kv([40, 300], num_kv_heads=2, head_dim=64, page_size=16, dtype=dtype,
                          kv_format=None if kv_format == "float16" else kv_format, nan_fill=False,
                          device=kernel_device)
    q = torch.randn(2, 16, 64, dtype=dtype, device=kernel_device)
    shape = Shape("decode", 2, 300, kv_dtype="bfloat16" if kv_format == "float16" else kv_format)

    def call():
        return xqa_batch_decode_with_kv_cache(
            query=q, kv_cache=cache.kv_cache, block_tables=cache.block_tables, seq_lens=cache.seq_lens,
            max_seq_len=300, workspace_buffer=torch.zeros(1 << 22, dtype=torch.uint8, device=kernel_device),
            bmm1_scale=64 ** -0.5).float()

    from kvattn.ops.decode import configs as decode_configs

    with tune_decode.variant("default"), decode_configs.override(keys_in_m=False):
        want = call()  # the rows-in-M kernel, which every floor patches
    got = {}
    for floor in FLOORS:
        name = f"floor_{floor}"
        if tune_decode.applies(name, shape):
            with tune_decode.variant(name):
                got[floor] = call()
    assert set(got) == set(FLOORS) - ({"fp8mma", "fp8mma_k"} if kv_format == "float16" else set())
    if kernel_device.type == "cpu":
        assert torch.equal(got["rows64"], want)
    else:
        # compiled, a 64-row tile may take another product instruction (wgmma against mma.sync),
        # which sums in another order: equal to the output's rounding
        err = ((got["rows64"] - want).norm() / want.norm()).item()
        assert err < 2e-3, err
    for floor in ("fp8mma", "fp8mma_k"):
        if floor in got:
            err = ((got[floor] - want).norm() / want.norm()).item()
            assert 0 < err < 0.3, (floor, err)
    assert not torch.allclose(got["noloads"], want, atol=1e-2)


# ---------------------------------------------------------------------------------------------
# sm_90a compiles: 16 query heads over 2 KV heads, D 128, pages of 16, an fp8 (e4m3) cache read as
# words (the launcher's code on aligned caches), the sm90 main table's tile, split with the
# in-kernel merge (8 rows a KV head: MERGE_ROWS 8, MERGE_BLOCK_S 2 at 4 warps)
# ---------------------------------------------------------------------------------------------
PTRS = {"k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32", "kv_start_ptr": "*i32",
        "mask_ptr": "*i16", "sinks_ptr": "*fp32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32",
        "lse_ptr": "*fp32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "counter_ptr": "*i32", "k_sf_ptr": "*u8",
        "v_sf_ptr": "*u8", "k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv"}
FLOATS = ("logit_factor", "out_factor", "soft_cap_value", "rope_theta", "rope_scale")
LIBRARY = "kvattn.ops.decode.kernels.decode_split_kernel"


def _fp8_plan_ptx(kernel: str) -> str:
    from kvattn._formats_table import BY_NAME
    from kvattn.ops.decode import configs

    from tests.ops.sm90 import compile_sm90

    cfg = configs.config("sm90", "fp8", 128, 16, False, "main")
    constexprs = dict(
        HEAD_DIM=128, PAGE_SIZE=16, NUM_KV_HEADS=2, GROUP=8, Q_LEN=1, BLOCK_M=16, BLOCK_N=cfg.block_n, M_BLOCKS=1,
        KEYS_IN_M=False,
        KV_FORMAT=BY_NAME["fp8"].words_code, PAGED=True, SAME_TABLE=True, HAS_WINDOW=False, HAS_MASK=False,
        HAS_SINKS=False, LOGIT_PTR=False, OUT_PTR=False, OUT_FP8=False, STORE_LSE=False, ROPE=False, ALIBI=False,
        SOFT_CAP=False, USE_DOT=True, PAGE_AHEAD=cfg.page_ahead, PREFETCH=0, KV_EVICT_FIRST=cfg.evict_first,
        KV_TMA=False, MERGE=True, MERGE_ROWS=8, MERGE_BLOCK_S=2, PERSISTENT=False, USE_PDL=True,
        HAS_KV_START=False, SPLIT_SPAN=0, BALANCED=False, BLOCK_B=1, MIN_CHUNK=0, DEAL_SLOT=0, LANES=False, LANE_CAP=0,
        PAGE_OFFSETS=2, PAGE_RUNS=False)
    got = compile_sm90(kernel, constexprs, ptrs=PTRS, floats=FLOATS, warps=cfg.num_warps, stages=cfg.num_stages,
                       tuples=decode_kernels.SPLIT_TUPLES)
    return got["ptx"]


def _facts(ptx: str) -> dict:
    count = lambda pattern: len(re.findall(pattern, ptx))  # noqa: E731
    return {
        "to_f16": count(r"cvt\.rn\.f16x2\.e4m3x2"),  # fp8 -> float16 conversions, a pair each
        "to_e4m3": count(r"cvt\.rn\.satfinite\.e4m3x2\.f32"),
        "mma_f16": count(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32"),
        "wgmma_f16": count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16"),
        "wgmma_e4m3": count(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3"),
        "cp_async": count(r"cp\.async\.c[ag]"),
        "atomics": count(r"atom\.global"),
        "merge_loads": count(r"ld\.global\.cg"),  # the merge's partial loads skip L1
        "other_loads": count(r"ld\.global(?!\.cg)"),  # the page ids, the query, the length
        "lines": len(ptx.splitlines()),
    }


@pytest.fixture(scope="module")
def fp8_facts():
    """PTX facts of the library's kernel and of each floor at the fp8 plan (compiled once)."""
    from tests.ops.sm90 import skip_unless_gpu_verified

    facts = {"library": _facts(_fp8_plan_ptx(LIBRARY))}
    for floor in FLOORS:
        facts[floor] = _facts(_fp8_plan_ptx(f"benchmarks.decode_floors.floor_kernel_{floor}"))
    # (every floor compiled above; the counts below are those of the GPU-verified Tritons)
    skip_unless_gpu_verified("the floors' instruction counts were read under Triton 3.6")
    return facts


@pytest.mark.codegen
def test_library_fp8_kernel_converts_every_value(fp8_facts):
    """The reference: 16-row tiles on mma.sync over float16, 128 conversions a 128-key tile
    (K and V, D 128: 2 x 128 x 128 bytes over 128 threads, a pair each)."""
    lib = fp8_facts["library"]
    assert lib["to_f16"] == 128 and lib["mma_f16"] == 64 and lib["wgmma_e4m3"] == 0
    assert lib["atomics"] == 2 and lib["merge_loads"] > 0


@pytest.mark.codegen
def test_fp8mma_floor_takes_every_product_to_fp8_wgmma_without_conversions(fp8_facts):
    """fp8mma: no fp8 -> float16 conversion left; both products e4m3 wgmma (64-row tiles), P and
    Q rounded to e4m3; its reference rows64 keeps all 128 conversions on float16 wgmma."""
    floor, ref = fp8_facts["fp8mma"], fp8_facts["rows64"]
    assert floor["to_f16"] == 0 and floor["to_e4m3"] > 0
    assert floor["wgmma_e4m3"] == 8 and floor["wgmma_f16"] == 0 and floor["mma_f16"] == 0
    assert ref["to_f16"] == 128 and ref["wgmma_f16"] == 16 and ref["wgmma_e4m3"] == 0
    # V is not copied asynchronously: Triton loads it into registers and transposes it into shared
    # memory for the K-major wgmma operand (documented in decode_floors.py)
    assert floor["cp_async"] < ref["cp_async"]


@pytest.mark.codegen
def test_fp8mma_k_floor_takes_only_the_key_conversions_out(fp8_facts):
    """fp8mma_k: Q.K^T on e4m3 wgmma with K copied as stored (the reference's cp.async pipeline),
    P.V as the reference's: half the conversions (V's) remain."""
    floor, ref = fp8_facts["fp8mma_k"], fp8_facts["rows64"]
    assert floor["to_f16"] == ref["to_f16"] // 2 == 64
    assert floor["wgmma_e4m3"] == 4 and floor["wgmma_f16"] == ref["wgmma_f16"] // 2 == 8
    assert floor["cp_async"] == ref["cp_async"]


@pytest.mark.codegen
def test_merge_floors_drop_the_merge(fp8_facts):
    """nomerge: no arrival count, no partial loads; mergecount: the count (add and reset) without
    the partial loads; both keep the tile loop's conversions and products."""
    lib, none, count = fp8_facts["library"], fp8_facts["nomerge"], fp8_facts["mergecount"]
    assert none["atomics"] == 0 and none["merge_loads"] == 0
    assert count["atomics"] == lib["atomics"] == 2 and count["merge_loads"] == 0
    assert none["lines"] < count["lines"] < lib["lines"]
    for got in (none, count):
        assert got["to_f16"] == lib["to_f16"] and got["mma_f16"] == lib["mma_f16"]


@pytest.mark.codegen
def test_noloads_floor_keeps_the_products(fp8_facts):
    """noloads: no K / V copies and no conversions, the page-id loads and every product kept (the
    compiler does not fold the products of the constant tiles)."""
    floor, lib = fp8_facts["noloads"], fp8_facts["library"]
    assert floor["cp_async"] == 0 and lib["cp_async"] > 0
    assert floor["to_f16"] == 0
    assert floor["mma_f16"] == lib["mma_f16"] == 64
    assert floor["merge_loads"] == lib["merge_loads"]
    assert floor["other_loads"] > 0
