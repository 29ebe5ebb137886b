"""``benchmarks/compare_runs.py``: the table of a same-run comparison of two or more trees
(``benchmarks/compare_trees.sh``), each tree against the first, from the trees' round files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import compare_runs  # noqa: E402


def _round(out: Path, name: str, r: int, times: dict) -> None:
    records = [{"impl": "kvattn", "status": "ok", "shape": shape, "us": us} for shape, us in times.items()]
    records.append({"impl": "kvattn", "status": "error", "shape": "broken", "us": None})
    (out / f"{name}-r{r}.json").write_text(json.dumps({"records": records}))


def test_every_tree_against_the_first(tmp_path):
    for r, scale in ((1, 1.0), (2, 1.02)):
        _round(tmp_path, "main", r, {"row a": 100.0 * scale, "row b": 50.0})
        _round(tmp_path, "deal", r, {"row a": 80.0 * scale, "row b": 55.0})
        _round(tmp_path, "host", r, {"row a": 100.0 * scale})  # (row b missing: the row is left out)
    two = compare_runs.table(tmp_path, "main", "deal").splitlines()
    assert two[0] == "| shape | main us | spread | deal us | spread | deal vs main |"
    assert two[2] == "| row a | 101.0 | 2.0 % | 80.8 | 2.0 % | -20.0 % |"
    assert two[3] == "| row b | 50.0 | 0.0 % | 55.0 | 0.0 % | +10.0 % |"
    three = compare_runs.table(tmp_path, "main", "deal", "host").splitlines()
    assert three[0].endswith("| host us | spread | host vs main |")
    assert three[2] == "| row a | 101.0 | 2.0 % | 80.8 | 2.0 % | -20.0 % | 101.0 | 2.0 % | +0.0 % |"
    assert len(three) == 3 and "broken" not in "\n".join(three)
