"""Compile a kvattn kernel for Hopper (sm_90a) without a GPU, for tests that pin a compiler fact.

A subprocess without ``TRITON_INTERPRET`` runs Triton's own pipeline (TTGIR, PTX, ptxas) on the
kernel (a Triton or a Gluon one) with the given constexprs and returns the TTGIR and PTX text, the
shared memory the launch needs and ptxas's register / stack use (``cuobjdump -res-usage``, when
Triton ships the tool).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import triton

from kvattn.runtime import versions as _versions

_SCRIPT = r"""
import contextlib, importlib, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

case = json.loads(sys.argv[1])
module, name = case["kernel"].rsplit(".", 1)
fn = getattr(importlib.import_module(module), name)
sig, attrs, constexprs = {}, {}, {}


def typed(arg, path):  # the signature type of parameter (or tuple member) arg at path, by its name
    if arg in case["constexprs"]:
        constexprs[path] = case["constexprs"][arg]
        return "constexpr"
    if arg in case["descs"]:
        return case["descs"][arg]
    if arg.endswith("_ptr"):
        attrs[path] = [["tt.divisibility", 16]]
        return case["ptrs"].get(arg, case["default_ptr"])
    if arg.startswith("stride"):
        attrs[path] = [["tt.divisibility", 16]]
    return "fp32" if arg in case["floats"] else "i32"


for i, arg in enumerate(fn.arg_names):
    members = case["tuples"].get(arg)
    if members is None:
        sig[arg] = typed(arg, (i,))
    elif all(m in case["constexprs"] for m in members):  # a constexpr tuple
        sig[arg] = "constexpr"
        constexprs[(i,)] = tuple(case["constexprs"][m] for m in members)
    else:  # members typed as the parameters they stand for (a constexpr member: as Triton specialises a 1)
        sig[arg] = tuple(typed(m, (i, j)) for j, m in enumerate(members))
if case["gluon"]:
    from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
src = ASTSource(fn, signature=sig, attrs=attrs, constexprs=constexprs)
if case["ptx_hints"]:
    from kvattn.runtime.ptx_hints import applied as scope
else:
    scope = contextlib.nullcontext
with scope():
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 128),
                        options={"num_warps": case["warps"], "num_stages": case["stages"], **case["options"]})
usage = {}
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
if os.path.exists(tool):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        text = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK):(\d+)", text)}
    if case["sass"]:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(ck.asm["cubin"])
            f.flush()
            usage["sass"] = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
print(json.dumps({"ttgir": ck.asm["ttgir"], "ptx": ck.asm["ptx"], "shared": ck.metadata.shared, **usage}))
"""


# Whether the installed Triton is one kvattn is verified with on the GPU (kvattn.runtime.versions.GPU_VERIFIED).
GPU_VERIFIED_TRITON = triton.__version__.startswith(_versions.GPU_VERIFIED)


def _unverified(elsewhere: str) -> str:
    return (f"a compiler fact of the GPU-verified Tritons ({' / '.join(_versions.GPU_VERIFIED)}); "
            f"Triton {triton.__version__} is interpreter-tested only ({elsewhere})")


def gpu_verified_fact(elsewhere: str):
    """Mark a test that pins a compiler fact kvattn's GPU tables or schedules rest on: a fact of
    the Tritons verified on the GPU, skipped on the others, which the CPU tier runs in the
    interpreter only. ``elsewhere``: what a newer Triton was seen to do instead (what rests on the
    fact needs measuring again before that Triton is supported on the GPU)."""
    return pytest.mark.skipif(not GPU_VERIFIED_TRITON, reason=_unverified(elsewhere))


def skip_unless_gpu_verified(elsewhere: str) -> None:
    """:func:`gpu_verified_fact` for the rest of a test (after its version-independent checks)."""
    if not GPU_VERIFIED_TRITON:
        pytest.skip(_unverified(elsewhere))


def compile_sm90(kernel: str, constexprs: dict, *, ptrs: dict, floats: tuple = (), default_ptr: str = "*bf16",
                 warps: int = 4, stages: int = 3, gluon: bool = False, descs: dict | None = None,
                 sass: bool = False, ptx_hints: bool = False, options: dict | None = None,
                 tuples: dict | None = None) -> dict:
    """``{"ttgir", "ptx", "shared", "reg", "stack"}`` of ``kernel`` (``"module.name"``; a Gluon
    kernel with ``gluon``) compiled for sm_90a: pointer arguments typed by ``ptrs`` (else
    ``default_ptr``), tensor descriptors by ``descs`` (signature strings), ``floats`` fp32
    scalars, other scalars i32; with ``sass``, also ``"sass"`` (cuobjdump's disassembly).
    ``reg`` / ``stack`` / ``sass`` are absent where Triton has no cuobjdump. With ``ptx_hints``
    the compile runs inside :func:`kvattn.runtime.ptx_hints.applied`, as kvattn launches marked kernels.
    ``options``: more compile options (``maxnreg``). ``tuples``: the kernel's tuple parameters, each
    by its members' names (``kvattn.ops.decode.kernels.SPLIT_TUPLES``); every other argument names
    the members, typed as flat parameters of those names would be (a member named in
    ``constexprs``: a constexpr, as Triton specialises an int of 1), and a tuple all of whose
    members are in ``constexprs`` is a constexpr tuple."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    case = json.dumps(dict(kernel=kernel, constexprs=constexprs, ptrs=ptrs, floats=list(floats),
                           default_ptr=default_ptr, warps=warps, stages=stages, gluon=gluon, descs=descs or {},
                           sass=sass, ptx_hints=ptx_hints, options=options or {}, tuples=tuples or {}))
    res = subprocess.run([sys.executable, "-c", _SCRIPT, case], env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.fail(f"sm_90a compile of {kernel} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])
