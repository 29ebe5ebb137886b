"""Table of a same-run comparison of trees (``benchmarks/compare_trees.sh``): per shape, each
tree's graph-replay time (median of its rounds), the spread of its rounds (the run's noise), and
each other tree's change against the first; then the trees' eager host time per call.

    python benchmarks/compare_runs.py OUT_DIR NAME_A NAME_B [NAME_C ...]
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


def table(out: Path, a: str, *others: str) -> str:
    ta = _times(out, a)
    tos = {b: _times(out, b) for b in others}
    head = f"| shape | {a} us | spread |" + "".join(f" {b} us | spread | {b} vs {a} |" for b in others)
    lines = [head, "|---|---|---|" + "---|---|---|" * len(others)]
    for shape in ta:
        if not all(shape in tb for tb in tos.values()):
            continue
        ma = statistics.median(ta[shape])
        row = f"| {shape} | {ma:.1f} | {(max(ta[shape]) - min(ta[shape])) / ma * 100:.1f} % |"
        for tb in tos.values():
            mb = statistics.median(tb[shape])
            sb = (max(tb[shape]) - min(tb[shape])) / mb * 100
            row += f" {mb:.1f} | {sb:.1f} % | {100 * (mb / ma - 1):+.1f} % |"
        lines.append(row)
    hosts = {name: _host(out, name) for name in (a, *others)}
    if all(hosts.values()):
        lines += ["", "| eager call |" + "".join(f" {name} host us |" for name in hosts), "|---|" + "---|" * len(hosts)]
        lines += [f"| {k} |" + "".join(f" {h[k]:.1f} |" for h in hosts.values())
                  for k in hosts[a] if all(k in h for h in hosts.values())]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]), *sys.argv[2:]))
