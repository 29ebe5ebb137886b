"""The PTX rewrite that puts an L2 evict-first policy on a marked kernel's TMA copies
(``kvattn.runtime.ptx_hints``), on PTX text (CPU). What ptxas makes of it is pinned on an sm_90a
compile in ``tests/ops/decode/test_codegen.py``, its speed in ``lab/notes/single-decode.md``
"Single decode: the L2 hint on pipelined copies"."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import triton

from kvattn.runtime import ptx_hints

COPY = ("@%p2 cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%r8], [%rd3, {%r31, %r9, %r275}], [%r6];")
PLAIN = "cp.async.cg.shared.global [ %r361 + 0 ], [ %rd184 + 0 ], 0x10, %r364;"


def module(*body: str, marked: bool = True) -> str:
    lines = [".version 8.7", ".target sm_90a", ".address_size 64", "", ".visible .entry k(", "\t.param .u64 k_param_0",
             ")", ".reqntid 128", "{", "\t.reg .b32 \t%r<300>;", "\t.reg .b64 \t%rd<10>;", "$L__func_begin0:",
             "\t.loc\t1 1 0", "", "// %bb.0:", "\tld.param.b64 \t%rd3, [k_param_0];"]
    if marked:
        lines += ["\t// begin inline asm", f"\tmov.u32 %r1, 0; // {ptx_hints.MARKER}", "\t// end inline asm"]
    return "\n".join(lines + [f"\t{b}" for b in body] + ["\tret;", "}"])


def test_the_kernels_marker_is_the_rewrites():
    """The marker text is written twice (the jit function's asm cannot read a Python global)."""
    import inspect

    assert ptx_hints.MARKER in inspect.getsource(ptx_hints.mark_copies_evict_first.fn)


@pytest.mark.parametrize("space", ["shared::cluster", "shared::cta"], ids=["triton3.6-cluster", "triton3.7-cta"])
def test_marked_tma_copies_carry_one_evict_first_policy(space):
    copy = COPY.replace("shared::cluster", space)
    got = ptx_hints.rewrite_ptx(module(copy, copy.replace("%r8", "%r10"), PLAIN))
    hinted = [line for line in got.splitlines() if "bulk.tensor" in line]
    assert len(hinted) == 2
    for line in hinted:
        assert re.search(r"complete_tx::bytes\.L2::cache_hint \[%r\d+\], \[%rd3, \{[^}]*\}\], \[%r\d+\], "
                         + re.escape(ptx_hints.POLICY_REG) + ";$", line.strip()), line
    # ptxas 12.8 miscompiles cp.async with a policy: plain copies stay as they were
    assert PLAIN in got and got.count("cache_hint") == 2
    lines = got.splitlines()
    decl = lines.index(f"\t.reg .b64 {ptx_hints.POLICY_REG};")
    create = [i for i, line in enumerate(lines) if "createpolicy" in line]
    assert lines[decl - 1] == "{" and len(create) == 1
    assert lines[create[0]].strip() == f"createpolicy.fractional.L2::evict_first.b64 {ptx_hints.POLICY_REG}, 1.0;"
    assert lines[create[0] + 1].strip().startswith("ld.param")  # before the first instruction, after labels
    assert create[0] < min(i for i, line in enumerate(lines) if "bulk.tensor" in line)


@pytest.mark.parametrize("ptx", [module(COPY, marked=False), module(PLAIN), module()],
                         ids=["unmarked", "marked-no-tma", "marked-no-copies"])
def test_other_ptx_is_left_alone(ptx):
    assert ptx_hints.rewrite_ptx(ptx) == ptx


@pytest.mark.parametrize("ptx", [module(COPY) + "\n" + module(COPY),
                                 module(COPY.replace("bytes [", "bytes.L2::cache_hint [").replace("];", "], %rd9;"))],
                         ids=["two-entries", "already-hinted"])
def test_shapes_it_was_not_written_for_are_refused(ptx):
    with pytest.raises(ValueError, match="ptx_hints"):
        ptx_hints.rewrite_ptx(ptx)


def _earlier(seen):
    def earlier(*args):
        if not args:  # the cache-key protocol of Triton 3.7
            return "earlier", "e" * 64
        backend, stages, options, language, capability = args
        seen.append(capability)
        stages["ptx"] = lambda src, metadata: module(COPY)
    return earlier


@pytest.mark.skipif(not ptx_hints.HOOK_SUPPORTED, reason="no stages hook on this Triton")
def test_applied_chains_the_hook_and_puts_the_earlier_one_back(monkeypatch):
    runtime = triton.knobs.runtime
    seen = []
    earlier = _earlier(seen)
    monkeypatch.setattr(runtime, "add_stages_inspection_hook", earlier)
    with ptx_hints.applied():
        with ptx_hints.applied():  # nested: chained once
            hook = runtime.add_stages_inspection_hook
        assert hook is runtime.add_stages_inspection_hook
        assert hook is not earlier and hook.kvattn_ptx_hints
        for capability, rewritten in ((90, True), (80, False)):
            stages = {}
            hook(None, stages, None, None, capability)
            assert ("cache_hint" in stages["ptx"]("llir", {})) is rewritten
        key, digest = hook()
        assert key.startswith("earlier") and ptx_hints.MARKER in key and len(digest) == 64
    assert runtime.add_stages_inspection_hook is earlier
    assert seen == [90, 80]  # the earlier hook ran once a call


@pytest.mark.skipif(not ptx_hints.HOOK_SUPPORTED, reason="no stages hook on this Triton")
def test_applied_sets_nothing_outside_its_block_even_on_error(monkeypatch):
    runtime = triton.knobs.runtime
    monkeypatch.setattr(runtime, "add_stages_inspection_hook", None)
    with pytest.raises(RuntimeError, match="boom"):
        with ptx_hints.applied():
            hook = runtime.add_stages_inspection_hook
            assert hook() == (ptx_hints._KEY, ptx_hints._KEY_HASH)
            raise RuntimeError("boom")
    assert runtime.add_stages_inspection_hook is None


def test_applied_is_a_no_op_on_versions_it_was_not_verified_with(monkeypatch):
    runtime = triton.knobs.runtime
    monkeypatch.setattr(ptx_hints, "HOOK_SUPPORTED", False)
    monkeypatch.setattr(runtime, "add_stages_inspection_hook", None)
    with ptx_hints.applied():
        assert runtime.add_stages_inspection_hook is None


def test_importing_kvattn_sets_no_hook():
    """A fresh interpreter: importing every kvattn module leaves Triton's process-wide hook unset."""
    code = ("import triton, kvattn, kvattn.ops, kvattn.ops.decode.kernels, kvattn.runtime.fast_launch; "
            "assert triton.knobs.runtime.add_stages_inspection_hook is None")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
