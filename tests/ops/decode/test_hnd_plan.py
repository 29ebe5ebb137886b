"""Decode plans of HND and NHD pages on sm90's tables: the layout reaches the launch as stride values
only (one compiled kernel, one grid and split count for both), and equal batches of long-tile
programs fill their last wave past two waves (an H200 simulated on the CPU: its SM count and L2
size, launches recorded, not run)."""

from __future__ import annotations

import pytest
import torch

import kvattn
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch

from ..oracle import ON_GPU
from .test_balanced_plan import FAKED, SM_COUNT, _faked_h200
from .test_decode import decode_case

D = 128
POOL = 16  # pages in the pool



def _equal_batch_plan(monkeypatch, *, batch, length, page, num_heads, num_kv_heads, layout):
    """The plan of one decode call of ``batch`` requests of ``length`` keys each, float16 D 128 pages
    in ``layout`` (one tensor ``[P, 2, ...]``, as the benchmarks pass them), on a faked H200. The
    tables point into a small pool: the plan reads the pool's shape and strides, not its size."""
    _faked_h200(monkeypatch)
    pages_per_seq = -(-length // page)
    inner = (page, num_kv_heads, D) if layout == "NHD" else (num_kv_heads, page, D)
    kv = torch.empty(POOL, 2, *inner, dtype=torch.float16)
    tables = torch.randint(0, POOL, (batch, pages_per_seq), dtype=torch.int32)
    lens = torch.full((batch,), length, dtype=torch.int32)
    q = torch.empty(batch, num_heads, D, dtype=torch.float16)
    ws = torch.zeros(64 << 20, dtype=torch.uint8)
    kvattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, tables, lens, length, bmm1_scale=0.1, bmm2_scale=1.0,
                                                 out=torch.empty_like(q), kv_layout=layout)
    (plan,) = decode_launch._PLANS.values()
    return plan


# The sweep's equal rows on HND pages that ran at 0.79-0.88 of copy bandwidth on an H200, and the
# NHD row of the same heads that ran at 0.97 (benchmarks/sweep.py: sw10, sw06, sw16, sw03).
ROWS = [
    pytest.param(51, 11629, 64, 64, 8, id="51x11629-p64-h64-8"),
    pytest.param(57, 26788, 32, 16, 2, id="57x26788-p32-h16-2"),
    pytest.param(10, 49133, 64, 64, 8, id="10x49133-p64-h64-8"),
    pytest.param(22, 24305, 64, 64, 8, id="22x24305-p64-h64-8"),
]


@FAKED
@pytest.mark.parametrize("batch,length,page,num_heads,num_kv_heads", ROWS)
def test_hnd_and_nhd_launch_the_same_kernel_and_grid(batch, length, page, num_heads, num_kv_heads, monkeypatch):
    """Both layouts get the same config, split count, grid, constexprs and options; only the K/V
    page strides differ (HND: a head's page slab of ``page x D`` contiguous, NHD: a token's row of
    heads), all multiples of 16 elements, which is all Triton keys a stride on: one compiled kernel
    reads both layouts."""
    launches = {}
    for layout in ("NHD", "HND"):
        plan = _equal_batch_plan(monkeypatch, batch=batch, length=length, page=page, num_heads=num_heads,
                                 num_kv_heads=num_kv_heads, layout=layout)
        launches[layout] = plan.launches(length)
        monkeypatch.undo()
    (nhd, nhd_combine, *nhd_sizes), (hnd, hnd_combine, *hnd_sizes) = launches["NHD"], launches["HND"]
    assert nhd.grid == hnd.grid and nhd.constexprs == hnd.constexprs and nhd.options == hnd.options
    assert nhd_sizes == hnd_sizes and (nhd_combine is None) == (hnd_combine is None)
    strides = ("stride_k_p", "stride_k_s", "stride_k_h", "stride_v_p", "stride_v_s", "stride_v_h")
    assert {k: v for k, v in nhd.fixed.items() if k not in strides} == {
        k: v for k, v in hnd.fixed.items() if k not in strides}
    page_elems = 2 * page * num_kv_heads * D  # K and V of one page, [P, 2, ...]
    for x in "kv":
        assert (nhd.fixed[f"stride_{x}_p"], nhd.fixed[f"stride_{x}_s"], nhd.fixed[f"stride_{x}_h"]) == (
            page_elems, num_kv_heads * D, D)
        assert (hnd.fixed[f"stride_{x}_p"], hnd.fixed[f"stride_{x}_s"], hnd.fixed[f"stride_{x}_h"]) == (
            page_elems, D, page * D)
    assert all(launches[layout][0].fixed[s] % 16 == 0 for layout in launches for s in strides)


@FAKED
@pytest.mark.parametrize("batch,length,page,num_heads,num_kv_heads,splits,balanced", [
    # 408 items on 132 long-tile slots: 4 waves 0.77 full at one split; 6 splits: 2448 programs, 0.98
    pytest.param(51, 11629, 64, 64, 8, 6, False, id="51x11629-p64-h64-8"),
    # 114 items: one wave 0.86 full; 8 splits: 912 units dealt over the wave, 0.99
    pytest.param(57, 26788, 32, 16, 2, 8, True, id="57x26788-p32-h16-2"),
    # unchanged: 80 items, 8 splits (0.97) and 176 items, 3 splits (1.0) as before
    pytest.param(10, 49133, 64, 64, 8, 8, True, id="10x49133-p64-h64-8"),
    pytest.param(22, 24305, 64, 64, 8, 3, False, id="22x24305-p64-h64-8"),
])
def test_long_tile_launches_fill_their_last_wave(batch, length, page, num_heads, num_kv_heads, splits, balanced,
                                                 monkeypatch):
    """One 8-warp program an SM (configs.wants_tail_fit): the split count of configs.tail_fit
    whatever the waves and the fill, and the partials merged in the kernel."""
    plan = _equal_batch_plan(monkeypatch, batch=batch, length=length, page=page, num_heads=num_heads,
                             num_kv_heads=num_kv_heads, layout="HND")
    split, combine, _, _, merged = plan.launches(length)
    cfg = plan.config_for(length)
    assert (cfg.block_n, cfg.num_warps) == (128, 8)
    assert decode_configs.occupancy(cfg, "bfloat16", D, False) == 1
    assert split.fixed["num_splits"] == splits
    assert split.fixed["num_items"] == batch * num_kv_heads * splits
    assert split.constexprs["BALANCED"] is balanced
    assert split.grid[0] == (SM_COUNT if balanced else batch * num_kv_heads * splits)
    assert merged and combine is None
    whole = decode_configs.wave_fill(plan.items, SM_COUNT, 1)
    assert decode_configs.wave_fill(plan.items, SM_COUNT, splits) >= min(0.97, whole + 0.04)


@FAKED
def test_short_tiles_keep_whole_waves_past_two_waves(monkeypatch):
    """256 x 1024 pages of 64 (32/8 heads): three 4-warp programs an SM, 2048 items on 396 slots (5.2
    waves 0.86 full) keep one split, which the unbounded rule lost 265 -> 282 us to on an H200."""
    plan = _equal_batch_plan(monkeypatch, batch=256, length=1024, page=64, num_heads=32, num_kv_heads=8,
                             layout="HND")
    split, combine, *_ = plan.launches(1024)
    assert plan.config_for(1024) is plan.cfg_short
    assert split.fixed["num_splits"] == 1 and combine is None and split.grid[0] == 2048


@pytest.mark.skipif(not ON_GPU, reason="the sm90 tables' last-wave rule reads the GPU's SM count")
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("lens", [[1300] * 34, [1300] * 30 + [0, 1, 700, 1299]],
                         ids=["34x1300-equal", "34-ragged-with-0-and-1"])
def test_long_tile_batches_past_two_waves_split_exactly(lens, layout, triton_backend, monkeypatch, split_launches):
    """34 requests x 8 KV heads (272 items) on pages of 64, bf16 D 128: three waves of one long-tile
    program an SM on an H100 / H200 (the third 0.06 full at one split on 132 SMs), so the launch
    takes the split count of ``configs.tail_fit`` (5 on 132 SMs, 2 on 114), merged in the kernel;
    the results are exact in both layouts, equal lengths and ragged ones with an empty and a
    one-key request."""
    built = split_launches
    decode_case(torch.device("cuda"), monkeypatch, lens=lens, hkv=8, group=8, d=D, page=64, layout=layout,
                qdt=torch.bfloat16, seed=23, ws_bytes=64 << 20)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if torch.cuda.get_device_capability()[0] == 9 and decode_configs.wave_fill(8 * len(lens), sms, 1) < 1:
        assert max(launch.fixed["num_splits"] for launch in built) > 1, [launch.fixed["num_splits"] for launch in built]
