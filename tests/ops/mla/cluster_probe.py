"""Gluon probe kernels for a 2-CTA cluster with TMA multicast (compiled for sm_90a, never launched).

They pin what each Triton's Gluon can express of the design in lab/notes/mla.md "MLA: TMA
multicast across the head-block pair": the two 64-head programs of one (request, split) as one
cluster, a KV tile copied once from L2 and multicast into both CTAs' shared memory, each CTA's
score product on its own 64 query rows, and the tile's buffer refilled only when both CTAs have
released it. ``test_cluster_probe.py`` compiles them and reads the PTX.

Gluon's multi-CTA model: a program is the whole cluster (``program_id`` is the cluster's id), and
what each CTA holds is said by the layouts' ``cga_layout`` bases, in units of a CTA's tile (not of
elements): ``[[1, 0]]`` gives CTA ``r`` the ``r``-th half of dim 0, ``[[0, 0]]`` a copy of the
whole in each CTA. Layouts with bases are module constants here: a list literal inside a jitted
function becomes a Triton tuple, whose layout comparisons then raise.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from kvattn.ops.common.gluon_compat import tma_load

# KV tile: a copy in each CTA (the multicast destination); query rows and scores: split by rows.
KV_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2,
                                            cga_layout=[[0, 0]]))
Q_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2,
                                           cga_layout=[[1, 0]]))
Q_REGS = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[1, 0]]))
KV_REGS = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[0, 0]]))
S_ACC = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16],
                                               cga_layout=[[1, 0]]))
# Barriers: one a CTA (shape [2], CTA r holds element r), or one of the pair held by CTA 0 (the
# "leader" form Gluon uses for barriers that both CTAs signal).
BAR_EACH = gl.constexpr(mbarrier.MBarrierLayout([[1]]))
BAR_LEADER = gl.constexpr(mbarrier.MBarrierLayout([[0]]))


@gluon.jit
def _consumer(q_ptr, out_ptr, kv, qs, full, empty, n):
    """Both CTAs: their 64 query rows (of the cluster's 128) into shared memory, then per tile one
    score product against the multicast KV tile and a release of the tile on ``empty``."""
    pid = gl.program_id(0)
    r = gl.arange(0, 128, gl.SliceLayout(1, Q_REGS))
    c = gl.arange(0, 64, gl.SliceLayout(0, Q_REGS))
    qs.store(gl.load(q_ptr + pid * 128 * 64 + r[:, None] * 64 + c[None, :]))
    acc = gl.zeros([128, 64], gl.float32, S_ACC)
    for i in range(n):
        mbarrier.wait(full, i & 1)
        s = warpgroup_mma(qs, kv.permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(empty)
    ro = gl.arange(0, 128, gl.SliceLayout(1, S_ACC))
    co = gl.arange(0, 64, gl.SliceLayout(0, S_ACC))
    gl.store(out_ptr + pid * 128 * 64 + ro[:, None] * 64 + co[None, :], acc)


@gluon.jit
def _copier(kv_desc, kv, full, empty, n):
    """The copy warp: per tile, wait for the pair's release, expect the whole tile's bytes on this
    CTA's ``full`` barrier, and copy the tile with multicast."""
    pid = gl.program_id(0)
    for i in range(n):
        mbarrier.wait(empty, (i & 1) ^ 1)
        mbarrier.expect(full, 64 * 64 * 2)
        tma_load(kv_desc, [pid * 64 + i, 0], full, kv, multicast=True)


@gluon.jit
def multicast_probe_kernel(
    kv_desc,  # TMA descriptor of [rows, 64] bf16, box [64, 64], KV_SMEM
    q_ptr,  # [clusters, 128, 64] bf16
    out_ptr,  # [clusters, 128, 64] float32
    n,
):
    kv = gl.allocate_shared_memory(gl.bfloat16, [64, 64], KV_SMEM)
    qs = gl.allocate_shared_memory(gl.bfloat16, [128, 64], Q_SMEM)
    full = gl.allocate_shared_memory(gl.int64, [2], BAR_EACH)
    empty = gl.allocate_shared_memory(gl.int64, [1], BAR_LEADER)
    mbarrier.init(full, count=1)
    mbarrier.init(empty, count=1)
    gl.barrier(cluster=True)  # both CTAs' barriers initialised before any multicast copy lands
    gl.warp_specialize([(_consumer, (q_ptr, out_ptr, kv, qs, full, empty, n)),
                        (_copier, (kv_desc, kv, full, empty, n))], [1], [24])


@gluon.jit
def slice_probe_kernel(
    out_ptr,  # unused (the probe is compiled, not launched)
    SPLIT: gl.constexpr,
):
    """A 64-column piece of a multi-CTA shared buffer (a KV row buffer's TMA box or a half-width
    wgmma operand is such a piece): replicated (``SPLIT`` False) or split by rows."""
    if SPLIT:
        q = gl.allocate_shared_memory(gl.bfloat16, [128, 512], Q_SMEM)
        q.slice(64, 64, dim=1).store(gl.zeros([128, 64], gl.bfloat16, Q_REGS))
    else:
        kv = gl.allocate_shared_memory(gl.bfloat16, [64, 512], KV_SMEM)
        piece = kv.slice(64, 64, dim=1)
        x = piece.load(KV_REGS)
        piece.store(gl.where(x > 0, x, 0.0))
