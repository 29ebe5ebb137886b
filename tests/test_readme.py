"""The README works as written: every ``python`` block runs on CPU tensors and prints what its
``# prints:`` comments say; the test command of "Run the tests" is the one CI runs."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, flags=re.M | re.S)


PY_BLOCKS = _blocks("python")


def test_readme_has_one_example_per_function():
    calls = ("xqa_batch_decode_with_kv_cache(", "xqa.xqa(", "single_decode_with_kv_cache(",
             "xqa_batch_decode_with_kv_cache_mla(", "trtllm_batch_context_with_kv_cache(")
    assert len(PY_BLOCKS) >= 5
    for call in calls:
        assert any(call in b for b in PY_BLOCKS), call


@pytest.mark.parametrize("index", range(len(PY_BLOCKS)))
def test_readme_python_block_runs_and_prints_what_it_says(index, monkeypatch):
    monkeypatch.delenv("KVATTN_BACKEND", raising=False)  # the README's promise: CPU tensors, default backend
    block = PY_BLOCKS[index]
    expected = re.findall(r"^# prints: (.*)$", block, flags=re.M)
    assert expected, "every example says what it prints"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
    assert out.getvalue().splitlines() == expected


def test_readme_examples_pass_arguments_by_keyword():
    """The examples name what they pass to kvattn's functions: no bare positional arguments."""
    calls = 0
    for block in PY_BLOCKS:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).startswith("kvattn."):
                calls += 1
                assert not node.args, f"positional arguments in {ast.unparse(node)[:80]}"
    assert calls >= 6


def test_run_the_tests_command_is_what_ci_runs():
    section = README.split("### Run the tests", 1)[1]
    command = re.search(r"^```bash\n(.*?)\n```", section, flags=re.M | re.S).group(1).strip()
    assert command in (ROOT / ".ci" / "run").read_text()
