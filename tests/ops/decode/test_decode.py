"""Triton paged batch decode (``xqa_batch_decode_with_kv_cache``, ``xqa``) against the oracles.

Every case draws fresh random inputs (NaN in every cache slot no request uses, permuted pages,
wild page ids past each request's last page), poisons the output, runs the public function on the
Triton backend and compares with the float64 dense formulation. The tolerance is scaled to the
error the reference backend itself makes when it stores the same result in the output dtype.

On a CPU machine the kernels run in Triton's interpreter: only the cases marked ``interp`` run
there (float16, small shapes); a GPU runs the whole grid.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch

import kvattn
from kvattn._inputs import MIN_WORKSPACE_BYTES
from kvattn.formats import FP8_DTYPE
from kvattn.ops.common.balance import unit_cap
from kvattn.ops.decode import configs as decode_configs
from kvattn.ops.decode import plan as decode_launch
from kvattn.testing import make_paged_kv, poison_

from ..oracle import GPU_ONLY, ON_GPU, assert_matches, cpu, dense, off_by_one, run_both

def decode_case(
    device, monkeypatch, *, lens, hkv=2, group=4, d=64, page=16, layout="NHD", form="stacked", fmt=None,
    qdt=torch.float16, q_len=1, mask=False, window=-1, sinks=False, tensor_scales=False, fp8_out=False,
    o_scale=1.0, uint32=False, seed=0, ws_bytes=1 << 22, max_seq_len=None, enable_pdl=None, sf_off_by_one=False,
    workspace=None,
):
    """Build one random case, run both backends and the dense oracle, and compare.

    ``sf_off_by_one``: NVFP4 block scales one byte past a 4-byte boundary (the kernels then read
    them byte by byte instead of as words). ``workspace``: one to use instead of a fresh zeroed one."""
    fmt = fmt or {torch.float16: "float16", torch.bfloat16: "bfloat16"}[qdt]
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=qdt, kv_format=fmt,
                         layout=layout, form=form, device=device, seed=seed)
    if sf_off_by_one:
        case.kv_cache_sf = tuple(off_by_one(t) for t in case.kv_cache_sf) if isinstance(
            case.kv_cache_sf, tuple) else off_by_one(case.kv_cache_sf)
    g = torch.Generator().manual_seed(100 + seed)
    batch, hq = len(lens), hkv * group
    q = torch.randn(batch * q_len, hq, d, generator=g).to(device=device, dtype=qdt)
    mask_t = None
    if mask:
        words = 2 * ((q_len + 31) // 32)
        mask_t = torch.randint(0, 1 << 16, (batch, q_len, words), generator=g, dtype=torch.int32)
        mask_t = mask_t.to(torch.uint16).to(device)
    sinks_t = (torch.randn(hq, generator=g) * 2).to(device) if sinks else None
    k_scale, v_scale = (0.7, 1.3) if fmt in ("fp8", "nvfp4") else (1.0, 1.0)
    bmm1, bmm2 = 1.5 / math.sqrt(d) * k_scale, v_scale
    if tensor_scales:
        bmm1, bmm2 = (torch.tensor([x], dtype=torch.float32, device=device) for x in (bmm1, bmm2))
    seq_lens = case.seq_lens.to(torch.uint32) if uint32 else case.seq_lens
    out_dtype = FP8_DTYPE if fp8_out else qdt
    kw = dict(bmm1_scale=bmm1, bmm2_scale=bmm2, window_left=window, sinks=sinks_t, kv_layout=layout,
              q_len_per_req=q_len, o_scale=o_scale, mask=mask_t, kv_cache_sf=case.kv_cache_sf)
    capacity = case.block_tables.shape[1] * page
    max_len = case.max_seq_len if max_seq_len is None else (capacity if max_seq_len == "capacity" else max_seq_len)

    def call():
        out = poison_(torch.empty(q.shape, dtype=out_dtype, device=device))
        ws = torch.zeros(ws_bytes, dtype=torch.uint8, device=device) if workspace is None else workspace
        got = kvattn.decode.xqa_batch_decode_with_kv_cache(
            q, case.kv_cache, ws, case.block_tables, seq_lens, max_len, out=out, enable_pdl=enable_pdl, **kw)
        assert got is out
        return out

    out, ref_out = run_both(call, monkeypatch)
    if max(lens) == 0:  # (the dense oracle needs a key somewhere)
        exact = torch.zeros(q.shape, dtype=torch.float64)
    else:
        exact = dense_by_length(q, case, q_len, kw)
    assert_matches(out, ref_out, exact, stored_scale=o_scale if fp8_out else 1.0)
    for b, n in enumerate(lens):
        if n == 0:
            assert (out[b * q_len : (b + 1) * q_len].float() == 0).all(), f"empty request {b}: rows not zero"
    return out


# float64 elements one oracle call may gather for K (and as many for V): the oracle pads every
# request to the longest, and 300 requests padded to 20,000 keys took ~25 GB of a test worker's
# host memory, which killed the worker on the H200 among fifteen others.
ORACLE_ELEMENTS = 1 << 26


def dense_by_length(q, case, q_len, kw, elements=ORACLE_ELEMENTS):
    """The float64 oracle (``dense.batch_decode``) on the CPU; a batch whose padded K would pass
    ``elements`` is checked in groups of requests of similar length, each padded to its own longest."""
    lens = case.seq_lens.cpu().long()
    budget = max(1, elements // (q.shape[1] * q.shape[2]))  # keys a group may pad to (Hq >= Hkv: a bound)
    args = {k: cpu(v) for k, v in kw.items()}
    if lens.numel() * int(lens.max()) <= budget:
        return dense.batch_decode(cpu(q), cpu(case.kv_cache), cpu(case.block_tables), cpu(case.seq_lens), **args)
    groups, group = [], []
    for b in torch.argsort(lens).tolist():  # ascending: a request joining a group sets its padding
        if group and (len(group) + 1) * int(lens[b]) > budget:
            groups.append(group)
            group = []
        group.append(b)
    groups.append(group)
    exact = torch.empty(q.shape, dtype=torch.float64)
    for group in groups:
        reqs = torch.tensor(group)
        rows = (reqs.view(-1, 1) * q_len + torch.arange(q_len)).flatten()
        part = dict(args, mask=None if args["mask"] is None else args["mask"][reqs])
        exact[rows] = dense.batch_decode(cpu(q)[rows], cpu(case.kv_cache), cpu(case.block_tables)[reqs],
                                         cpu(case.seq_lens)[reqs], **part)
    return exact


def param(id, interp=False, **kw):
    return pytest.param(kw, id=id, marks=() if interp else GPU_ONLY)


SMALL = [1, 37, 0, 70]  # seq_len 1, not a multiple of the page, an empty slot, several pages
GPU_LENS = [1, 37, 0, 300, 1029, 2048]

CASES = [
    # --- the interpreter subset -------------------------------------------------------------
    param("fp16-NHD-stacked-p16-D64-G4", True, lens=SMALL),
    param("fp16-HND-tuple-p32-D64-G2", True, lens=SMALL, layout="HND", form="tuple", page=32, group=2),
    param("fp16-NHD-shared-p64-D64-G1", True, lens=SMALL, form="shared", page=64, group=1),
    param("fp16-HND-p16-D128-G8-uint32", True, lens=[5, 50], d=128, group=8, hkv=1, layout="HND", uint32=True),
    param("fp8-HND-p16-tensor-scales-fp8-out", True, lens=SMALL, fmt="fp8", layout="HND", tensor_scales=True,
          fp8_out=True, o_scale=2.0),
    param("nvfp4-NHD-tuple-p16-G4", True, lens=SMALL, fmt="nvfp4", form="tuple"),
    param("spec-Q3-causal-window9-sinks", True, lens=[3, 40, 0, 66], q_len=3, window=9, sinks=True),
    param("spec-Q4-mask", True, lens=[4, 40, 66], q_len=4, mask=True),
    param("window0-sinks", True, lens=SMALL, window=0, sinks=True),
    param("rows144-two-row-blocks", True, lens=[20, 45], hkv=1, group=24, q_len=6),
    # --- GPU grid -------------------------------------------------------------------------------
    *[param(f"bf16-{layout}-{form}-p{page}", lens=GPU_LENS, layout=layout, form=form, page=page,
            qdt=torch.bfloat16, seed=page)
      for layout in ("NHD", "HND") for form in ("stacked", "shared", "tuple") for page in (16, 32, 64, 128)],
    *[param(f"bf16-D{d}-G{g}", lens=[1, 77, 513, 1500], d=d, group=g, hkv=max(1, 8 // g),
            qdt=torch.bfloat16, seed=d + g)
      for d in (64, 128, 256) for g in (1, 2, 4, 8, 16, 32)],
    *[param(f"fp16-spec-Q{q}-{'mask' if m else 'causal'}", lens=[q, 90, 0, 1000], q_len=q, mask=m, seed=q)
      for q in range(1, 9) for m in (False, True)],
    *[param(f"bf16-spec-Q{q}-G{g}-mask-window", lens=[q + 3, 700], q_len=q, group=g, mask=True, window=100,
            qdt=torch.bfloat16, seed=q * g)
      for q in (2, 5, 8) for g in (1, 4, 16)],
    *[param(f"fp16-window{w}", lens=[1, 16, 17, 64, 65, 200, 3000], window=w, seed=w)
      for w in (0, 1, 15, 16, 63, 64, 199, 2999, 5000)],
    *[param(f"{fmt}-{layout}-p{page}-{'tensor' if ts else 'float'}-scales", lens=GPU_LENS, fmt=fmt,
            layout=layout, page=page, tensor_scales=ts, qdt=torch.bfloat16, seed=page)
      for fmt in ("fp8", "nvfp4") for layout in ("NHD", "HND") for page in (16, 64) for ts in (False, True)],
    *[param(f"fp8-out-o_scale{o}-{layout}", lens=GPU_LENS, fmt="fp8", fp8_out=True, o_scale=o, layout=layout,
            qdt=torch.bfloat16)
      for o in (0.5, 1.0, 4.0) for layout in ("NHD", "HND")],
    param("bf16-sinks-G8-long", lens=[4000, 9000], group=8, sinks=True, qdt=torch.bfloat16),
    param("bf16-long-split-B1", lens=[30000], hkv=8, d=128, qdt=torch.bfloat16),
    param("bf16-ragged-splits", lens=[1, 5000, 17, 12000, 0, 333], hkv=4, d=128, qdt=torch.bfloat16),
    param("fp16-max_seq_len-above-lengths", lens=[100, 30], max_seq_len="capacity"),
    # ragged batches (the balanced split, common.balance): one giant request among tiny ones, more
    # requests than SMs with heavy-tailed lengths, fp8 on pages of 16, drafts (the fp16 case's 1100
    # keys: past the interpreter's 2 splits of 512, where configs.balance_min_span lets it deal)
    # (the float64 oracle gathers every request to the longest: 8 KV heads at 60000 keys took ~33 GB
    # a worker and the H200 run's worker was killed; 2 heads at 20000 keep it under 3 GB)
    param("bf16-ragged-one-giant-among-tiny", lens=[1] * 30 + [0, 2, 20000, 17], hkv=2, d=128, qdt=torch.bfloat16),
    param("fp16-ragged-one-giant-among-tiny", True, lens=[1] * 12 + [0, 2, 1100, 17], hkv=1, group=4),
    # (2 KV heads, lengths to 20000; the oracle checks it in groups of similar lengths: dense_by_length)
    param("bf16-ragged-300-requests-lognormal", lens=[0, 1] + [int(min(20000, 2 ** (6 + 9 * ((i * 37) % 101) / 100)))
                                                               for i in range(298)],
          hkv=2, d=128, qdt=torch.bfloat16, ws_bytes=1 << 26, seed=11),
    param("fp8-ragged-p16", lens=[16, 15, 17, 9000, 1, 0, 3000, 20000], fmt="fp8", hkv=8, d=128,
          qdt=torch.bfloat16, sinks=True, seed=12),
    param("bf16-ragged-spec-Q3-mask", lens=[3, 5000, 4, 17000, 300], q_len=3, mask=True, hkv=4, d=128,
          qdt=torch.bfloat16, seed=13),
    param("bf16-pdl", lens=GPU_LENS, qdt=torch.bfloat16, enable_pdl=True),
    param("fp16-tiny-workspace-no-split", lens=[20000, 3], ws_bytes=MIN_WORKSPACE_BYTES),
    param("bf16-Hq8-Hkv1-D128", lens=[8192, 100], hkv=1, group=8, d=128, qdt=torch.bfloat16),
    # spans of at most decode_configs.SHORT_SPAN keys on pages of 64+: the short-request tiles on sm90
    *[param(f"bf16-short-spans-{layout}-p{page}", lens=[1, 63, 64, 65, 700, 1024, 0], page=page, d=128,
            layout=layout, qdt=torch.bfloat16, sinks=True, seed=page)
      for layout in ("NHD", "HND") for page in (64, 128)],
    # fp8 at D 128 (the tuned entries): short-request tiles on any page size, the main tile past them
    *[param(f"fp8-D128-short-spans-{layout}-p{page}", lens=[1, 63, 64, 65, 700, 1024, 0], fmt="fp8", page=page,
            d=128, layout=layout, qdt=torch.bfloat16, sinks=True, seed=page)
      for layout in ("NHD", "HND") for page in (16, 64)],
    param("fp8-D128-G4-long-split", lens=[1029, 20000], fmt="fp8", d=128, hkv=8, qdt=torch.bfloat16),
    # NVFP4 at the head dims whose table entries differ from D 64's (kvattn check caught a D 128 tile
    # that the D 64 cases above passed)
    *[param(f"nvfp4-D{d}-{layout}-p{page}", lens=[1, 70, 300, 513, 4096], fmt="nvfp4", d=d, hkv=8 if d == 128 else 2,
            layout=layout, page=page, qdt=torch.bfloat16, seed=d + page)
      for d in (128, 256) for layout, page in (("NHD", 16), ("HND", 32))],
    # NVFP4 launches of more work items than SMs (the main table's one-warp tiles; the cases above
    # have few items), spec decode and large groups (more query rows: 8 warps on the 32-key tiles)
    param("nvfp4-D128-many-items", lens=[1 + 97 * i for i in range(24)], fmt="nvfp4", d=128, hkv=8,
          qdt=torch.bfloat16, seed=5),
    param("nvfp4-D64-many-items-HND", lens=[3 + 61 * i for i in range(40)], fmt="nvfp4", d=64, hkv=4,
          layout="HND", qdt=torch.bfloat16, seed=6),
    param("nvfp4-D128-spec-Q4-G16-mask", lens=[4, 300, 1029], fmt="nvfp4", d=128, hkv=1, group=16, q_len=4,
          mask=True, qdt=torch.bfloat16, seed=7),
    param("nvfp4-D256-spec-Q4-G8-window", lens=[6, 700], fmt="nvfp4", d=256, hkv=2, group=8, q_len=4, window=100,
          qdt=torch.bfloat16, seed=8),
    param("nvfp4-D64-spec-Q2-sinks", lens=[2, 45, 2000], fmt="nvfp4", d=64, q_len=2, sinks=True,
          qdt=torch.bfloat16, seed=9),
    # NVFP4 scales not 4-byte aligned: read byte by byte (the aligned cases above read words)
    *[param(f"nvfp4-D{d}-{layout}-scales-off-by-one", lens=[1, 70, 513, 2100], fmt="nvfp4", d=d, hkv=2,
            layout=layout, qdt=torch.bfloat16, sf_off_by_one=True, seed=d)
      for d in (64, 128) for layout in ("NHD", "HND")],
]


@pytest.mark.parametrize("q_len,mask", [(1, False), (3, True)], ids=["Q1", "Q3-mask"])
def test_oracle_by_length_groups_equals_the_oracle_at_once(q_len, mask):
    """The grouped float64 oracle (for batches too large to pad at once) is the same numbers."""
    lens = [0, 5, 300, 3, 77, 12, 150, 3, 1]
    case = make_paged_kv(lens, num_kv_heads=2, head_dim=16, page_size=16, dtype=torch.float16, seed=4)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(len(lens) * q_len, 4, 16, generator=g).to(torch.float16)
    mask_t = torch.randint(0, 1 << 16, (len(lens), q_len, 2), generator=g, dtype=torch.int32).to(torch.uint16)
    kw = dict(bmm1_scale=0.3, bmm2_scale=1.0, window_left=-1, sinks=None, kv_layout="NHD",
              q_len_per_req=q_len, o_scale=1.0, mask=mask_t if mask else None, kv_cache_sf=None)
    at_once = dense_by_length(q, case, q_len, kw)
    grouped = dense_by_length(q, case, q_len, kw, elements=64 * 400)  # groups padded to 400 keys at most
    assert (at_once - grouped).abs().max() <= 1e-12 * at_once.abs().max(), (at_once - grouped).abs().max()


@pytest.mark.parametrize("kw", CASES)
def test_batch_decode_matches_oracles(kw, kernel_device, triton_backend, monkeypatch):
    decode_case(kernel_device, monkeypatch, **kw)


@pytest.mark.parametrize("merge", ["in-kernel", "combine-launch"])
@pytest.mark.parametrize("q_len,group", [(1, 4), (3, 2)], ids=["Q1-G4", "Q3-G2"])
def test_split_kv_partials_combine_exactly(q_len, group, merge, kernel_device, triton_backend, monkeypatch):
    """Short splits force several partials per request (ragged: some requests need one), merged
    by each item's last split program or by the combine launch (``KVATTN_FUSED_MERGE=0``)."""
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1" if merge == "in-kernel" else "0")
    monkeypatch.setattr(decode_launch, "MAX_MERGE_ROUNDS", 1 << 30)  # merge in the kernel however many splits
    lens = [150, 3, 0, 97] if not ON_GPU else [1500, 3, 0, 970, 64, 2049]
    with decode_configs.override(min_chunk=32, waves=64, balance_waves=0):
        decode_case(kernel_device, monkeypatch, lens=lens, q_len=q_len, group=group, sinks=True, window=60)
        decode_case(kernel_device, monkeypatch, lens=lens, q_len=q_len, group=group, seed=3)


def test_in_kernel_merge_leaves_its_counters_at_zero(kernel_device, triton_backend, monkeypatch):
    """Calls sharing one workspace stay exact (each launch's last split program resets its item's
    arrival counter), and the workspace's counter region reads zero after them."""
    from kvattn.runtime.workspace import ALIGN, COUNTER_BYTES

    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    monkeypatch.setattr(decode_launch, "MAX_MERGE_ROUNDS", 1 << 30)
    ws = torch.zeros(1 << 22, dtype=torch.uint8, device=kernel_device)
    lens = [150, 3, 0, 97] if not ON_GPU else [1500, 3, 0, 970, 64, 2049]
    with decode_configs.override(min_chunk=32, waves=64, balance_waves=0):
        for seed in range(3):
            decode_case(kernel_device, monkeypatch, lens=lens, group=4, sinks=seed == 1, seed=seed, workspace=ws)
    start = (-ws.data_ptr()) % ALIGN
    assert (ws[start : start + COUNTER_BYTES] == 0).all()
    assert ws[start + COUNTER_BYTES :].any(), "no partial reached the workspace: the launches did not split"


@pytest.mark.parametrize("merge,plan", [("in-kernel", "lanes"), ("in-kernel", "lanes-cap-2"), ("in-kernel", "deal"),
                                        ("combine-launch", "lanes")])
@pytest.mark.parametrize("q_len,group", [(1, 4), (3, 2)], ids=["Q1-G4", "Q3-G2"])
def test_balanced_split_of_ragged_batches(q_len, group, merge, plan, kernel_device, triton_backend, monkeypatch,
                                          split_launches):
    """A ragged batch takes the balanced split (common.balance): one request of many units, one of
    a few (merged by their last program), empty and one-key requests (one unit, written directly),
    cut into lanes (``lanes``: one equal share of the batch's tiles a lane; ``lanes-cap-2``: a
    request's lanes at most 2, config ``balance_lanes_cap``) or dealt to the programs by the
    counter (``deal``, config ``balance_lanes=False``). A batch of about equal
    lengths keeps the uniform split inside the same kernel (partials laid out by unit), dealt.
    Without the in-kernel merge (``KVATTN_FUSED_MERGE=0``) the launch keeps the uniform split and
    its combine launch."""
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1" if merge == "in-kernel" else "0")
    built = split_launches
    ragged = [600, 3, 0, 97, 5] if not ON_GPU else [6000, 3, 0, 970, 5, 64, 2049]  # (lengths count the drafts)
    even = [100, 90, 97, 80] if not ON_GPU else [1000, 900, 970, 800]
    # (max_splits: the uniform split the plan falls back to merges in the kernel, which the
    # balanced launch needs)
    with decode_configs.override(min_chunk=32, waves=4, max_splits=2, balance_waves=4, balance_min_chunk=32,
                                 balance_lanes=plan != "deal", balance_lanes_cap=2 if plan == "lanes-cap-2" else 0):
        decode_case(kernel_device, monkeypatch, lens=ragged, q_len=q_len, group=group, sinks=True)
        decode_case(kernel_device, monkeypatch, lens=even, q_len=q_len, group=group, seed=3)
    balanced = [launch.constexprs["BALANCED"] for launch in built]
    assert (any(balanced) if merge == "in-kernel" else not any(balanced)), balanced
    lanes = [launch.constexprs["LANES"] for launch in built if launch.constexprs["BALANCED"]]
    assert all(lanes) if plan != "deal" else not any(lanes), lanes
    # a request's lanes at most: the config's cap, else the merge's unit cap
    caps = {(c["LANE_CAP"], c["MERGE_BLOCK_S"]) for c in (launch.constexprs for launch in built) if c["LANES"]}
    assert all(cap == (2 if plan == "lanes-cap-2" else unit_cap(merge_block_s)) for cap, merge_block_s in caps), caps


@pytest.mark.parametrize("lens", [[6000, 3, 0, 970, 5, 64, 2049], [20000]], ids=["ragged7", "1x20000"])
def test_mha_launches_that_split(lens, kernel_device, triton_backend, monkeypatch):
    """One query row a KV head (32 / 32 heads, D 128) over splits the plan chooses itself: on an
    H200-class GPU they run the config's ``one_row_stages`` (configs._SM90_THREE_AN_SM_STAGES), a
    ragged batch balanced, one long request split and merged in the kernel."""
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    if not ON_GPU:
        lens = [min(n, 300) for n in lens]
    decode_case(kernel_device, monkeypatch, lens=lens, hkv=32, group=1, d=128, page=32, sinks=True)


@pytest.mark.parametrize("fmt", ["fp8", "float16"])
def test_a_register_cap_reaches_the_launch(fmt, kernel_device, triton_backend, monkeypatch, split_launches):
    """A config's ``maxnreg`` (two stages at 168 registers: three fp8 programs an SM) is the split
    launch's compile option, the occupancy estimate is bounded by it, and the results stay
    exact (a ragged batch with an empty and a one-key request, split and merged in the kernel)."""
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    lens = [5000, 1, 0, 1900, 64] if ON_GPU else [300, 1, 0, 190, 64]
    with decode_configs.override(num_stages=2, maxnreg=168, min_chunk=32, waves=4, balance_min_chunk=32):
        decode_case(kernel_device, monkeypatch, lens=lens, hkv=2, group=4, d=128, page=16, fmt=fmt, seed=5)
    assert split_launches and all(launch.options.get("maxnreg") == 168 for launch in split_launches)
    # the estimate is bounded by the cap: 8-warp fp8 tiles at two stages fit one an SM by their
    # registers, two under a cap of 128
    cfg = replace(decode_configs.config("sm90", "fp8", 128, 16, False), num_stages=2, num_warps=8)
    assert decode_configs.occupancy(cfg, "fp8", 128, False) == 1
    assert decode_configs.occupancy(replace(cfg, maxnreg=128), "fp8", 128, False) == 2
    assert decode_configs.occupancy(replace(cfg, num_warps=4, maxnreg=168), "fp8", 128, False) == 3


@pytest.mark.parametrize("merge_units", [1, 2], ids=["all-by-combine", "two-in-kernel"])
@pytest.mark.parametrize("q_len,group", [(1, 4), (3, 2)], ids=["Q1-G4", "Q3-G2"])
def test_lanes_merged_by_the_combine_launch(q_len, group, merge_units, kernel_device, triton_backend, monkeypatch,
                                            split_launches):
    """A lanes launch whose requests of more than ``balance_combine_units`` units are merged by the
    lanes combine launch (common.combine.lanes_combine_kernel) instead of their last program: a
    ragged batch (one request of many lanes, empty and one-key ones) and an equal one, exact against
    the oracles, the lanes cap raised to 4; the merge counters back at zero after the calls."""
    from kvattn.runtime.workspace import ALIGN, COUNTER_BYTES

    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    combines = []
    real = decode_launch._lanes_combine_launch
    monkeypatch.setattr(decode_launch, "_lanes_combine_launch", lambda *a: combines.append(real(*a)) or combines[-1])
    ws = torch.zeros(1 << 22, dtype=torch.uint8, device=kernel_device)
    ragged = [600, 3, 0, 97, 5] if not ON_GPU else [6000, 3, 0, 970, 5, 64, 2049]
    even = [100, 90, 97, 80] if not ON_GPU else [1000, 900, 970, 800]
    with decode_configs.override(min_chunk=32, waves=4, max_splits=2, balance_waves=4, balance_min_chunk=32,
                                 balance_lanes_cap=4, balance_combine_units=merge_units):
        decode_case(kernel_device, monkeypatch, lens=ragged, hkv=1, q_len=q_len, group=group, sinks=True, workspace=ws)
        decode_case(kernel_device, monkeypatch, lens=even, hkv=1, q_len=q_len, group=group, seed=3, workspace=ws)
    lanes = [launch.constexprs["MERGE_UNITS"] for launch in split_launches if launch.constexprs["LANES"]]
    assert lanes and all(units == merge_units for units in lanes), lanes
    assert combines and all(c.constexprs["MERGE_UNITS"] == merge_units for c in combines)
    # two KV heads (two programs a unit): the lanes merge in the kernel, no combine launch
    split_launches.clear()
    combines.clear()
    with decode_configs.override(min_chunk=32, waves=4, max_splits=2, balance_waves=4, balance_min_chunk=32,
                                 balance_lanes_cap=4, balance_combine_units=merge_units):
        decode_case(kernel_device, monkeypatch, lens=ragged, hkv=2, q_len=q_len, group=group, workspace=ws)
    lanes = [launch.constexprs["MERGE_UNITS"] for launch in split_launches if launch.constexprs["LANES"]]
    assert lanes and not any(lanes) and not combines, lanes
    start = (-ws.data_ptr()) % ALIGN
    assert (ws[start : start + COUNTER_BYTES] == 0).all()


@pytest.mark.skipif(not ON_GPU, reason="the sm90 tables' last-wave rule reads the GPU's SM count")
@pytest.mark.parametrize("lens", [[2600] * 10, [2600, 2100, 3000, 2590, 1, 0, 2700, 2048, 2600, 2611]],
                         ids=["10x2600-equal", "10-ragged-with-0-and-1"])
def test_few_long_requests_fill_the_last_wave(lens, triton_backend, monkeypatch, split_launches):
    """10 requests x 8 KV heads (80 items) on pages of 64 (long tiles, one program an SM): one split
    each would leave 40 % of the SMs idle; the split count of ``configs.tail_fit`` is taken and the
    result is still exact (equal lengths, and ragged ones with an empty and a one-key request)."""
    built = split_launches
    decode_case(torch.device("cuda"), monkeypatch, lens=lens, hkv=8, group=8, d=128, page=64, qdt=torch.bfloat16,
                seed=21)
    if torch.cuda.get_device_capability()[0] == 9:
        assert max(launch.fixed["num_splits"] for launch in built) > 1, [launch.fixed["num_splits"] for launch in built]


@pytest.mark.parametrize("seed", range(6), ids=lambda s: f"seed{s}")
def test_random_ragged_batches_in_lanes(seed, kernel_device, triton_backend, monkeypatch, split_launches):
    """Random ragged batches (2-9 requests, empty, one-key and log-normal lengths around one long
    request; one or two query rows; sinks or not; pages of 16 or 32) in lanes, with the lanes'
    cap at the merge's, 2 or 3: exact against the oracles, and the launch is the lanes kernel."""
    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    rng = random.Random(seed)
    batch = rng.randint(2, 9)
    q_len = rng.choice([1, 1, 2])
    lens = [max(q_len, rng.choice([0, 1, int(rng.lognormvariate(4.5, 1.2))])) for _ in range(batch)]
    lens[rng.randrange(batch)] = rng.randint(300, 900) * (10 if ON_GPU else 1)
    with decode_configs.override(min_chunk=32, waves=4, max_splits=rng.choice([2, 4]), balance_waves=4,
                                 balance_min_chunk=rng.choice([16, 32, 64]), balance_lanes_cap=rng.choice([0, 2, 3])):
        decode_case(kernel_device, monkeypatch, lens=lens, q_len=q_len, group=rng.choice([1, 2, 4]),
                    sinks=rng.random() < 0.5, seed=seed, page=rng.choice([16, 32]))
    lanes = [launch.constexprs["LANES"] for launch in split_launches if launch.constexprs["BALANCED"]]
    assert all(lanes) and (lanes or ON_GPU), (lens, lanes)  # (a GPU's plan may keep these spans uniform)


def test_balanced_deal_leaves_its_counters_at_zero(kernel_device, triton_backend, monkeypatch):
    """Ragged calls sharing one workspace stay exact: the dynamic deal's counter and finish count,
    and every request's merge counter, read zero after each launch."""
    from kvattn.runtime.workspace import ALIGN, COUNTER_BYTES

    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    ws = torch.zeros(1 << 22, dtype=torch.uint8, device=kernel_device)
    lens = [300, 3, 0, 97] if not ON_GPU else [9000, 3, 0, 970, 64, 2049]
    with decode_configs.override(balance_waves=4, balance_min_chunk=32):
        for seed in range(2):
            decode_case(kernel_device, monkeypatch, lens=lens, group=4, sinks=seed == 1, seed=seed, workspace=ws)
    start = (-ws.data_ptr()) % ALIGN
    assert (ws[start : start + COUNTER_BYTES] == 0).all()
    assert ws[start + COUNTER_BYTES :].any(), "no partial reached the workspace: no request was split"


@pytest.mark.parametrize("lens,plan", [([600, 3, 0, 97, 1], "lanes"), ([600, 3, 0, 97, 1], "deal"),
                                       ([100, 100, 100, 100, 1], "lanes"), ([100, 100, 100, 100, 0], "lanes")],
                         ids=["ragged-with-0-and-1-lanes", "ragged-with-0-and-1-deal", "uniform-with-1",
                              "uniform-with-0"])
@pytest.mark.parametrize("q_len,group", [(1, 4), (3, 2)], ids=["Q1-G4", "Q3-G2"])
def test_balanced_launch_deals_over_one_wave(lens, plan, q_len, group, kernel_device, triton_backend, monkeypatch,
                                             split_launches):
    """The balanced launch's grid is one wave of resident programs, fewer here than the uniform
    split's items x splits: the programs deal the units to themselves, a ragged batch's and a
    batch found uniform (the 5/4 rule of common.balance: one request of q_len or 0 keys among four
    of 100 keeps it uniform) alike. Exact either way, with sinks, and every counter reads zero
    after calls sharing one workspace."""
    from kvattn.runtime.workspace import ALIGN, COUNTER_BYTES

    monkeypatch.setenv("KVATTN_FUSED_MERGE", "1")
    built = split_launches
    ws = torch.zeros(1 << 22, dtype=torch.uint8, device=kernel_device)
    lens = [q_len if x == 1 else x for x in lens]  # (a request of q_len > 1 rows has q_len keys at least)
    lens = lens if not ON_GPU else [x * 10 if x > q_len else x for x in lens]
    # (6 splits of 10 items: 60 units of the uniform split over the interpreter's 32 slots, so
    # programs deal themselves several units each, and a unit dealt twice or never would leave an
    # item's arrival counter part-counted or its output poisoned)
    with decode_configs.override(min_chunk=32, waves=2, max_splits=6, balance_waves=4, balance_min_chunk=32,
                                 balance_lanes=plan == "lanes"):
        for seed in range(2):
            decode_case(kernel_device, monkeypatch, lens=lens, q_len=q_len, group=group, sinks=seed == 0, seed=seed,
                        workspace=ws)
    balanced = [launch for launch in built if launch.constexprs["BALANCED"]]
    assert balanced, [launch.constexprs["BALANCED"] for launch in built]
    if not ON_GPU:  # (the GPU's wave is larger than these batches' items)
        assert all(launch.grid[0] < launch.fixed["num_items"] for launch in balanced), [
            (launch.grid, launch.fixed["num_items"]) for launch in balanced]
    start = (-ws.data_ptr()) % ALIGN
    assert (ws[start : start + COUNTER_BYTES] == 0).all()


def test_empty_batch_all_zero(kernel_device, triton_backend, monkeypatch):
    out = decode_case(kernel_device, monkeypatch, lens=[0, 0, 0], sinks=True, max_seq_len="capacity")
    assert (out.float() == 0).all()


@pytest.mark.parametrize("max_programs", [1, 3, None], ids=["sm1", "sm3", "sm-default"])
@pytest.mark.parametrize("pool", ["flat", "HND"])
def test_xqa_adapter(pool, max_programs, kernel_device, triton_backend, monkeypatch):
    """xqa: flat head pool or 4-D pages, [Hkv, G] sinks, sliding window, sm_count capping the grid."""
    hkv, group, d, page = 2, 4, 64, 16
    lens = [1, 45, 0, 80] if not ON_GPU else [1, 450, 0, 3000]
    layout = "NHD" if pool == "flat" else "HND"
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.float16,
                         layout=layout, form="tuple", device=kernel_device, seed=7)
    k, v = case.kv_cache
    if pool == "flat":
        k, v = k.reshape(-1, d), v.reshape(-1, d)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(len(lens), 1, hkv * group, d, generator=g).to(kernel_device, torch.float16)
    sinks = torch.randn(hkv, group, generator=g).to(kernel_device)
    seq_lens = case.seq_lens.to(torch.uint32).view(-1, 1)
    kw = dict(sinks=sinks, q_scale=1.2, sliding_win_size=33, kv_layout=layout)

    def call():
        out = poison_(torch.empty_like(q))
        kvattn.xqa.xqa(q, k, v, case.block_tables, seq_lens, out, torch.zeros(1 << 20, dtype=torch.uint8,
                       device=kernel_device), torch.zeros(8, dtype=torch.uint32, device=kernel_device), hkv, page,
                       sm_count=max_programs, **kw)
        return out

    out, ref_out = run_both(call, monkeypatch)
    exact = dense.xqa(cpu(q), cpu(k), cpu(v), cpu(case.block_tables), cpu(seq_lens), hkv, page,
                      **{a: cpu(b) for a, b in kw.items()})
    assert_matches(out, ref_out, exact)


def test_xqa_fp8_pool_with_kv_scale(kernel_device, triton_backend, monkeypatch):
    hkv, group, d, page = 2, 2, 64, 32
    case = make_paged_kv([50, 9], num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.float16,
                         kv_format="fp8", form="tuple", device=kernel_device, seed=8)
    k, v = (t.reshape(-1, d) for t in case.kv_cache)
    q = torch.randn(2, 1, hkv * group, d).to(kernel_device, torch.float16)
    kv_scale = torch.tensor([0.6], device=kernel_device)
    seq_lens = case.seq_lens.view(-1, 1)

    def call():
        out = poison_(torch.empty_like(q))
        kvattn.xqa.xqa(q, k, v, case.block_tables, seq_lens, out, torch.zeros(1 << 20, dtype=torch.uint8,
                       device=kernel_device), torch.zeros(8, dtype=torch.uint32, device=kernel_device), hkv, page,
                       kv_scale=kv_scale)
        return out

    out, ref_out = run_both(call, monkeypatch)
    exact = dense.xqa(cpu(q), cpu(k), cpu(v), cpu(case.block_tables), cpu(seq_lens), hkv, page,
                      kv_scale=cpu(kv_scale))
    assert_matches(out, ref_out, exact)


@pytest.mark.parametrize("offset", [0, 1], ids=["rows-4B-aligned", "rows-misaligned"])
def test_xqa_fp8_pool_alignment(offset, kernel_device, triton_backend, monkeypatch):
    """fp8 caches are read as 32-bit words when every row is 4-byte aligned (GPU); a pool that
    starts one byte off takes the byte path. Both match the oracle."""
    hkv, group, d, page = 2, 4, 128, 16
    case = make_paged_kv([70, 33, 1], num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.bfloat16,
                         kv_format="fp8", form="tuple", device=kernel_device, seed=12)
    pools = []
    for t in case.kv_cache:
        flat = t.reshape(-1).view(torch.uint8)
        buf = torch.empty(flat.numel() + offset, dtype=torch.uint8, device=kernel_device)
        buf[offset:].copy_(flat)
        pools.append(buf[offset:].view(FP8_DTYPE).view(-1, d))
    k, v = pools
    assert (k.data_ptr() % 4 == 0) == (offset == 0)
    q = torch.randn(3, 1, hkv * group, d).to(kernel_device, torch.bfloat16)
    seq_lens = case.seq_lens.view(-1, 1)

    def call():
        out = poison_(torch.empty_like(q))
        kvattn.xqa.xqa(q, k, v, case.block_tables, seq_lens, out, torch.zeros(1 << 20, dtype=torch.uint8,
                       device=kernel_device), torch.zeros(8, dtype=torch.uint32, device=kernel_device), hkv, page)
        return out

    out, ref_out = run_both(call, monkeypatch)
    exact = dense.xqa(cpu(q), cpu(k), cpu(v), cpu(case.block_tables), cpu(seq_lens), hkv, page)
    assert_matches(out, ref_out, exact)


def test_page_ids_outside_the_cache_are_never_read(kernel_device, triton_backend, monkeypatch):
    """A corrupt used table entry (huge or negative) neither faults nor leaks NaN; the other
    requests are unaffected. (The device-value checks, on by default for CPU tensors, report such
    tables: they are off here, where the kernel's own safety is tested.)"""
    monkeypatch.setenv("KVATTN_DEBUG", "0")
    hkv, group, d, page = 2, 4, 64, 16
    case = make_paged_kv([40, 50], num_kv_heads=hkv, head_dim=d, page_size=page, dtype=torch.float16,
                         device=kernel_device, seed=9)
    q = torch.randn(2, hkv * group, d).to(kernel_device, torch.float16)
    good = kvattn.decode.xqa_batch_decode_with_kv_cache(
        q, case.kv_cache, torch.zeros(1 << 20, dtype=torch.uint8, device=kernel_device), case.block_tables,
        case.seq_lens, 64, bmm1_scale=0.125)
    tables = case.block_tables.clone()
    tables[0, 0], tables[0, 1] = 2**31 - 1, -(2**31)
    out = poison_(torch.empty_like(q))
    kvattn.decode.xqa_batch_decode_with_kv_cache(
        q, case.kv_cache, torch.zeros(1 << 20, dtype=torch.uint8, device=kernel_device), tables,
        case.seq_lens, 64, bmm1_scale=0.125, out=out)
    if ON_GPU:
        torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()
    assert torch.equal(out[1], good[1])
    assert not torch.equal(out[0], good[0])
