"""Names of Gluon's API that moved between the Triton versions kvattn compiles Gluon with.

Gluon is Triton's explicit-layout language and is still experimental, so its spelling changes
between releases. Each name here is the one the installed Triton has, found by feature (what the
module holds), not by version string, so a Triton that keeps either spelling works. The Gluon
kernels import these names instead of the moving ones (``lab/notes/triton-versions.md``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import tma

# A barrier of the CTA's threads (orders their shared-memory accesses): ``gl.thread_barrier()`` in
# 3.6, ``gl.barrier()`` (with an optional cluster scope) from 3.7.
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

# A TMA copy of a tensor descriptor's box into shared memory, counted on an mbarrier:
# ``tma.async_copy_global_to_shared(desc, coord, barrier, result, pred)`` in 3.6 and 3.7,
# ``tma.async_load`` (same leading arguments) from 3.9, where the old name only raises.
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

# A per-thread asynchronous copy of a pointer tensor into shared memory (``cp.async``, counted by
# ``async_copy.commit_group`` / ``wait_group``): ``async_copy.async_copy_global_to_shared(smem,
# pointer, mask)`` in 3.6 and 3.7, ``async_copy.async_load`` (same leading arguments) from 3.9.
cp_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

# A shared-memory view with another dtype, shape and layout over the same bytes: ``_reinterpret``
# in Triton 3.6 and 3.7, ``reinterpret`` from 3.9.
_REINTERPRET_PUBLIC = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def smem_view(smem, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    """``smem``'s bytes (from its start) seen as ``dtype [shape]`` under ``layout``."""
    if _REINTERPRET_PUBLIC:
        return smem.reinterpret(dtype, shape, layout)
    else:
        return smem._reinterpret(dtype, shape, layout)
