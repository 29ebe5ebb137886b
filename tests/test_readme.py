"""The README and docs/examples.md work as written: every ``python`` block runs on CPU tensors and
prints what its ``# prints:`` comments say; the README stays short (its line count is asserted),
names every public name in "API at a glance" with a link that resolves, and its test command is
the one CI runs. docs/layout.md lists every module of the package."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest

import kvattn

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXAMPLES = (ROOT / "docs" / "examples.md").read_text()
MAX_README_LINES = 150


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.M | re.S)


PY_BLOCKS = [("README", b) for b in _blocks(README, "python")] + [("examples", b) for b in _blocks(EXAMPLES, "python")]


def test_readme_is_short():
    assert len(README.splitlines()) <= MAX_README_LINES


def test_examples_have_one_example_per_function():
    calls = ("xqa_batch_decode_with_kv_cache(", "xqa.xqa(", "single_decode_with_kv_cache(",
             "xqa_batch_decode_with_kv_cache_mla(", "trtllm_batch_context_with_kv_cache(")
    blocks = _blocks(EXAMPLES, "python")
    assert len(blocks) >= 5
    for call in calls:
        assert any(call in b for b in blocks), call


@pytest.mark.parametrize("index", range(len(PY_BLOCKS)), ids=[f"{d}-{i}" for i, (d, _) in enumerate(PY_BLOCKS)])
def test_python_block_runs_and_prints_what_it_says(index, monkeypatch):
    monkeypatch.delenv("KVATTN_BACKEND", raising=False)  # the promise: CPU tensors, default backend
    doc, block = PY_BLOCKS[index]
    expected = re.findall(r"^# prints: (.*)$", block, flags=re.M)
    assert expected, "every example says what it prints"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, f"{doc} python block {index}", "exec"), {"__name__": "__readme__"})  # noqa: S102
    assert out.getvalue().splitlines() == expected


def test_examples_pass_arguments_by_keyword():
    """The examples name what they pass to kvattn's functions: no bare positional arguments."""
    calls = 0
    for _, block in PY_BLOCKS:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).startswith("kvattn."):
                calls += 1
                assert not node.args, f"positional arguments in {ast.unparse(node)[:80]}"
    assert calls >= 7


def test_run_the_tests_command_is_what_ci_runs():
    section = README.split("## Check it, test it", 1)[1]
    command = re.search(r"^```bash\n(.*?)\n```", section, flags=re.M | re.S).group(1).strip()
    assert command in (ROOT / ".ci" / "run").read_text()


def _api_section() -> str:
    return README.split("## API at a glance", 1)[1].split("\n## ", 1)[0]


def test_api_at_a_glance_names_every_public_name():
    cells = " ".join(re.findall(r"`([^`]+)`", _api_section()))
    words = set(re.findall(r"[\w.]+", cells))
    for name in kvattn.__all__:
        assert name in words or any(w.endswith("." + name) for w in words), name


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces -> -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_readme_link_resolves():
    links = re.findall(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)", README)
    assert len(links) >= 15
    for path, anchor in links:
        if path.startswith("http"):
            continue
        target = ROOT / path
        assert target.exists(), path
        if anchor:
            headings = re.findall(r"^#+ (.*)$", target.read_text(), flags=re.M)
            assert anchor in {_anchor(h) for h in headings}, (path, anchor)


def test_layout_lists_every_module():
    layout = (ROOT / "docs" / "layout.md").read_text()
    src = ROOT / "src" / "kvattn"
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        if rel.endswith("/__init__.py"):
            continue  # (a folder's package file: the folder is listed)
        assert f"`{rel}`" in layout, rel
