"""An L2 ``evict_first`` hint on a kernel's TMA copies, which Triton cannot say.

Why: a K/V tile is read once, so marking its lines evict-first keeps the rest of L2 (dirty lines of earlier
kernels, the query, the partials) from being evicted and written back while the cache streams through (single
decode 4096 on an H100: 34.0 us with the hint on register loads, 38.8 without, ``lab/notes/single-decode.md`` "Single
decode: the L2 hint on pipelined copies"). Triton 3.6 passes ``eviction_policy="evict_first"`` to register loads
only: a software-pipelined ``cp.async`` copy drops it, and tensor-descriptor (TMA) loads take no such argument.

Why TMA only: ``cp.async`` copies with a cache policy are miscompiled by the ptxas Triton 3.6
ships (12.8: the ``LDGSTS`` reads its descriptor from a uniform register nothing writes; an
illegal instruction on the H100; NVIDIA fixed it in ptxas 13.4.59, and Triton disabled such
policies meanwhile). TMA copies (``UTMALDG``) get their policy register written.

How: a kernel that wants the hint calls :func:`mark_copies_evict_first` (an inline-asm comment
in its PTX). A pipeline-stages hook on Triton's CUDA backend (``knobs.runtime.
add_stages_inspection_hook``, chained to any hook already set, and set only while kvattn launches
a marked kernel: :func:`applied`) post-processes the PTX of marked kernels only: one ``createpolicy.fractional.L2::evict_first`` at the kernel's entry, and every
``cp.async.bulk.tensor`` global-to-shared copy rewritten to its ``.L2::cache_hint`` form carrying
that policy (PTX ISA 8.0, sm_90). Same data, addresses and synchronisation: only the L2
replacement priority of the copied lines changes. The marker's text is part of the kernel's
source, so the hinted binary has its own Triton cache key.
"""

from __future__ import annotations

import contextlib
import hashlib
import re

import triton
import triton.language as tl

from .device import is_interpreter

# Bump the version when the rewrite changes (here and in mark_copies_evict_first's asm): the
# marker's text is in the kernel's source, hence in its Triton cache key.
MARKER = "kvattn:tma-l2-evict-first:v1"
POLICY_REG = "%kvattn_l2_evict_first"

# Triton 3.6 writes the destination as shared::cluster, 3.7 as shared::cta (PTX ISA 8.6).
_COPY = re.compile(
    r"(cp\.async\.bulk\.tensor\.[1-5]d\.shared::(?:cluster|cta)\.global(?:\.tile)?\.mbarrier::complete_tx::bytes)"
    r"(\s+\[[^\]]*\],\s*\[[^\]]*\],\s*\[[^\]]*\]);"
)
_ENTRY = re.compile(r"^\.(?:visible\s+)?\.entry\s", re.M)
_ON_GPU: tl.constexpr = tl.constexpr(not is_interpreter())  # the interpreter has no inline asm


@triton.jit
def mark_copies_evict_first():
    """Tag this kernel's PTX so that its TMA copies get an L2 ``evict_first`` policy (a no-op in
    the interpreter)."""
    if _ON_GPU:
        tl.inline_asm_elementwise(
            "mov.u32 $0, 0; // kvattn:tma-l2-evict-first:v1", "=r,r", [tl.program_id(0)], dtype=tl.int32,
            is_pure=False, pack=1,
        )


def rewrite_ptx(ptx: str) -> str:
    """``ptx`` with every TMA copy of a marked kernel carrying an L2 evict-first policy.

    Unmarked PTX, and marked PTX without TMA copies, come back unchanged. Raises ``ValueError`` on
    a module with more than one kernel or a copy already carrying a policy: shapes this rewrite
    was not written for (Triton emits one entry a module, and plain copies).
    """
    if MARKER not in ptx:
        return ptx
    if len(_ENTRY.findall(ptx)) != 1:
        raise ValueError("ptx_hints: expected one .entry in a marked PTX module")
    if re.search(r"cp\.async\.bulk\.tensor[^;]*cache_hint", ptx):
        raise ValueError("ptx_hints: a TMA copy already carries a cache policy")
    body, copies = _COPY.subn(rf"\1.L2::cache_hint\2, {POLICY_REG};", ptx)
    if copies == 0:
        return ptx
    # The policy register is declared at the top of the entry's body and set before its first
    # instruction (after declarations, directives and labels), so it dominates every copy.
    lines = body.split("\n")
    start = next(i for i, line in enumerate(lines) if _ENTRY.match(line))
    brace = next(i for i in range(start, len(lines)) if lines[i].strip() == "{")
    first = next(i for i in range(brace + 1, len(lines))
                 if lines[i].strip() and not lines[i].lstrip().startswith((".", "//"))
                 and not lines[i].rstrip().endswith(":"))
    lines[first:first] = [f"\tcreatepolicy.fractional.L2::evict_first.b64 {POLICY_REG}, 1.0;"]
    lines[brace + 1:brace + 1] = [f"\t.reg .b64 {POLICY_REG};"]
    return "\n".join(lines)


# The Triton versions whose stage-hook protocol this module speaks. 3.6 calls the hook with
# ``(backend, stages, options, language, capability)`` while building the pipeline; 3.7 also calls
# it with no arguments, on every ``JITFunction`` launch and in ``triton.compile``, for a
# ``(key, hash)`` pair folded into the cache keys. Elsewhere no hook is set: marked kernels then
# compile and run without the hint (the marker is a PTX comment), which is the portable fallback.
HOOK_VERSIONS = ("3.6", "3.7")
HOOK_SUPPORTED = triton.__version__.startswith(HOOK_VERSIONS)
_KEY = f"kvattn-ptx-hints:{MARKER}"
_KEY_HASH = hashlib.sha256(_KEY.encode()).hexdigest()


def chained_hook(previous):
    """A stages hook that runs ``previous`` (any hook already set, or None) first, then puts
    :func:`rewrite_ptx` after the PTX stage of sm_90+ CUDA pipelines. Called with no arguments (the
    3.7 cache-key protocol) it returns ``(key, hash)`` covering ``previous``'s pair too."""

    def hook(*args):
        if not args:
            if previous is None:
                return _KEY, _KEY_HASH
            key, digest = previous()
            return key + _KEY, hashlib.sha256((digest + _KEY_HASH).encode()).hexdigest()
        backend, stages, options, language, capability = args
        if previous is not None:
            previous(backend, stages, options, language, capability)
        make_ptx = stages.get("ptx")
        if make_ptx is None or capability is None or capability < 90:
            return

        def ptx_stage(src, metadata):
            return rewrite_ptx(make_ptx(src, metadata))

        stages["ptx"] = ptx_stage

    hook.kvattn_ptx_hints = True
    return hook


@contextlib.contextmanager
def applied():
    """Within this block Triton compiles with the rewrite in its CUDA pipeline; outside it the
    hook that was set before (usually none) is back.

    Why scoped, not installed at import: the hook is process-wide, so an installed one would sit
    in every other library's compiles, and from Triton 3.7 on it is also called on every launch of
    every kernel and changes every kernel's cache key. kvattn enters this block only around the
    launches of its marked kernels that may compile (the first, or every one where Triton's own
    launch path runs: under 3.7 the hook's key is part of the marked kernel's key, so those
    launches must all see it). Another thread compiling meanwhile gets the rewrite too, which
    changes nothing in unmarked PTX.
    """
    if not HOOK_SUPPORTED:
        yield
        return
    runtime = triton.knobs.runtime
    previous = runtime.add_stages_inspection_hook
    if getattr(previous, "kvattn_ptx_hints", False):  # nested
        yield
        return
    runtime.add_stages_inspection_hook = chained_hook(previous)
    try:
        yield
    finally:
        runtime.add_stages_inspection_hook = previous
