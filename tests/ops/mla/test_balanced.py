"""MLA's balanced split of ragged batches (``BALANCED``: common.balance.launch_unit, the combine's
balanced_combine_kernel) against the oracles, and the plan's rule for taking it.

Each case forces a few splits a launch (short min_chunk, several waves, a split count under the
one the longest request allows) so the plan takes the balanced kernel; a ragged batch then cuts its keys into units of one chunk length counted for the
launch (a long request gets more units than the uniform split count, a short one one), an equal
batch keeps the uniform split inside the same kernel. Lengths 0 and 1, one giant among tiny ones,
more requests than the interpreter's programs a wave, two head blocks, Q 1 and 2 (MTP).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvattn.ops.common.combine import balanced_combine_kernel
from kvattn.ops.mla import configs as mla_configs
from kvattn.ops.mla import plan as mla_plan

from ..oracle import GPU_ONLY, ON_GPU
from .test_mla import graph_replay_case, mla_case, ops_case
from .test_mtp import ops_mtp_case


@pytest.fixture
def built(monkeypatch):
    """The split and combine launches the plans build: every call plans afresh (plans under an
    override are not cached; no plan or replayed call of another test is reused)."""
    monkeypatch.setattr(mla_plan, "_PLANS", {})
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")
    got = {"split": [], "combine": []}
    real_split, real_combine = mla_plan._Plan._split, mla_plan._Plan._combine
    monkeypatch.setattr(mla_plan._Plan, "_split", lambda self, *a: got["split"].append(real_split(self, *a))
                        or got["split"][-1])
    monkeypatch.setattr(mla_plan._Plan, "_combine", lambda self, *a: got["combine"].append(real_combine(self, *a))
                        or got["combine"][-1])
    return got


def balanced_units(lens, splits, block_n, min_chunk, cap=mla_configs.MAX_UNITS):
    """The plan's unit counts, as the kernels derive them (common.balance.launch_unit)."""
    total, longest, batch = sum(lens), max(lens), len(lens)
    if longest * batch * 4 <= 5 * total:
        return [splits] * batch
    target = max(batch * (splits - 1), 1)
    chunk = max(-(-total // target), -(-longest // cap))
    chunk = max(-(-chunk // block_n) * block_n, min_chunk)
    return [max(1, -(-n // chunk)) for n in lens]


GIANT = 150 if not ON_GPU else 6000  # keys of the long request (many tiles: the interpreter's are 16)
CASES = [
    # (lengths, heads, page, waves): a long request with more units than the uniform split count
    pytest.param([0, 1, GIANT, 3], 16, 16, 4, id="B4-Hq16-lens-0-1-giant-3"),
    pytest.param([GIANT + 50, 1, 2, 1, 0, 3], 16, 16, 2, id="B6-Hq16-one-giant-among-tiny"),
    pytest.param([5, 90, 1, 0, 17, 33, 2, 60, 9, 1, 40, 3], 16, 32, 3,
                 id="B12-Hq16-more-requests-than-programs"),
    pytest.param([40, 41, 39, 44], 16, 16, 4, id="B4-Hq16-equal-lengths-uniform-inside"),
    pytest.param([70, 2, 0, 1], 20, 16, 4, id="B4-Hq20-two-head-blocks"),
]


@pytest.mark.parametrize("lens,hq,page,waves", CASES)
def test_mla_balanced_split_matches_oracles(lens, hq, page, waves, kernel_device, built):
    over = dict(min_chunk=16, waves=waves, max_splits=2, **({"block_h": 16} if hq == 20 else {}))
    with mla_configs.override(**over):
        ops_case(kernel_device, lens=lens, hq=hq, page=page, seed=len(lens) + hq)
    launch = built["split"][-1]
    assert launch.constexprs["BALANCED"], "the launch did not take the balanced split"
    splits = launch.fixed["num_splits"]
    assert splits >= 2 and built["combine"][-1].kernel is balanced_combine_kernel
    if not ON_GPU and max(lens) > 100:  # the giant gets more units than the uniform split count
        assert max(balanced_units(lens, splits, launch.constexprs["BLOCK_N"], 16)) > splits


@pytest.mark.parametrize("lens,hq", [([40, 1, 0, 3], 16), ([2, 40, 1], 8)], ids=["B4-Hq16", "B3-Hq8"])
def test_mla_balanced_split_mtp_two_tokens(lens, hq, kernel_device, built):
    """Q 2: a request shorter than Q among long ones; the LSE from the balanced combine."""
    with mla_configs.override(min_chunk=16, waves=4, max_splits=2):
        ops_mtp_case(kernel_device, lens=lens, q_len=2, hq=hq, page=16, seed=len(lens))
    assert built["split"][-1].constexprs["BALANCED"]


# GPU: the public function on the kernels sm90 gives these launches: the warp-specialised Gluon
# kernel (bf16 and e4m3, pages of 64, 32 and 16), the Gluon kernel (return_lse: the MTP ops cases
# below) and the Triton kernel (fp8 cache with a bf16 query, heads in N, KVATTN_GLUON=0).
RAGGED_GPU = [1, 20000, 3, 0, 17, 5000, 64, 2049]
GPU_CASES = [
    pytest.param(dict(lens=RAGGED_GPU, hq=128, page=64), id="bf16-Hq128-p64-ws", marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=64, page=64), id="bf16-Hq64-p64-ws", marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=128, page=64, kv_format="fp8"), id="fp8-Hq128-p64-ws-e4m3",
                 marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=16, page=64, kv_format="fp8"), id="fp8-Hq16-p64-heads-as-n",
                 marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=128, page=16), id="bf16-Hq128-p16-ws", marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=64, page=32), id="bf16-Hq64-p32-ws", marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=32, page=32), id="bf16-Hq32-p32-ws-padded-heads", marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=128, page=16, kv_format="fp8"), id="fp8-Hq128-p16-ws-e4m3",
                 marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=128, page=16, gluon=False), id="bf16-Hq128-p16-triton", marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=128, page=64, gluon=False), id="bf16-Hq128-p64-triton", marks=GPU_ONLY),
    pytest.param(dict(lens=RAGGED_GPU, hq=128, page=64, kv_format="fp8", q_format="bfloat16"),
                 id="fp8-cache-bf16-q-Hq128-triton", marks=GPU_ONLY),
    pytest.param(dict(lens=[3000, 2990, 3010, 2950], hq=128, page=64), id="bf16-Hq128-p64-equal-lengths",
                 marks=GPU_ONLY),
]


@pytest.mark.parametrize("kw", GPU_CASES)
def test_mla_balanced_split_public_function(kw, kernel_device, triton_backend, monkeypatch, built):
    """Several splits forced (short min_chunk, several waves) so the ragged batch takes the
    balanced split in the kernel sm90 gives the launch: a 20000-key request among short ones."""
    with mla_configs.override(min_chunk=64, waves=4, max_splits=16):
        mla_case(kernel_device, monkeypatch, **kw, seed=17)
    assert any(launch.constexprs["BALANCED"] for launch in built["split"])


@pytest.mark.skipif(not ON_GPU, reason="GPU grid")
@pytest.mark.parametrize("hq,page", [(32, 64), (32, 16), (32, 32), (16, 16)],
                         ids=["Hq32-p64-gluon-lse", "Hq32-p16-gluon-lse", "Hq32-p32-gluon-lse", "Hq16-p16-triton"])
def test_mla_balanced_split_mtp_gpu(hq, page, kernel_device, built):
    """Q 2 with the LSE (the Gluon kernel over pages of 64, 32 and 16: 64 rows; 32 rows: the
    Triton kernel), ragged."""
    with mla_configs.override(min_chunk=64, waves=4, max_splits=8):
        # (a workspace with room for the splits: 1 MiB holds one split of 5 x 64 rows)
        ops_mtp_case(kernel_device, lens=[4000, 1, 0, 700, 2], q_len=2, hq=hq, page=page, seed=9,
                     ws_bytes=32 << 20)
    launch = built["split"][-1]
    assert launch.constexprs["BALANCED"]
    assert (launch.kernel is mla_plan.mla_gluon_kernel) is (hq == 32), "the LSE's 64 rows: the Gluon kernel"


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("hq,kv_format,page", [(16, "bfloat16", 64), (128, "bfloat16", 64), (128, "fp8", 64),
                                               (128, "bfloat16", 16), (32, "bfloat16", 32), (128, "fp8", 32)],
                         ids=["bf16-Hq16", "bf16-Hq128", "fp8-Hq128", "bf16-Hq128-p16", "bf16-Hq32-p32",
                              "fp8-Hq128-p32"])
def test_mla_balanced_graph_replays_equal_and_ragged_lengths(hq, kv_format, page, triton_backend, built):
    """One capture (several splits a request: the balanced kernel) replayed on equal lengths (the
    uniform split inside it), then ragged ones (units), then equal again: the plan is the device's."""
    with mla_configs.override(max_splits=8):
        graph_replay_case(hq, [3000, 2900, 3100, 3050], [(2, [6000, 1, 0, 40], 1.0),
                                                        (3, [2000, 2100, 1990, 2050], 0.7),
                                                        (4, [17, 6300, 64, 3000], 1.3)], kv_format=kv_format,
                          page=page)
    assert built["split"] and all(launch.constexprs["BALANCED"] for launch in built["split"])


def test_mla_balanced_rule():
    """The balanced split needs several splits (partials, and more units than requests in the
    grid), fewer than the longest request's span allows at min_chunk keys a split, two to
    MAX_BALANCED_BATCH requests, and not batch-invariant mode."""
    rule = dict(span=4096, min_chunk=256)  # 16 splits of min_chunk keys
    assert mla_configs.balanced(splits=2, batch=2, invariant=False, **rule)
    assert mla_configs.balanced(splits=15, batch=mla_configs.MAX_BALANCED_BATCH, invariant=False, **rule)
    assert not mla_configs.balanced(splits=16, batch=8, invariant=False, **rule)
    assert not mla_configs.balanced(splits=6, batch=5, invariant=False, span=1433, min_chunk=256)  # sw71's
    assert not mla_configs.balanced(splits=1, batch=100, invariant=False, **rule)
    assert not mla_configs.balanced(splits=8, batch=1, invariant=False, **rule)
    assert not mla_configs.balanced(splits=8, batch=mla_configs.MAX_BALANCED_BATCH + 1, invariant=False, **rule)
    assert not mla_configs.balanced(splits=8, batch=4, invariant=True, **rule)


def test_mla_one_split_and_batch_invariant_keep_the_uniform_split(kernel_device, built, monkeypatch):
    """One split a request (no combine) and batch-invariant mode (fixed-span splits) launch the
    uniform path, and the decode family's combine merges the invariant launch's splits."""
    ops_case(kernel_device, lens=[1, 37, 0, 70], hq=16, page=16, seed=5)
    assert built["split"][-1].fixed["num_splits"] == 1 and not built["split"][-1].constexprs["BALANCED"]
    monkeypatch.setenv("KVATTN_BATCH_INVARIANT", "1")
    with mla_configs.override(invariant_span=16):
        ops_case(kernel_device, lens=[1, 37, 0, 70], hq=16, page=16, seed=6)
    launch = built["split"][-1]
    assert launch.fixed["num_splits"] >= 2 and not launch.constexprs["BALANCED"]
    # (the Gluon kernels round the span up to their 64-key box)
    assert launch.constexprs["SPLIT_SPAN"] in (16, 64) and built["combine"][-1].kernel is not balanced_combine_kernel


def test_mla_balanced_split_is_the_same_rule_for_every_kernel():
    """The Gluon kernels take the balanced split as the Triton kernel does (common.gluon_balance)."""
    plan = mla_plan._Plan.__new__(mla_plan._Plan)
    plan.batch, plan.invariant, plan.cfg = 8, False, SimpleNamespace(min_chunk=256)
    for plan.gluon in (True, False):
        assert plan.balanced(4, 4096) and not plan.balanced(1, 4096) and not plan.balanced(4, 1024)
