"""``benchmarks/timeline.py``: per-program and per-unit timelines of decode launches from an
instrumented copy of the decode kernels.

On the CPU: the text patches apply to the current kernels (each once) and the patched modules
import; rows are selected as ``tune_decode.py --sweep`` selects them; the host's mirror of the
balanced plan cuts every key into exactly one unit; the summary's arithmetic on a synthetic trace;
the plan estimate of sw07 on a faked H200. Codegen (sm_90a, no GPU): the instrumented launches
of sw07 (balanced) and sw57 (uniform split) and the combine kernel compile, with the timer reads
and the trace stores in their PTX and the library's shared memory (so as many programs an SM).
"""

from __future__ import annotations

import dataclasses

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import timeline  # noqa: E402
from kvattn.ops.common import combine as common_combine  # noqa: E402
from kvattn.ops.decode import kernels as decode_kernels  # noqa: E402

from tests.ops.oracle import ON_GPU  # noqa: E402


def test_every_patch_applies_once_and_the_modules_import():
    for module, patches in ((decode_kernels, timeline.kernel_patches(timeline.FAKE_ADDR)),
                            (common_combine, timeline.combine_patches(timeline.FAKE_ADDR))):
        text = Path(module.__file__).read_text()
        for old, new in patches:
            assert text.count(old) == 1, (module.__name__, old)
            assert old != new
    kernels, combine = timeline.instrumented_modules()
    assert kernels.__name__ == "kvattn.ops.decode.kernels_timeline"
    assert combine.__name__ == "kvattn.ops.common.combine_timeline"
    split = timeline.instrumented_kernel
    assert split is kernels.decode_split_kernel and split is not decode_kernels.decode_split_kernel
    assert split.arg_names == decode_kernels.decode_split_kernel.arg_names
    assert timeline.instrumented_combine.arg_names == common_combine.decode_combine_kernel.arg_names
    assert f"TRACE_ADDR = tl.constexpr({timeline.FAKE_ADDR})" in timeline.patched_sources()[0]


def test_a_moved_text_fails_loudly(monkeypatch):
    real = timeline.kernel_patches
    monkeypatch.setattr(timeline, "kernel_patches", lambda addr: real(addr) + [("    not in the kernel\n", "")])
    with pytest.raises(RuntimeError, match="0 copies.*benchmarks/timeline.py"):
        timeline.patched_sources()


def test_the_swap_is_undone():
    from kvattn.ops.decode import plan as decode_launch

    library = decode_launch.decode_split_kernel, decode_launch.decode_combine_kernel
    with timeline.instrumented(timeline.FAKE_ADDR):
        assert decode_launch.decode_split_kernel is timeline.instrumented_kernel
        assert decode_launch.decode_combine_kernel is timeline.instrumented_combine
    assert (decode_launch.decode_split_kernel, decode_launch.decode_combine_kernel) == library


def test_rows_as_tune_decode_selects_them():
    args = timeline.parse_args(["--sweep", "--filter", "sw07 ,sw12 ", "--no-readers"])
    assert [s.label for s in args.rows] == ["sw07", "sw12"] and args.no_readers and not args.plan
    args = timeline.parse_args(["--sweep", "--filter", "sw07 ,sw12 ,sw54 ,sw57 ", "--reps", "5"])
    assert [s.label for s in args.rows] == ["sw07", "sw12", "sw54", "sw57"] and args.reps == 5
    assert [s.label for s in timeline.parse_args(["--sweep", "--filter", "ragged22x[1,88289]"]).rows] == ["sw07"]
    assert all("sw" not in s.id for s in timeline.parse_args(["--filter", "32768"]).rows)  # the registry's rows
    assert timeline.parse_args(["--plan", "--sweep", "--filter", "sw07 "]).plan
    with pytest.raises(SystemExit):
        timeline.parse_args(["--sweep", "--filter", "no such row"])
    with pytest.raises(SystemExit):
        timeline.parse_args(["--sweep", "--filter", "sw07 ", "--variants", "floor_nomerge"])


def test_host_units_cut_every_key_once():
    """The host's mirror of the balanced plan: a ragged batch's units of one chunk length (capped
    a request), each request's keys in ``split_bounds`` pieces; an equal batch keeps the splits."""
    lens = [1, 700, 5000, 88289, 40000, 0]
    kw = dict(target=1056, cap=32, min_chunk=512, block_n=64)
    units, chunk = timeline.host_units(lens, capacity=88304, splits=6, **kw)
    # ragged (88289 x 6 x 4 > 5 x 133990): chunk = max(133990 / 1056, 88289 / 32) = 2760 keys,
    # rounded up to whole 64-key tiles
    assert chunk == 2816
    assert [sum(u[0] == b for u in units) for b in range(len(lens))] == [1, 1, 2, 32, 15, 1]
    assert [u[3] for u in units if u[0] == 2] == [2560, 2440]  # 5000 keys in 2: 40 tiles, then the rest
    for b, n in enumerate(lens):
        mine = [u for u in units if u[0] == b]
        assert sum(u[3] for u in mine) == n and [u[1] for u in mine] == list(range(len(mine)))
    equal, none = timeline.host_units([4096] * 8, capacity=4096, splits=3, **kw)
    assert none is None and len(equal) == 24 and {u[2] for u in equal} == {3}


def _synthetic():
    """4 programs on 2 SMs (0: p0, p2; 1: p1, p3), 6 units of two requests (b0: 4 chunks, b1: 2),
    times in ns from 1_000_000; p0 runs three units and merges b0."""
    import torch

    tr = torch.full((timeline.TRACE_SLOTS,), -1, dtype=torch.int64)
    base = 1_000_000
    progs = {0: (0, 0, 100_000), 1: (1, 0, 60_000), 2: (0, 1_000, 50_000), 3: (1, 1_000, 90_000)}
    for pid, (sm, start, end) in progs.items():
        at = timeline.PROG_AT + pid * timeline.PROG_SLOTS
        tr[at: at + 4] = torch.tensor([sm, base + start, base + start + 500, base + end])
    # item: (pid, b, split, n_splits, keys, claim, stored)
    units = {0: (0, 0, 0, 4, 1000, 0, 40_000), 1: (1, 0, 1, 4, 1000, 0, 30_000),
             2: (2, 0, 2, 4, 1000, 1_000, 50_000), 3: (3, 0, 3, 4, 1000, 1_000, 40_000),
             4: (1, 1, 0, 2, 500, 30_000, 60_000), 5: (0, 1, 1, 2, 500, 40_000, 80_000)}
    for item, (pid, b, split, n, keys, claim, stored) in units.items():
        at = timeline.ITEM_AT + item * timeline.ITEM_SLOTS
        tr[at: at + 8] = torch.tensor([pid, b, split, n, 100, 100 + keys, base + claim, base + stored])
    # b0's last unit to finish is item 2 (p2, at 50 us): it merges 50-52 us; b1's is item 5 (p0): 80-95 us
    for item, (s, e) in {2: (50_000, 52_000), 5: (80_000, 95_000)}.items():
        at = timeline.MERGE_AT + item * timeline.MERGE_SLOTS
        tr[at: at + 2] = torch.tensor([base + s, base + e])
    tr[timeline.MARK_AT] = base - 4_000
    return tr


def test_summary_arithmetic_on_a_synthetic_trace():
    rec = timeline.parse_trace(_synthetic(), item_decode=(1, 1))
    assert [p["pid"] for p in rec["programs"]] == [0, 1, 2, 3] and len(rec["units"]) == 6
    s = timeline.summarise(rec, bpk=512)
    assert s["programs"] == 4 and s["sms"] == 2 and s["max_per_sm"] == 2
    assert s["span_us"] == 100.0 and s["start_spread_us"] == 1.0 and s["mark_to_start_us"] == 4.0
    # SM 0: [0, 100] -> 1.0; SM 1: [0, 60] U [1, 90] = [0, 90] -> 0.9
    assert s["sm_busy"] == {"0": 1.0, "1": 0.9} and s["sm_busy_mmm"] == [0.9, 0.95, 1.0]
    # ends 50, 60, 90, 100: median 75, the last 25 us after it, alone after 90 for 10 us
    assert s["median_end_us"] == 75.0 and s["tail_after_median_us"] == 25.0 and s["last_alone_us"] == 10.0
    assert s["units"] == 6 and s["units_per_program"] == [1, 1.5, 2]
    assert s["unit_us"] == [30.0, 39.5, 49.0] and s["last_claim_us"] == 40.0
    assert s["unit_gbps"][2] == pytest.approx(1000 * 512 / 30_000)  # 1000 keys in 30 us
    c = s["critical"]  # p0: item 0 (0-40), item 5 (40-80, then merge to 95): a chain of 95 us
    assert c["pid"] == 0 and c["sm"] == 0 and c["chain_us"] == 95.0
    assert c["work_us"] == 80.0 and c["merge_us"] == 15.0 and c["gaps_us"] == 0.0 and c["end_us"] == 100.0
    assert [(u["b"], u["split"], u["keys"]) for u in c["units"]] == [(0, 0, 1000), (1, 1, 500)]
    assert s["merges"]["0.0"] == {"pid": 2, "n_splits": 4, "start_us": 50.0, "us": 2.0}
    assert s["merge_us_max"] == 15.0 and s["last_merge_end_us"] == 95.0

    runs = [s, {**s, "span_us": 90.0}, {**s, "span_us": 120.0}]
    med = timeline.combine_replays(runs)
    assert med["span_us"] == 100.0 and med["spans_us"] == [100.0, 90.0, 120.0] and med["replays"] == 3
    assert med["detail"]["critical"]["pid"] == 0 and med["units_per_program"] == [1, 1.5, 2]
    text = timeline.summary_text("synthetic", med)
    for piece in ("span 100.0 us", "0.900 / 0.950 / 1.000", "last 25.0 us later, alone for 10.0",
                  "a program min / median / max 1/1.5/2", "program 0 (SM 0), 2 units, chain 95.0 us",
                  "b1.1/2 500k 40.0+m15.0", "merges: 2, longest 15.00 us"):
        assert piece in text, (piece, text)


def test_the_estimate_of_evenly_sized_units():
    """8 units of 1000 keys and 2 of 500 over 4 programs on 2 SMs: the copy bound, the largest
    unit, and both deal models in u (the copy time of the mean unit at an SM's share)."""
    units = [(b, 0, 1, 1000) for b in range(8)] + [(8, 0, 1, 500), (9, 0, 1, 500)]
    facts = {"programs": 4, "num_kv_heads": 1, "m_blocks": 1}
    est = timeline.estimate(units, facts, 512, sms=2, bandwidth=2 * 512e6)  # an SM: 1000 keys in 1000 us
    assert est["units"] == est["items"] == 10 and est["items_per_program_even"] == 2.5
    assert est["keys_mean"] == 900 and est["u_us"] == pytest.approx(900.0)
    assert est["copy_us"] == pytest.approx(4500.0) and est["largest_at_sm_share_us"] == pytest.approx(1000.0)
    assert est["sm_model_us"] == pytest.approx(4500.0)  # per SM: 4 x 1000, then one of 500
    assert est["program_model_us"] == pytest.approx(5000.0)  # 2 rounds of 2000, then 1000 for the 500-key units
    assert est["keys_hist"][0] == (1000, 8)


def test_host_lanes_cut_every_key_once():
    """The host's mirror of the lanes plan: every key of every request in one unit, a request's
    units numbered in order, each lane within one share of tiles (plus a partial last tile)."""
    lens = [1, 88289, 7, 40000, 2, 0, 12000, 1]
    units, lane_keys = timeline.host_lanes(lens, capacity=1 << 20, lanes=33, cap=32, min_chunk=512, block_n=64)
    assert sum(k for *_, k in units) == sum(lens) == sum(lane_keys)
    for b in range(len(lens)):
        mine = [(s, n) for bb, s, n, _ in units if bb == b]
        assert [s for s, _ in mine] == list(range(mine[0][1])), (b, mine)
    assert max(lane_keys) <= -(-sum(-(-n // 64) + 2 for n in lens) // 33) * 64


@pytest.mark.skipif(ON_GPU, reason="the plan of a faked sm90 GPU, built from CPU tensors under the interpreter")
def test_sw07_plan_on_a_faked_h200():
    """sw07's launch on the faked H200 is the balanced one over two programs an SM, in lanes, and
    its units (the host's mirror) hold every key of the row once; the lanes' static span is under
    the deal models'."""
    (shape,) = timeline.select_rows(True, ["sw07 "])
    facts = timeline.launch_facts(timeline.faked_h200_launch(shape))
    assert facts["balanced"] and facts["lanes"] and facts["programs"] == 2 * timeline.H200_SMS
    units = timeline.plan_units(shape, facts)
    assert sum(k for *_, k in units) == sum(shape.seq_lens())
    _, lane_keys = timeline.plan_lanes(shape, facts)
    est = timeline.estimate(units, facts, timeline.bytes_per_key(shape), lane_keys=lane_keys)
    assert est["copy_us"] <= est["sm_model_us"] <= est["program_model_us"]
    assert est["lanes_model_us"] < est["program_model_us"]
    assert timeline.bytes_per_key(shape) == 512


# ---------------------------------------------------------------------------------------------
# sm_90a compiles
# ---------------------------------------------------------------------------------------------
PTRS = {"k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32", "kv_start_ptr": "*i32",
        "mask_ptr": "*i16", "sinks_ptr": "*fp32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32",
        "lse_ptr": "*fp32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "counter_ptr": "*i32", "k_sf_ptr": "*u8",
        "v_sf_ptr": "*u8"}  # q, k, v, out: bf16
FLOATS = ("logit_factor", "out_factor", "soft_cap_value", "rope_theta", "rope_scale")
LIBRARY = "kvattn.ops.decode.kernels.decode_split_kernel"
INSTRUMENTED = "benchmarks.timeline.instrumented_kernel"


def _facts(got: dict) -> dict:
    ptx = got["ptx"]
    return {"timer": len(re.findall(r"mov\.u64 %rd\d+, %globaltimer;", ptx)),
            "smid": len(re.findall(r"%smid", ptx)),
            "b64_stores": len(re.findall(r"st\.global\.b64", ptx)),
            # the trace buffer's address (or an address in it, the region's offset folded in) as a literal
            "addr": any(0 <= int(n) - timeline.FAKE_ADDR < timeline.TRACE_SLOTS * 8
                        for n in re.findall(r"\b\d{12,}\b", ptx)),
            "shared": got["shared"], "reg": got.get("reg")}


@pytest.mark.skipif(ON_GPU, reason="the plan of a faked sm90 GPU, built from CPU tensors under the interpreter")
def test_fp8_rows_plan_on_a_faked_h200():
    """An fp8 row (sw36: 24 x 48740, pages of 16, 64/8 heads) takes the fp8 main table's tiles
    (128 keys, 4 warps, 3 stages), which ``decode_sass_counts.py`` compiles; a 4-bit cache is refused."""
    (shape,) = timeline.select_rows(True, ["sw36 "])
    split = timeline.faked_h200_launch(shape)
    assert (split.constexprs["BLOCK_N"], split.options["num_warps"], split.options["num_stages"]) == (128, 4, 3)
    nvfp4 = dataclasses.replace(shape, kv_dtype="nvfp4")
    with pytest.raises(ValueError, match="16-bit and fp8"):
        timeline.faked_h200_launch(nvfp4)


@pytest.mark.codegen
@pytest.mark.skipif(ON_GPU, reason="the plan of a faked sm90 GPU, built from CPU tensors under the interpreter")
@pytest.mark.parametrize("label,balanced", [("sw07", True), ("sw57", False)])
def test_instrumented_launch_compiles_for_sm90(label, balanced):
    """The row's launch on the faked H200, compiled from the library's and the instrumented
    source: the instrumented PTX reads ``%globaltimer`` 5 times (entry, after the wait, a unit's
    claim and store, the end) and twice more with the in-kernel merge (its start and end),
    ``%smid`` once, and stores 12 int64 records to the trace buffer (a unit's 8, a program's 4)
    and the merge's 2, at the fake address; the library's PTX none of these; the shared memory is
    the library's (as many programs an SM). sw57 (streaming tiles) keeps the uniform split."""
    from tests.ops.sm90 import compile_sm90

    (shape,) = timeline.select_rows(True, [f"{label} "])
    split = timeline.faked_h200_launch(shape)
    assert bool(split.constexprs["BALANCED"]) is balanced

    def compiled(kernel):
        return _facts(compile_sm90(kernel, dict(split.constexprs), ptrs=PTRS, floats=FLOATS,
                                   warps=split.options["num_warps"], stages=split.options["num_stages"],
                                   tuples=decode_kernels.SPLIT_TUPLES))

    lib, inst = compiled(LIBRARY), compiled(INSTRUMENTED)
    assert lib["timer"] == 0 and lib["smid"] == 0 and not lib["addr"]
    merge = 2 if split.constexprs["MERGE"] else 0
    assert balanced <= bool(merge)
    assert inst["timer"] == 5 + merge and inst["smid"] == 1 and inst["addr"]
    assert inst["b64_stores"] - lib["b64_stores"] == 12 + merge
    assert inst["shared"] == lib["shared"]


@pytest.mark.codegen
def test_instrumented_combine_compiles_for_sm90():
    from tests.ops.sm90 import compile_sm90

    got = compile_sm90("benchmarks.timeline.instrumented_combine",
                       dict(NUM_HEADS=64, HEAD_DIM=128, BLOCK_S=16, HAS_SINKS=False, OUT_PTR=False, OUT_FP8=False,
                            STORE_LSE=False, USE_PDL=True),
                       ptrs={"part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "sinks_ptr": "*fp32",
                             "out_scale_ptr": "*fp32", "lse_ptr": "*fp32"}, floats=("out_factor",))
    facts = _facts(got)
    assert facts["timer"] == 3 and facts["smid"] == 1 and facts["addr"] and facts["b64_stores"] == 4
