"""Plot a results JSON: fraction of the ceiling per shape, kvattn next to its peers.

    python benchmarks/plot.py results.json [--out results.png]

One horizontal group of bars per shape: kvattn, the best SDPA backend on pre-gathered K/V, the best
SDPA backend including the gather, and FlexAttention (paged, or gathered where paged flex failed).
Without matplotlib it prints a message and exits 1 (no plot is written).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (label, colour, record predicate): one bar per series and shape, the best matching record.
SERIES = (
    ("kvattn", "#d62728", lambda r: r["family"] == "kvattn"),
    ("SDPA (K/V pre-gathered)", "#1f77b4", lambda r: r["family"] == "sdpa" and not r["includes"]),
    ("SDPA incl. gather", "#aec7e8", lambda r: r["family"] == "sdpa" and r["includes"]),
    ("FlexAttention", "#2ca02c", lambda r: r["family"] == "flex" and not r["includes"]),
    ("FlashInfer", "#9467bd", lambda r: r["family"] == "flashinfer" and not r.get("check_failed")),
)


def best_fractions(doc: dict) -> tuple[list[str], dict[str, list[float | None]], dict[str, list[str]]]:
    """Shapes in run order; per series the best fraction per shape and the implementation that made it."""
    shapes: list[str] = []
    for r in doc["records"]:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    values = {name: [] for name, _, _ in SERIES}
    labels = {name: [] for name, _, _ in SERIES}
    for shape in shapes:
        recs = [r for r in doc["records"] if r["shape"] == shape and r["status"] == "ok" and r.get("fraction")]
        for name, _, pred in SERIES:
            match = [r for r in recs if pred(r)]
            best = max(match, key=lambda r: r["fraction"]) if match else None
            values[name].append(best["fraction"] if best else None)
            labels[name].append(best["impl"] if best else "")
    return shapes, values, labels


def plot(doc: dict, out: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed; no plot written (pip install matplotlib)", file=sys.stderr)
        return False
    shapes, values, _ = best_fractions(doc)
    n = len(SERIES)
    height = 0.8 / n
    fig, ax = plt.subplots(figsize=(11, 0.32 * n * len(shapes) + 1.8))
    for i, (name, colour, _) in enumerate(SERIES):
        ys = [k + (i - (n - 1) / 2) * height for k in range(len(shapes))]
        xs = [v if v is not None else 0.0 for v in values[name]]
        ax.barh(ys, xs, height=height, color=colour, label=name)
    ax.set_yticks(range(len(shapes)))
    ax.set_yticklabels(shapes, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("fraction of the ceiling measured in the same run (graph replay; decode: copy BW, prefill: matmul)")
    env, c = doc["env"], doc.get("ceilings") or {}
    ax.set_title(f"{env['device']}  {env['date'][:10]}  torch {env['torch']}  triton {env['triton']}\n"
                 f"copy {c.get('copy_gbps') or 0:.0f} GB/s, bf16 {c.get('matmul_bf16_tflops') or 0:.0f} TFLOP/s, "
                 f"fp8 {c.get('matmul_fp8_tflops') or 0:.0f} TFLOP/s", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=130)
    print(f"plot.py: wrote {out}")
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Plot a benchmarks/run.py results JSON")
    p.add_argument("results", help="the JSON written by run.py")
    p.add_argument("--out", default=None, help="PNG path (default: next to the JSON)")
    args = p.parse_args(argv)
    doc = json.loads(Path(args.results).read_text())
    return 0 if plot(doc, args.out or str(Path(args.results).with_suffix(".png"))) else 1


if __name__ == "__main__":
    sys.exit(main())
