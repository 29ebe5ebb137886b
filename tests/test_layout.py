"""The shape of every kernel family (docs/extending.md, "Layers"): ``ops/<family>/`` holds its
kernels in ``kernels*.py`` and nowhere else, host code outside those files, the host plan in
``plan.py`` and the torch op in ``op.py``."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

import kvattn

OPS = pathlib.Path(kvattn.__file__).resolve().parent / "ops"
FAMILIES = sorted(p.name for p in OPS.iterdir() if p.is_dir() and p.name not in ("common", "__pycache__"))
JIT = {"jit", "constexpr_function"}  # triton.jit, gluon.jit, *.constexpr_function


def _decorators(node) -> set[str]:
    names = set()
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.add(d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", ""))
    return names


def _top_level(path: pathlib.Path):
    return [n for n in ast.parse(path.read_text()).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]


def test_families_are_found():
    assert {"append", "decode", "merge", "mla", "prefill"} <= set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_has_its_layers(family):
    files = {p.name for p in (OPS / family).glob("*.py")}
    assert {"kernels.py", "plan.py", "op.py"} <= files, files
    assert "launch.py" not in files


@pytest.mark.parametrize("family", FAMILIES)
def test_kernels_live_in_kernel_files_only(family):
    """``@jit`` functions only in ``kernels*.py``; those files hold no host function or class."""
    for path in sorted((OPS / family).glob("*.py")):
        defs = _top_level(path)
        if path.name.startswith("kernels"):
            host = [n.name for n in defs if not (_decorators(n) & JIT)]
            assert not host, f"{path.name}: host code {host} belongs in a plan module"
        else:
            jitted = [n.name for n in defs if isinstance(n, ast.FunctionDef) and "jit" in _decorators(n)]
            assert not jitted, f"{path.name}: kernels {jitted} belong in a kernels*.py file"


def test_the_check_sees_a_host_function(tmp_path):
    probe = tmp_path / "kernels_probe.py"
    probe.write_text("import triton\n@triton.jit\ndef k(x):\n    pass\ndef plan():\n    pass\n")
    defs = _top_level(probe)
    assert [n.name for n in defs if not (_decorators(n) & JIT)] == ["plan"]




def _grid_launches(tree) -> list[str]:
    """``kernel[grid](...)`` calls in a module: a call of a subscripted name or attribute."""
    return [ast.unparse(n.func.value) for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
            and isinstance(n.func.value, (ast.Name, ast.Attribute))]


@pytest.mark.parametrize("family", [*FAMILIES, "common"])
def test_every_launch_is_a_fast_launch(family):
    """One launch style (docs/extending.md, "A kernel family"): host code launches kernels through
    ``runtime.fast_launch.Launch`` objects of a cached plan, never ``kernel[grid](...)`` itself."""
    for path in sorted((OPS / family).glob("*.py")):
        if not path.name.startswith("kernels"):
            assert not _grid_launches(ast.parse(path.read_text())), f"{path.name} launches kernel[grid]"


def test_the_launch_check_sees_a_grid_launch():
    tree = ast.parse("def launch(x):\n    merge_kernel[(4,)](x, BLOCK=16)\n    table[0](x)\n")
    assert _grid_launches(tree) == ["merge_kernel", "table"]
