"""Imported first by a benchmark file run as a script (``python benchmarks/run.py``): puts the
repository root (for ``benchmarks.*``) and ``src/`` (for an uninstalled ``kvattn``) on ``sys.path``.
Run as a module (``python -m benchmarks.run``) the files do not need it."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "src"):  # src/ ends up first
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
