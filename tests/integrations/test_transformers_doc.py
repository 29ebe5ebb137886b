"""Every Python block of ``docs/transformers.md`` runs as written on the CPU tier (the reference
backend; on a GPU, the kernels) and prints what its ``# prints:`` lines say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "transformers.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)


def test_the_doc_has_both_sections_code():
    assert len(BLOCKS) == 2
    assert "generate_batch(" in BLOCKS[0] and "def decode_step" in BLOCKS[1]


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=["transformers", "engine-loop"][:len(BLOCKS)])
def test_block_runs_and_prints_what_it_says(index, monkeypatch):
    if "transformers" in BLOCKS[index].split("\n", 1)[0]:
        pytest.importorskip("transformers")
    monkeypatch.delenv("KVATTN_BACKEND", raising=False)
    block = BLOCKS[index]
    expected = re.findall(r"^# prints: (.*)$", block, flags=re.M)
    assert expected, "every block says what it prints"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, f"{DOC.name} python block {index}", "exec"), {"__name__": "__doc_block__"})  # noqa: S102
    assert out.getvalue().splitlines() == expected
