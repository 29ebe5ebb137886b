"""Kernel modules rebuilt from a textually patched copy of their source, for timing floors.

The library's kernels carry no experiment switch; a floor (``decode_floors.py``,
``mla_ws_floors.py``) is a kernel module's source with one part of the work taken out by exact
text replacements, loaded as a sibling of the original module (so its relative imports resolve)
from a file in a temporary folder (Triton and Gluon read a kernel's source from its file).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

_FOLDER = None


def patched_source(module: ModuleType, patches: list, floor: str, owner: str) -> str:
    """``module``'s source with ``patches`` applied in order: ``(text, replacement)`` pairs, or
    ``(text, replacement, copies)`` for a text that occurs more than once (every copy replaced);
    each text must occur exactly that many times (once for a pair), so an edit of the kernel that
    moves it fails loudly (naming ``owner``, the file that holds the patches) rather than timing
    the unpatched kernel."""
    text = Path(module.__file__).read_text()
    for old, new, *rest in patches:
        copies = rest[0] if rest else 1
        if text.count(old) != copies:
            raise RuntimeError(f"floor {floor!r}: the kernel source has {text.count(old)} copies of the patched text "
                               f"{old.splitlines()[0].strip()!r} (expected {copies}): update {owner}")
        text = text.replace(old, new)
    return text


def load_sibling(module: ModuleType, name: str, source: str) -> ModuleType:
    """``source`` imported as the module ``name`` in ``module``'s package (one file a name)."""
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = tempfile.TemporaryDirectory(prefix="kvattn-floors-")
    path = Path(_FOLDER.name) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"{module.__package__}.{name}", path)
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded
    spec.loader.exec_module(loaded)
    return loaded


def floor_attributes(patches: dict, floor_kernel):
    """A module ``__getattr__`` serving ``floor_kernel_<floor>`` as ``floor_kernel(floor)`` for
    each floor in ``patches``: how ``tests/ops/sm90.py`` names a kernel to compile (e.g.
    ``"benchmarks.decode_floors.floor_kernel_fp8mma"``)."""
    prefix = "floor_kernel_"

    def __getattr__(name: str):
        if name.startswith(prefix) and name[len(prefix):] in patches:
            return floor_kernel(name[len(prefix):])
        raise AttributeError(name)

    return __getattr__
