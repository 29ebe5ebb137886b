"""Names of Gluon's API that moved between the Triton versions kvattn supports (3.6 and 3.7).

Gluon is Triton's explicit-layout language and is still experimental, so its spelling changes
between releases. Each name here is the one the installed Triton has, found by feature (what the
module holds), not by version string, so a Triton that keeps either spelling works. The Gluon
kernels import these names instead of the moving ones (``benchmarks/NOTES.md``, Triton versions).
"""

from __future__ import annotations

from triton.experimental.gluon import language as gl

# A barrier of the CTA's threads (orders their shared-memory accesses): ``gl.thread_barrier()`` in
# 3.6, ``gl.barrier()`` (with an optional cluster scope) from 3.7.
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
