"""What Gluon compiles of a 2-CTA cluster with TMA multicast, per Triton (sm_90a, no GPU needed).

The MLA seesaw kernel's two 64-head programs of one (request, split) read the same latent rows;
lab/notes/mla.md "MLA: TMA multicast across the head-block pair" designs them as one cluster
with each tile copied once and multicast. These tests compile the probe kernels of
``cluster_probe.py`` and pin, per Triton, what of that design Gluon lowers, so that the note's
verdict (not buildable on the GPU-verified 3.7.1, a 3.9-only path) is checked on every version
the CPU tier runs and a Triton that changes it fails here:

* 3.6: no multicast copy at all (``async_copy_global_to_shared`` has no ``multicast``).
* 3.7.1: cluster launch, multicast copy, per-CTA score products all lower; but an arrive on the
  pair's shared barrier is a local arrive (no cross-CTA release), and a multi-CTA shared buffer
  cannot be sliced (the seesaw slices every buffer into TMA boxes and half-width operands).
* 3.9: both of those lower (a remote ``mbarrier.arrive.shared::cluster``; slices compile).
"""

from __future__ import annotations

import inspect
import re

import pytest
import triton
from triton.experimental.gluon.language.nvidia.hopper import tma

from kvattn.runtime import versions as _versions

from ..sm90 import compile_sm90

pytestmark = pytest.mark.codegen  # compiled, not run: CI runs these (pyproject.toml markers)

VERSION = _versions.parse(triton.__version__)
HAS_MULTICAST = "multicast" in inspect.signature(getattr(tma, "async_load", None)
                                                 or tma.async_copy_global_to_shared).parameters
needs_multicast = pytest.mark.skipif(not HAS_MULTICAST, reason=f"Gluon of Triton {triton.__version__} has no TMA "
                                     "multicast (async_copy_global_to_shared(multicast=) is 3.7's)")

KV_SMEM = ("NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, transposed=False, "
           "fp4_padded=False, cga_layout=[[0, 0]])")
PROBE = "tests.ops.mla.cluster_probe."


def _multicast_probe() -> str:
    got = compile_sm90(PROBE + "multicast_probe_kernel", {}, ptrs={"q_ptr": "*bf16", "out_ptr": "*fp32"},
                       gluon=True, descs={"kv_desc": f"tensordesc<bf16[64, 64],{KV_SMEM}>"},
                       options={"num_ctas": 2})
    return got["ptx"]


def test_multicast_is_refused_where_gluon_lacks_it():
    """3.6's TMA copy takes no ``multicast``: the gate the note's variant would need is this one."""
    assert HAS_MULTICAST == (VERSION >= (3, 7, 0))


@needs_multicast
def test_cluster_multicast_and_split_rows_lower():
    """The parts that do lower from 3.7: a 2-CTA cluster launch, one multicast bulk-tensor copy a
    tile issued by CTA 0 only (its rank tested) into both CTAs, each CTA expecting the whole tile's
    8 KB on its own barrier, and each CTA's score product on its 64 rows (4 k-steps of m64n64k16,
    not 128-row ones)."""
    ptx = _multicast_probe()
    assert ".reqnctapercluster 2" in ptx
    copies = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
                        r"\.multicast::cluster", ptx)
    assert len(copies) == 1
    assert "%cluster_ctarank" in ptx
    assert re.search(r"mbarrier\.arrive\.expect_tx\.shared::cta\.b64 _, \[%r\d+\], 8192;", ptx)
    assert len(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16", ptx)) == 4
    if VERSION < (3, 9, 0):
        assert ".explicitcluster" in ptx and "%clusterid.x" in ptx  # program_id is the cluster's id


@needs_multicast
def test_release_across_the_pair_needs_triton_3_9():
    """The empty-buffer protocol: each CTA arrives on the pair's barrier (held by CTA 0) once it
    has read the tile. 3.7.1 lowers that arrive to a local one (each CTA arrives on its own copy,
    and CTA 1 skips the wait): CTA 0 would refill a buffer CTA 1 still reads. 3.9 lowers it to a
    remote arrive on CTA 0's barrier."""
    ptx = _multicast_probe()
    remote = re.findall(r"mbarrier\.arrive(?:\.release\.cluster)?\.shared::cluster\.b64", ptx)
    if VERSION >= (3, 9, 0):
        assert remote
    else:
        assert not remote and "mapa" not in ptx
        assert re.search(r"mbarrier\.arrive\.shared::cta\.b64 _, \[%r\d+\];", ptx)


@needs_multicast
@pytest.mark.parametrize("split", [False, True], ids=["replicated", "split-rows"])
def test_slicing_a_multi_cta_buffer_needs_triton_3_9(split):
    """The seesaw slices its shared buffers (64-column TMA boxes, half-width wgmma operands); a
    multi-CTA buffer's slice fails to compile under 3.7.1 and compiles under 3.9."""
    def compile_it():
        return compile_sm90(PROBE + "slice_probe_kernel", {"SPLIT": split}, ptrs={"out_ptr": "*fp32"}, gluon=True,
                            options={"num_ctas": 2})

    if VERSION >= (3, 9, 0):
        assert compile_it()["shared"] >= 64 * 512 * 2
    else:
        with pytest.raises(pytest.fail.Exception, match="non-trivial block dimension not supported"):
            compile_it()


@needs_multicast
@pytest.mark.parametrize("mc", [False, True], ids=["pair", "multicast"])
def test_copy_stand_in_compiles(mc):
    """``benchmarks/mla_multicast_copy.py`` (the device script timing the copy floor with and
    without multicast): per tile nine 64-column boxes, all multicast in the cluster form (issued
    by CTA 0), one cluster barrier per tile released and none in the pair form; the two 72 KB tile
    buffers fit one CTA an SM as the seesaw's do."""
    cga = "[[0, 0]]" if mc else "[]"
    layout = KV_SMEM.replace("cga_layout=[[0, 0]]", f"cga_layout={cga}")
    got = compile_sm90("benchmarks.mla_multicast_copy.copy_pair_kernel", {"MC": mc}, ptrs={"out_ptr": "*fp32"},
                       gluon=True, descs={"desc": f"tensordesc<bf16[64, 64],{layout}>"},
                       options={"num_ctas": 2 if mc else 1})
    ptx = got["ptx"]
    copies = re.findall(r"cp\.async\.bulk\.tensor\.2d[^;]*;", ptx)
    assert len(copies) == 4 * 9  # two tiles before the loop, two in it
    assert all(("multicast::cluster" in c) == mc for c in copies)
    # The loop's two releases and one before the first copy (3.9 adds its own at the exit).
    waits = len(re.findall(r"barrier\.cluster\.wait", ptx))
    assert (waits == 3 or (waits > 3 and VERSION >= (3, 9, 0))) if mc else waits == 0
    assert 2 * 64 * 576 * 2 <= got["shared"] <= 227 * 1024
    if "stack" in got:
        assert got["stack"] == 0
