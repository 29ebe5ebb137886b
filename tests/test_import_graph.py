"""The package's import graph, read from the source (every import statement, function-level ones
included): no circle among kvattn's modules, and the layers of docs/extending.md hold.

Rules:

- The lower layers, ``kvattn.ops.*`` (the kernel families) and ``kvattn.runtime.*`` (call cache,
  backend choice, switches, device facts, launcher), may import each other, kvattn's private
  modules (``kvattn._*``) and ``kvattn.formats`` (a leaf: the quantised formats' definitions,
  importing no kvattn module); never a public module (``kvattn`` itself, ``decode``, ``xqa``,
  ``mla``, ``prefill``, ``cli``, ``testing``, ``dense``, ``reference``, ``integrations`` ...).
- No family imports another sideways: ``kvattn.ops.<family>.*`` imports its own family,
  ``kvattn.ops.common`` and the lower layers only (what two families share lives in ``ops/common``).
- No module outside ``kvattn.runtime`` reaches into its internals: neither ``from
  kvattn.runtime.m import _name`` nor ``m._name`` on a runtime module it imported.
- No cycle: parent packages' ``__init__`` modules, which Python runs implicitly before a
  submodule, are not edges; only import statements are.
- The op registry (``runtime.backend.TRITON_OPS``) names real entry points, imported lazily.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import kvattn
from kvattn.runtime import backend as _backend

SRC = pathlib.Path(kvattn.__file__).resolve().parent
PACKAGE = "kvattn"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The kvattn modules ``module`` imports: ``import a.b``, ``from a import b`` (``a.b`` where
    that is a module, else ``a``), relative forms, at any depth of the source."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            # the longest known module the name starts with (``import kvattn.ops.x.y`` -> that module)
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE) and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


LOWER = (f"{PACKAGE}.ops", f"{PACKAGE}.runtime")
COMMON = f"{PACKAGE}.ops.common"


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _allowed_from_ops(target: str) -> bool:
    """What a lower-layer module (``ops`` or ``runtime``) may import: the lower layers, private
    modules, ``kvattn.formats``."""
    last = target.split(".")[1] if target.count(".") else ""
    return any(_in(target, p) for p in LOWER) or last.startswith("_") or target == f"{PACKAGE}.formats"


def _family(module: str) -> str | None:
    """``kvattn.ops.<family>`` of a module inside a kernel family (not ``ops.common``), else None."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == [PACKAGE, "ops"] and f"{PACKAGE}.ops.{parts[2]}" != COMMON:
        return ".".join(parts[:3])
    return None


def _sideways(module: str, target: str) -> bool:
    """An arrow from one kernel family into another."""
    own, other = _family(module), _family(target)
    return own is not None and other is not None and own != other


def runtime_internals_used(module: str, path: pathlib.Path, known: set[str]) -> list[str]:
    """The private names of ``kvattn.runtime`` modules that ``module`` (outside runtime) uses:
    ``from kvattn.runtime.m import _x`` or ``alias._x`` where ``alias`` is bound to a runtime
    module by an import."""
    if _in(module, f"{PACKAGE}.runtime"):
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    aliases: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in known and _in(full, f"{PACKAGE}.runtime"):
                    aliases[a.asname or a.name] = full
                elif _in(base, f"{PACKAGE}.runtime") and a.name.startswith("_"):
                    found.append(f"{base}.{a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _in(a.name, f"{PACKAGE}.runtime") and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_lower_layers_never_import_a_public_module():
    bad = [(m, t) for m, targets in import_graph().items() if any(_in(m, p) for p in LOWER)
           for t in targets if not _allowed_from_ops(t)]
    assert not bad, "\n".join(f"{m} imports {t}" for m, t in bad)


def test_no_family_imports_another():
    bad = [(m, t) for m, targets in import_graph().items() for t in targets if _sideways(m, t)]
    assert not bad, "\n".join(f"{m} imports {t}" for m, t in bad)


def test_nothing_outside_runtime_uses_its_private_names():
    modules = _modules()
    known = set(modules)
    bad = {m: used for m, path in modules.items() if (used := runtime_internals_used(m, path, known))}
    assert not bad, "\n".join(f"{m} uses {', '.join(sorted(set(u)))}" for m, u in bad.items())


def repository_imports(path: pathlib.Path) -> list[str]:
    """The imports of ``benchmarks`` (the repository's harness, which does not ship) in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found += [n for n in names if n == "benchmarks" or n.startswith("benchmarks.")]
    return found


def test_the_package_never_imports_the_repository_harness(tmp_path):
    """``kvattn bench`` runs on a user's machine: the package's harness is ``kvattn.benchmarking``,
    and the repository's ``benchmarks/`` builds on it, never the other way round."""
    bad = {m: used for m, path in _modules().items() if (used := repository_imports(path))}
    assert not bad, bad
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from benchmarks.timing import Timer\nimport benchmarks\nfrom . import x\n"
                     "import benchmarks_other\n")
    assert sorted(repository_imports(probe)) == ["benchmarks", "benchmarks.timing"]


def test_formats_is_a_leaf():
    """``kvattn.formats`` may be read from ``ops/`` because it imports no kvattn module."""
    assert import_graph()[f"{PACKAGE}.formats"] == set()


def test_the_checks_see_what_they_must():
    """The parser finds relative, absolute and function-level imports, and the two rules fire."""
    known = {"kvattn", "kvattn.decode", "kvattn.ops", "kvattn.ops.x", "kvattn.ops.x.launch", "kvattn._env"}
    src = ("from ... import decode\nfrom .launch import f\n"
           "def g():\n    from ..._env import h\n    import kvattn.ops.x.launch\n")
    path = pathlib.Path(__file__).parent / "_import_graph_probe.py"
    try:
        path.write_text(src)
        got = imports_of("kvattn.ops.x.op", path, known)
    finally:
        path.unlink()
    assert got == {"kvattn.decode", "kvattn.ops.x.launch", "kvattn._env"}
    assert not _allowed_from_ops("kvattn.decode") and not _allowed_from_ops("kvattn.testing")
    assert not _allowed_from_ops("kvattn")
    assert _allowed_from_ops("kvattn._inputs") and _allowed_from_ops("kvattn.ops.common")
    assert _allowed_from_ops("kvattn.runtime.fast_launch") and not _allowed_from_ops("kvattn.runtime_x")
    assert _sideways("kvattn.ops.mla.plan", "kvattn.ops.decode.kernels")
    assert not _sideways("kvattn.ops.mla.plan", "kvattn.ops.common.combine")
    assert not _sideways("kvattn.ops.mla.plan", "kvattn.ops.mla.kernels")
    assert not _sideways("kvattn.ops.common.splits", "kvattn.ops.decode")  # (the lower-layer rule's business)
    known = {"kvattn.runtime", "kvattn.runtime.env", "kvattn.runtime.device"}
    src = ("from kvattn.runtime import env as e, device\nfrom kvattn.runtime.env import _hidden, shown\n"
           "e._flag\ne.public\ndevice._facts\ndevice.__name__\n")
    try:
        path.write_text(src)
        used = runtime_internals_used("kvattn.ops.x.plan", path, known)
        inside = runtime_internals_used("kvattn.runtime.callcache", path, known)
    finally:
        path.unlink()
    assert sorted(used) == ["kvattn.runtime.device._facts", "kvattn.runtime.env._flag", "kvattn.runtime.env._hidden"]
    assert inside == []
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_importing_ops_imports_no_family():
    """The op registry is a static table: importing ``kvattn.ops`` registers nothing and imports
    no kernel family (each entry module is imported on first use)."""
    ops_init = import_graph()[f"{PACKAGE}.ops"]
    assert ops_init == set()


@pytest.mark.parametrize("op", sorted(_backend.TRITON_OPS))
def test_registry_names_real_entry_points(op):
    module = importlib.import_module(_backend.TRITON_OPS[op])
    assert module.__name__.startswith(f"{PACKAGE}.ops.") and callable(getattr(module, op))
