"""benchmarks/README.md lists every file of ``benchmarks/`` in its "Files" table, one line each, and
names no file that is gone."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _files_table() -> str:
    text = (BENCH / "README.md").read_text()
    return text.split("## Files", 1)[1].split("\n## ", 1)[0]


def test_every_script_is_listed_and_every_listed_file_exists():
    table = _files_table()
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    listed = {name for row in rows for name in re.findall(r"`([\w.]+\.(?:py|sh))`", row.split(" | ")[0])}
    present = {p.name for p in BENCH.iterdir() if p.is_file() and p.suffix in (".py", ".sh")}
    assert present - listed == set(), f"not in benchmarks/README.md's Files table: {sorted(present - listed)}"
    assert listed - present == set(), f"listed but not in benchmarks/: {sorted(listed - present)}"
    assert len(rows) == len(set(rows))
