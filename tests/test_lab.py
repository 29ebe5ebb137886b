"""The lab notebook apart from the tool (``lab/``): topic files and result blocks small enough to
read, every pointer into ``lab/notes/`` from the code naming a file (and a section) that exists,
and ``lab/relink_notes.py`` rewriting the old notebook's citations."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lab"))
import relink_notes  # noqa: E402

LIMIT = 60 * 1024
POINTER = re.compile(r"lab/notes/([\w-]+\.md)(?:`*)\s*(?:\"([^\"\n]+))?")


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "lab").rglob("*.md")))
def test_lab_files_stay_readable(path):
    assert (ROOT / path).stat().st_size < LIMIT


def _sources():
    for top in ("src", "tests", "benchmarks", "lab/probes"):
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix in (".py", ".sh", ".md") and p.is_file() and p.name != "test_lab.py":
                yield p


def test_pointers_name_a_topic_file_and_its_section():
    titles = relink_notes.titles()
    bad = []
    for path in _sources():
        for m in POINTER.finditer(path.read_text()):
            name, title = m.group(1), m.group(2)
            if not (ROOT / "lab/notes" / name).is_file():
                bad.append(f"{path.relative_to(ROOT)}: {name} does not exist")
            elif title and not any(t.startswith(title.strip()) and n == name for t, n in titles.items()):
                bad.append(f"{path.relative_to(ROOT)}: {name} has no section {title!r}")
    assert not bad, "\n".join(bad)


def test_relink_rewrites_each_citation_form():
    known = {"Decode": "decode.md", "Decode: tiles, stages and warps": "decode.md", "Host path": "host-path.md",
             "Host path: calls replayed from their metadata": "host-path.md", "Triton versions": "triton-versions.md",
             "Torch versions: mutated op arguments without defaults": "triton-versions.md"}
    cases = {
        'benchmarks/NOTES.md "Decode: tiles, stages and warps"': 'lab/notes/decode.md "Decode: tiles, stages and warps"',
        "(see benchmarks/NOTES.md, Decode)": "(see lab/notes/decode.md)",
        "``benchmarks/NOTES.md``, Host path).": "``lab/notes/host-path.md``).",
        'NOTES.md "Host\n    # path: calls replayed from their metadata"':
            'lab/notes/host-path.md "Host\n    # path: calls replayed from their metadata"',
        "(benchmarks/NOTES.md, torch versions).": "(lab/notes/triton-versions.md, torch versions).",
    }
    for old, new in cases.items():
        assert relink_notes.relink(old, known) == (new, [])
    text, unresolved = relink_notes.relink("benchmarks/NOTES.md says so", known, "f.py")
    assert text == "benchmarks/NOTES.md says so" and unresolved == ["f.py: 'benchmarks/NOTES.md says so'"]
