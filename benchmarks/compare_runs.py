"""Table of a same-run comparison of two trees (``benchmarks/compare_trees.sh``): per shape, each
tree's graph-replay time (median of its rounds), the spread of its rounds (the run's noise), and
B's change against A; then both trees' eager host time per call.

    python benchmarks/compare_runs.py OUT_DIR NAME_A NAME_B
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def _times(out: Path, name: str) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for path in sorted(out.glob(f"{name}-r*.json")):
        for rec in json.loads(path.read_text()).get("records", []):
            if rec.get("impl") == "kvattn" and rec.get("status") == "ok" and rec.get("us"):
                times.setdefault(rec["shape"], []).append(float(rec["us"]))
    return times


def _host(out: Path, name: str) -> dict[str, float]:
    path = out / f"{name}-host.txt"
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            m = re.match(r"(.+?)\s+host\s+([\d.]+) us/call", line)
            if m:
                rows[m.group(1).strip()] = float(m.group(2))
    return rows


def table(out: Path, a: str, b: str) -> str:
    ta, tb = _times(out, a), _times(out, b)
    lines = [f"| shape | {a} us | spread | {b} us | spread | {b} vs {a} |", "|---|---|---|---|---|---|"]
    for shape in ta:
        if shape not in tb:
            continue
        ma, mb = statistics.median(ta[shape]), statistics.median(tb[shape])
        sa = (max(ta[shape]) - min(ta[shape])) / ma * 100
        sb = (max(tb[shape]) - min(tb[shape])) / mb * 100
        lines.append(f"| {shape} | {ma:.1f} | {sa:.1f} % | {mb:.1f} | {sb:.1f} % | {100 * (mb / ma - 1):+.1f} % |")
    ha, hb = _host(out, a), _host(out, b)
    if ha and hb:
        lines += ["", f"| eager call | {a} host us | {b} host us |", "|---|---|---|"]
        lines += [f"| {k} | {ha[k]:.1f} | {hb[k]:.1f} |" for k in ha if k in hb]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
