"""Kernel signatures stay short: no JIT function of kvattn takes more than MAX_PARAMETERS
parameters (a signature past that is where a tuple of strides or sizes does), and the tuple
parameters the launches name by member (``SPLIT_TUPLES``, ``CONTEXT_TUPLES``) are parameters of
their kernels, constexpr tuples annotated as such.

Read from the source (no kernel is compiled or run here).
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

import kvattn
from kvattn.ops.decode import kernels as decode_kernels
from kvattn.ops.prefill import kernels as prefill_kernels

MAX_PARAMETERS = 60
OPS = pathlib.Path(kvattn.__file__).resolve().parent / "ops"


def _jit_functions():
    """``(module path, name, parameter count)`` of every ``@triton.jit`` / ``@gluon.jit`` function."""
    for path in sorted(OPS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(target, ast.Attribute) and target.attr == "jit":
                    args = node.args
                    yield path.relative_to(OPS.parent).as_posix(), node.name, len(
                        args.posonlyargs + args.args + args.kwonlyargs)


def test_no_kernel_takes_more_than_max_parameters():
    found = list(_jit_functions())
    assert len(found) > 50  # (the walk found the kernels)
    over = [f"{path}: {name} ({count})" for path, name, count in found if count > MAX_PARAMETERS]
    assert not over, over


@pytest.mark.parametrize("kernel,tuples", [
    pytest.param(decode_kernels.decode_split_kernel, decode_kernels.SPLIT_TUPLES, id="decode_split_kernel"),
    pytest.param(prefill_kernels.context_kernel, prefill_kernels.CONTEXT_TUPLES, id="context_kernel"),
])
def test_tuples_name_parameters_of_their_kernel(kernel, tuples):
    """Each tuple is a parameter of the kernel; an UPPER_CASE one (a constexpr tuple) is annotated
    ``tl.constexpr``, a runtime one is not; no member is named twice or as a parameter itself."""
    fn = kernel
    while hasattr(fn, "fn"):
        fn = fn.fn
    params = inspect.signature(fn).parameters
    for name, members in tuples.items():
        assert name in params, name
        assert ("constexpr" in str(params[name].annotation)) == name.isupper(), name
        assert len(members) >= 2
    members = [m for ms in tuples.values() for m in ms]
    assert len(members) == len(set(members))
    assert not set(members) & set(params)
