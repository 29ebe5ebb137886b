"""Lines of the documentation that state facts of the code agree with the code: the torch range
of the README's install line is pyproject's, nothing cites a "SPEC" (the statement of the semantics
is docs/semantics.md), and semantics.md's word on ``return_lse`` matches each signature."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import kvattn

ROOT = Path(__file__).resolve().parent.parent


def test_readme_torch_range_is_pyprojects():
    spec = re.search(r'"torch>=([\d.]+),<(\d+)"', (ROOT / "pyproject.toml").read_text())
    low, high = spec.groups()
    install = (ROOT / "README.md").read_text().split("## Install", 1)[1].split("\n## ", 1)[0]
    assert f"({low} or newer, below {high})" in install
    assert ">= 2.4" not in install


def test_nothing_cites_a_spec_file():
    texts = [*(ROOT / "src").rglob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]
    for path in texts:
        for line in path.read_text().splitlines():
            assert not re.search(r"\bSPEC\b(?!S)|SPEC\.md", line), f"{path}: {line.strip()}"


def test_return_lse_keyword_only_but_where_flashinfer_has_it_positional():
    functions = (kvattn.xqa_batch_decode_with_kv_cache, kvattn.xqa.xqa, kvattn.xqa_batch_decode_with_kv_cache_mla)
    for fn in functions:
        assert inspect.signature(fn).parameters["return_lse"].kind is inspect.Parameter.KEYWORD_ONLY, fn.__name__
    for fn in (kvattn.single_decode_with_kv_cache, kvattn.trtllm_batch_context_with_kv_cache):
        assert inspect.signature(fn).parameters["return_lse"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    semantics = " ".join((ROOT / "docs" / "semantics.md").read_text().split())
    assert ("keyword-only but in single decode, whose FlashInfer signature has it positional after `rope_theta`, "
            "and in prefill, where FlashInfer 0.7.2.post1 has it positional") in semantics


def test_changelog_keeps_a_changelog_form():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (.*)$", text, flags=re.M)
    assert versions[0] == "[Unreleased]"
    for heading in versions[1:]:
        assert re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", heading), heading
    assert versions[1].startswith(f"[{kvattn.__version__}]")  # the version the package reports has its section
    kinds = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
    for section in re.split(r"^## .*$", text, flags=re.M)[1:]:
        subs = re.findall(r"^### (.*)$", section, flags=re.M)
        assert len(subs) == len(set(subs)), subs  # each kind of change once a version
        assert set(subs) <= set(kinds), subs
