"""The decode config tables and the rules that pick among them (host code only, no kernels)."""

from __future__ import annotations

import dataclasses

import pytest

from kvattn.ops.decode import configs as dc

SMS = 132  # an H100 SXM


def long_tiles(items, page_size=16, *, arch="sm90", fmt="bfloat16", head_dim=128, block_m=16, rope=False):
    return dc.wants_long_tiles(arch, fmt, head_dim, block_m, rope, page_size=page_size, items=items, sm_count=SMS)


@pytest.mark.parametrize(
    "items,page_size,expected",
    [
        (8, 16, True),  # 1 x 32768, Hkv 8: the sequence is split to fill one wave
        (128, 16, True),  # 16 x 4096
        (132, 16, True),  # exactly one wave of long programs
        (133, 16, False),
        (256, 16, False),  # 32 x 4096: long tiles would run ~2 waves of 8-warp programs
        (1024, 16, False),
        (8, 64, True),
        (1024, 64, True),  # a tile spans two whole pages
        (2048, 128, True),
        (1024, 32, False),
    ],
    ids=lambda v: str(v),
)
def test_long_tiles_sm90_bf16_d128(items, page_size, expected):
    assert long_tiles(items, page_size) is expected


@pytest.mark.parametrize(
    "overrides",
    [dict(rope=True), dict(block_m=32), dict(fmt="fp8"), dict(head_dim=64), dict(arch="default"),
     dict(arch="interpreter")],
    ids=["rope", "block_m32", "fp8", "D64", "non-hopper", "interpreter"],
)
@pytest.mark.parametrize("items,page_size", [(8, 16), (1024, 64)], ids=["few-items", "p64"])
def test_long_tiles_only_where_measured(overrides, items, page_size):
    assert long_tiles(items, page_size, **overrides) is False


def test_configs_come_from_their_tables():
    main = dc.config("sm90", "bfloat16", 128, 16, False)
    assert (main.block_n, main.num_warps, main.num_stages) == (64, 4, 4)
    long = dc.config("sm90", "float16", 128, 16, False, "long")
    assert (long.block_n, long.num_warps, long.num_stages) == (128, 8, 3)
    # GPUs without their own table fall back to the default one
    assert dc.config("sm80", "bfloat16", 128, 16, False).num_stages == 2


@pytest.mark.parametrize(
    "page_size,overrides,expected",
    [(64, {}, True), (128, {}, True), (16, {}, False), (32, {}, False), (64, dict(rope=True), False),
     (64, dict(block_m=32), False), (64, dict(fmt="fp8"), True), (16, dict(fmt="fp8"), True),
     (16, dict(fmt="nvfp4"), False), (64, dict(head_dim=64), False), (64, dict(arch="default"), False),
     (64, dict(arch="interpreter"), False)],
    ids=["p64", "p128", "p16", "p32", "p64-rope", "p64-block_m32", "p64-fp8", "p16-fp8", "p16-nvfp4", "p64-D64",
         "p64-non-hopper", "p64-interpreter"],
)
def test_short_tiles_where_measured(page_size, overrides, expected):
    """16-bit caches on pages of 64+ tokens and fp8 on any page (H100 measurements)."""
    kw = dict(arch="sm90", kv_format="bfloat16", head_dim=128, block_m=16, rope=False)
    kw.update({("kv_format" if k == "fmt" else k): v for k, v in overrides.items()})
    assert dc.has_short_tiles(kw.pop("arch"), *kw.values(), page_size=page_size) is expected


def test_short_configs_put_more_programs_on_an_sm():
    short = dc.config("sm90", "bfloat16", 128, 16, False, "short")
    assert (short.block_n, short.num_warps, short.num_stages) == (64, 4, 3)
    assert dc.occupancy(short, "bfloat16", 128, False) == 3
    fp8 = dc.config("sm90", "fp8", 128, 16, False, "short")
    assert dc.occupancy(fp8, "fp8", 128, False) == 4 > dc.occupancy(dc.config("sm90", "fp8", 128, 16, False), "fp8",
                                                                     128, False)
    assert dc.SHORT_SPAN == 1024


def test_split_count_fills_whole_waves():
    long = dc.config("sm90", "bfloat16", 128, 16, False, "long")
    assert dc.occupancy(long, "bfloat16", 128, False) == 1
    kw = dict(kv_format="bfloat16", head_dim=128, rope_query=False, sm_count=SMS, fit=64, max_programs=None)
    assert dc.num_splits(long, items=8, span=32768, **kw) == 16  # 128 programs on 132 SMs
    assert dc.num_splits(long, items=128, span=4096, **kw) == 1
    # short spans never split below min_chunk keys; the workspace and xqa's sm_count cap the count
    assert dc.num_splits(long, items=8, span=600, **kw) == 3
    assert dc.num_splits(long, items=8, span=32768, **{**kw, "fit": 5}) == 5
    assert dc.num_splits(long, items=8, span=32768, **{**kw, "max_programs": 40}) == 5


@pytest.mark.parametrize("items,span,expected", [
    (176, 24305, 3),  # a wave and a third (0.67 full): 3 splits fill 4 whole waves
    (80, 49133, 8),  # 80 items on 132 slots (0.61): 640 programs, 5 waves 0.97 full
    (408, 11629, 6),  # 4 waves 0.77 full: one program an SM takes the tail past TAIL_WAVES (0.98)
    (114, 26788, 8),  # one wave 0.86 full, above TAIL_FILL: one program an SM still moves (0.99)
    (128, 4096, 1),  # 0.97 full: the whole-wave rule
    (80, 700, 3),  # min_chunk caps the count the tail may take
], ids=["176-items", "80-items", "408-items", "114-items", "128-items", "80-items-short-span"])
def test_split_count_fills_the_last_wave(items, span, expected):
    long = dc.config("sm90", "bfloat16", 128, 16, False, "long")
    kw = dict(kv_format="bfloat16", head_dim=128, rope_query=False, sm_count=SMS, fit=64, max_programs=None)
    assert dc.num_splits(long, items=items, span=span, **kw) == expected
    whole_waves = dataclasses.replace(long, tail_splits=0)  # (other GPUs' tables: unmeasured, off)
    assert dc.config("default", "bfloat16", 128, 16, False).tail_splits == 0
    assert dc.num_splits(whole_waves, items=items, span=span, **kw) == min(max(1, SMS // items), -(-span // 256))
    fill = dc.wave_fill(items, SMS, expected)
    assert fill >= dc.wave_fill(items, SMS, 1)


def test_a_workspace_without_room_for_partials_keeps_one_split():
    """(A workspace with room for no partial: ``fit`` 0. The last-wave rule once divided by the
    zero splits it got; the GPU case ``fp16-tiny-workspace-no-split`` found it.)"""
    long = dc.config("sm90", "bfloat16", 128, 16, False, "long")
    kw = dict(kv_format="bfloat16", head_dim=128, rope_query=False, sm_count=SMS, max_programs=None)
    assert dc.num_splits(long, items=2, span=20000, fit=0, **kw) == 1


@pytest.mark.parametrize("items,slots,splits,per_sm,expected", [
    (408, 132, 1, 1, True),  # long tiles, 4 waves 0.77 full
    (114, 132, 1, 1, True),  # long tiles, one wave 0.86 full
    (132, 132, 1, 1, False),  # every slot busy
    (2048, 396, 1, 3, False),  # short tiles, 5.2 waves 0.86 full: the block scheduler evens them out
    (408, 396, 1, 3, True),  # 2 waves 0.52 full
    (800, 396, 1, 3, False),  # 3 waves (0.67 full): past TAIL_WAVES
    (300, 396, 1, 3, True),  # one wave 0.76 full
    (340, 396, 1, 3, False),  # one wave 0.86 full: above TAIL_FILL
], ids=["long-408", "long-114", "long-full", "short-2048", "short-408", "short-800", "short-300", "short-340"])
def test_tail_fit_bounds_only_bind_shared_sms(items, slots, splits, per_sm, expected):
    """The last-wave search: every launch of one program an SM that leaves a slot idle, launches of
    two or more programs an SM only within TAIL_WAVES waves and under TAIL_FILL."""
    assert dc.wants_tail_fit(items, slots, splits, per_sm) is expected


def test_tail_fit_moves_only_for_four_points():
    assert dc.tail_fit(176, 132, 1, 16) == 3
    assert dc.tail_fit(131, 132, 1, 16) == 1  # 0.99 full already
    assert dc.tail_fit(176, 132, 1, 2) == 2  # the cap


@pytest.mark.parametrize("head_dim", [64, 128, 256], ids=lambda d: f"D{d}")
@pytest.mark.parametrize("block_m", [16, 32, 64], ids=lambda m: f"M{m}")
def test_nvfp4_never_takes_16_key_tiles_on_sm90(head_dim, block_m):
    """On an H100 (Triton 3.6) every NVFP4 case on the byte path (the one unaligned caches take)
    computed wrong results with 16-key tiles, with 1, 2 or 4 warps, while 32-key and longer tiles
    pass and the interpreter passes with 16 (lab/notes/formats.md "Formats: NVFP4 in decode"). No table
    entry may lead there."""
    for kind, tables in dc.KINDS.items():
        if ("nvfp4", head_dim) in tables.get("sm90", {}):
            assert dc.config("sm90", "nvfp4", head_dim, block_m, False, kind).block_n >= 32


@pytest.mark.parametrize("items,kind", [(8, "few"), (128, "few"), (SMS, "few"), (SMS + 1, "main"), (512, "main")],
                         ids=["1x32768", "16x4096", "one-an-SM", "past-one-an-SM", "64x8192"])
def test_nvfp4_d128_few_items_take_two_warp_tiles(items, kind):
    """Measured on an H100: NVFP4 D128 one-warp tiles win where every program gets a long split
    (64x8192 402 vs 488 us against (64, 2, 3)) and lose where items are few and splits short
    (16x4096 89 vs 75)."""
    few = dc.wants_few_item_tiles("sm90", "nvfp4", 128, 16, False, items=items, sm_count=SMS)
    assert few == (kind == "few")
    cfg = dc.config("sm90", "nvfp4", 128, 16, False, kind)
    assert (cfg.block_n, cfg.num_warps, cfg.num_stages) == ((64, 2, 3) if few else (32, 1, 3))
    # only NVFP4 D128 has the table; RoPE and other formats keep their rules
    assert not dc.wants_few_item_tiles("sm90", "bfloat16", 128, 16, False, items=8, sm_count=SMS)
    assert not dc.wants_few_item_tiles("sm90", "nvfp4", 64, 16, False, items=8, sm_count=SMS)
    assert not dc.wants_few_item_tiles("default", "nvfp4", 128, 16, False, items=8, sm_count=SMS)


@pytest.mark.parametrize("tile,head_dim,ptxas_regs,smem", [
    ((32, 1, 3), 64, 140, 10752), ((32, 2, 3), 64, 110, 11776), ((32, 1, 3), 128, 168, 21504),
    ((32, 2, 3), 128, 128, 22528), ((64, 2, 3), 128, 188, 40960), ((128, 4, 3), 128, 185, 77824),
    ((32, 2, 3), 256, 213, 44032),
], ids=["D64-t32w1", "D64-t32w2", "D128-t32w1", "D128-t32w2", "D128-t64w2", "D128-t128w4", "D256-t32w2"])
def test_nvfp4_occupancy_never_above_what_fits(tile, head_dim, ptxas_regs, smem):
    """The split count plans for ``occupancy`` programs an SM; NVFP4 kernels' registers and shared
    memory from ptxas (Triton 3.6, sm_90a, the words formats): the estimate may leave a slot idle
    but never plans more programs than fit (a second, partial wave)."""
    cfg = dc.DecodeConfig(*tile)
    regs = -(-ptxas_regs // 8) * 8  # allocated per thread in units of 8
    fits = min(228 * 1024 // (smem + 1024), 65536 // (regs * 32 * cfg.num_warps), 64 // cfg.num_warps)
    assert 1 <= dc.occupancy(cfg, "nvfp4", head_dim, False) <= fits


def test_rope_split_count_plans_two_programs_an_sm():
    """Measured on an H100: RoPE single decode (32 heads) ran 4-8 % faster with 3 stages and the
    split count of two programs an SM (8 splits) than with 4 stages and four (16 splits)."""
    rope = dc.config("sm90", "bfloat16", 128, 16, True)
    assert (rope.block_n, rope.num_warps, rope.num_stages, rope.max_per_sm) == (32, 4, 3, 2)
    assert dc.occupancy(rope, "bfloat16", 128, True) >= 4  # four fit; the cap, not shared memory, decides
    kw = dict(kv_format="bfloat16", head_dim=128, rope_query=True, sm_count=SMS, fit=64, max_programs=None)
    assert dc.num_splits(rope, items=32, span=32768, **kw) == 2 * SMS // 32
    assert dc.config("sm90", "bfloat16", 128, 16, False).max_per_sm == 0
    assert dc.config("default", "bfloat16", 128, 16, True).max_per_sm == 0


@pytest.mark.parametrize("arch,rope,expected", [("sm90", True, 1), ("sm90", False, 0), ("default", True, 0),
                                                ("interpreter", True, 0)],
                         ids=["sm90-rope", "sm90-none", "non-hopper-rope", "interpreter-rope"])
def test_l2_prefetch_only_for_rope_on_sm90(arch, rope, expected):
    """Measured on an H100: one prefetched tile helps RoPE single decode (its setup hides the
    fetch); NONE gained nothing. The interpreter cannot run the inline PTX at all."""
    assert dc.config(arch, "bfloat16", 128, 16, rope).prefetch == expected


def stream_tiles(items, *, arch="sm90", fmt="bfloat16", head_dim=128, block_m=16, rope=False):
    return dc.wants_stream_tiles(arch, fmt, head_dim, block_m, rope, items=items, sm_count=SMS)


@pytest.mark.parametrize("items,expected", [(8, True), (32, True), (66, True), (67, False), (128, False)],
                         ids=["1x32768", "single-h32", "half-wave", "over-half-wave", "16x4096"])
def test_stream_tiles_for_launches_that_split_every_item(items, expected):
    assert stream_tiles(items) is expected


@pytest.mark.parametrize(
    "overrides",
    [dict(rope=True), dict(block_m=32), dict(fmt="fp8"), dict(head_dim=64), dict(arch="default"),
     dict(arch="interpreter")],
    ids=["rope", "block_m32", "fp8", "D64", "non-hopper", "interpreter"],
)
def test_stream_tiles_only_where_measured(overrides):
    assert stream_tiles(8, **overrides) is False


def test_stream_config_is_unpipelined_and_carries_the_hint():
    """Triton 3.6 keeps an L2 eviction hint only on loads it does not software-pipeline."""
    stream = dc.config("sm90", "bfloat16", 128, 16, False, "stream")
    assert stream.num_stages == 1 and stream.evict_first
    for kind in ("main", "long", "short"):
        assert not dc.config("sm90", "bfloat16", 128, 16, False, kind).evict_first


def contig_tiles(*, arch="sm90", fmt="bfloat16", head_dim=128, block_m=16, rope=False, paged=False, rows=1):
    return dc.wants_one_row_tiles("contig", arch, fmt, head_dim, block_m, rope, paged=paged, rows=rows)


@pytest.mark.parametrize(
    "overrides,expected",
    [({}, True), (dict(rope=True), False), (dict(paged=True), False), (dict(rows=4), False), (dict(fmt="fp8"), False),
     (dict(head_dim=64), False), (dict(arch="default"), False), (dict(arch="interpreter"), False)],
    ids=["single-mha", "rope", "paged", "gqa-rows", "fp8", "D64", "non-hopper", "interpreter"],
)
def test_contig_tiles_only_where_measured(overrides, expected):
    """Measured on an H100 for single decode with one query head a KV head (16-bit, D 128)."""
    assert contig_tiles(**overrides) is expected


def test_contig_config_is_short_unpipelined_and_unhinted():
    contig = dc.config("sm90", "bfloat16", 128, 16, False, "contig")
    assert (contig.block_n, contig.num_warps, contig.num_stages, contig.evict_first) == (64, 4, 1, False)


@pytest.mark.parametrize(
    "batch,hkv,span,expected",
    [(1, 8, 32768, True), (4, 8, 8192, True), (8, 8, 8192, False), (1, 32, 4096, True), (1, 32, 32768, False)],
    ids=["1x32768", "4x8192", "8x8192", "single-4096", "single-32768"],
)
def test_stream_span_is_four_l2_sizes_of_kv(batch, hkv, span, expected):
    """H100: 50 MB of L2; bf16 D 128 rows are 256 bytes."""
    limit = dc.stream_span(batch=batch, num_kv_heads=hkv, row_bytes=256, l2_bytes=50 * 2**20)
    assert (span <= limit) is expected


def rope_stream_tiles(*, arch="sm90", fmt="bfloat16", head_dim=128, block_m=16, rope=True, paged=False, rows=1):
    return dc.wants_one_row_tiles("rope_stream", arch, fmt, head_dim, block_m, rope, paged=paged, rows=rows)


@pytest.mark.parametrize(
    "overrides,expected",
    [({}, True), (dict(fmt="float16"), True), (dict(rope=False), False), (dict(paged=True), False),
     (dict(rows=4), False), (dict(block_m=32), False), (dict(fmt="fp8"), False), (dict(head_dim=64), False),
     (dict(arch="default"), False), (dict(arch="interpreter"), False)],
    ids=["single-mha-rope", "fp16", "no-rope", "paged", "gqa-rows", "block_m32", "fp8", "D64", "non-hopper",
         "interpreter"],
)
def test_rope_stream_tiles_only_where_measured(overrides, expected):
    """Measured on an H100 for single decode with RoPE and one query head a KV head (16-bit, D 128)."""
    assert rope_stream_tiles(**overrides) is expected


def test_rope_stream_config_is_ropes_tiles_read_by_tma_with_the_hint():
    """RoPE's own tiles (32 keys, 4 warps, 3 stages, the first tile prefetched, two programs an SM
    planned), pipelined, their copies by TMA with the L2 hint; no other table asks for TMA."""
    rope = dc.config("sm90", "bfloat16", 128, 16, True)
    stream = dc.config("sm90", "bfloat16", 128, 16, True, "rope_stream")
    assert (stream.block_n, stream.num_warps, stream.num_stages) == (rope.block_n, rope.num_warps, rope.num_stages)
    assert (stream.block_n, stream.num_warps, stream.num_stages) == (32, 4, 3)
    assert (stream.prefetch, stream.max_per_sm) == (rope.prefetch, rope.max_per_sm) == (1, 2)
    assert stream.tma and stream.evict_first and not rope.tma and not rope.evict_first
    for kind in ("main", "long", "short", "stream", "contig"):
        assert not dc.config("sm90", "bfloat16", 128, 16, False, kind).tma


@pytest.mark.parametrize("table,items,pays", [
    ("main", 1024, True),  # two programs an SM, 3.9 waves (ragged 128 requests x 8 heads)
    ("main", 3584, False),  # 6.8 waves: the block scheduler balances them
    ("long", 128, True),  # one program an SM, one wave (a few long requests)
    ("long", 1024, False),  # one program an SM over several waves
], ids=["main-1024-items", "main-3584-items", "long-128-items", "long-1024-items"])
def test_balanced_split_only_where_it_was_measured_to_pay(table, items, pays):
    cfg = dc.config("sm90", "bfloat16", 128, 16, False, table)
    assert dc.balance_pays(cfg, items=items, sm_count=132, kv_format="bfloat16", head_dim=128,
                                       rope_query=False) is pays


@pytest.mark.parametrize("fmt,table,items,splits,slots,min_span", [
    ("fp8", "main", 32, 8, 264, 8 * 512 + 1),  # 4 requests x 8 KV heads: 256 programs, one wave
    ("bfloat16", "long", 22, 6, 132, 6 * 512 + 1),  # 22 requests x 1 KV head: 132 programs, one wave
    ("bfloat16", "long", 45, 14, 132, 0),  # 630 programs over 132 slots: any span may deal
    ("bfloat16", "main", 3, 1, 396, 512 + 1),  # one split of one tile-rounded chunk at most
], ids=["fp8-32-items-8-splits", "long-22-items-6-splits", "long-45-items-14-splits", "main-3-items-1-split"])
def test_balanced_split_only_past_the_spans_it_cannot_shorten(fmt, table, items, splits, slots, min_span):
    """The balanced launch is taken only for key spans whose uniform launch is over one wave or
    has pieces longer than the balanced plan's shortest unit (balance_min_chunk in whole tiles)."""
    cfg = dc.config("sm90", fmt, 128, 16, False, table)
    assert dc.balance_min_span(cfg, items=items, splits=splits, slots=slots) == min_span
    odd = dataclasses.replace(cfg, block_n=96, balance_min_chunk=500)  # the chunk rounds up to 576
    assert dc.balance_min_span(odd, items=items, splits=splits, slots=slots) == (splits * 576 + 1 if min_span else 0)


@pytest.mark.parametrize("head_dim,tile,unbalanced,balanced", [
    pytest.param(256, (32, 4, 3), 3, 2, id="D256-32x4x3"),
    pytest.param(128, (64, 4, 4), 2, 2, id="D128-64x4x4"),
    pytest.param(64, (128, 4, 3), 3, 3, id="D64-128x4x3"),
])
def test_balanced_kernels_registers_set_their_occupancy(head_dim, tile, unbalanced, balanced):
    """The balanced split kernel (its plan and in-kernel merge) compiles to 168 registers a thread at
    D 64-128 and 212-218 at D 256 with a 16-bit cache (sm_90a, Triton 3.6): two 4-warp programs an
    SM at D 256 where the unbalanced kernel (126) fits three, so a balanced grid of three an SM
    would run a second, partial wave."""
    cfg = dc.DecodeConfig(*tile)
    assert dc.occupancy(cfg, "bfloat16", head_dim, False) == unbalanced
    assert dc.occupancy(cfg, "bfloat16", head_dim, False, balanced=True) == balanced
    assert dc.resident_slots(cfg, sm_count=132, kv_format="bfloat16", head_dim=head_dim, rope_query=False,
                             balanced=True) == 132 * balanced


H100_BW, H200_BW = 3.35e12, 4.8e12  # peak copy bytes/s (132 SMs each)


@pytest.mark.parametrize("fmt,kind", [("bfloat16", "main"), ("fp8", "main"), ("bfloat16", "long"),
                                      ("bfloat16", "short"), ("fp8", "short")])
def test_lanes_combine_only_where_measured(fmt, kind):
    """The lanes combine launch (requests of more than COMBINE_UNITS units) is the rule only on
    sm90 tables (PDL: a uniform batch's empty combine programs run under the split launch) of a GPU
    past the long table's bandwidth an SM (the H200, where it was measured); an H100, the other
    tables and GPUs of unknown bandwidth keep the in-kernel merge. A config's own value wins."""
    sm90 = dc.config("sm90", fmt, 128, 16, False, kind)
    assert sm90.pdl and sm90.balance_combine_units is None and sm90.balance_lanes_cap == 0
    assert dc.combine_units(sm90, sm_count=SMS, bandwidth=H200_BW) == dc.COMBINE_UNITS >= 1
    assert dc.combine_units(sm90, sm_count=SMS, bandwidth=H100_BW) == 0
    assert dc.combine_units(sm90, sm_count=SMS, bandwidth=0) == 0
    for arch in ("default", "interpreter"):
        other = dc.config(arch, fmt, 128, 16, False)
        assert not other.pdl and dc.combine_units(other, sm_count=SMS, bandwidth=H200_BW) == 0
    for units in (0, 2):
        given = dataclasses.replace(sm90, balance_combine_units=units)
        assert dc.combine_units(given, sm_count=SMS, bandwidth=H200_BW) == units
        assert dc.combine_units(dataclasses.replace(given, pdl=False), sm_count=SMS, bandwidth=0) == units
