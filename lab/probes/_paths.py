"""Imported first by a probe run as a script (``python lab/probes/x.py``): puts the repository root
(for ``benchmarks.*``) and ``src/`` (for an uninstalled ``kvattn``) on ``sys.path``."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "src"):  # src/ ends up first
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
