"""The console tables of results documents: :func:`aligned_lines` (columns two spaces apart under a
rule of dashes; ``benchmarks/report.py`` prints its one-line-a-shape table with it) and ``kvattn
bench``'s report (:func:`print_report`): a title line a function, then a line an implementation with
its times, rate, time over kvattn's and distance to kvattn's output, in ``WIDTH`` columns unless wide."""

from __future__ import annotations

import sys
import textwrap

from .._console import aligned_lines, format_rate

__all__ = ["HEADER", "WIDTH", "aligned_lines", "print_report", "table_rows"]

HEADER = ("function", "shape", "impl", "us graph", "us eager", "rate", "time / kvattn's", "err vs kvattn", "note")
WIDTH = 120  # columns of the default table (--wide: one line a record, as long as it takes)


def _ratio(x: float) -> str:
    return f"{x:.2f}x" if x >= 0.01 else f"{x:.1e}x"


def _us(x) -> str:
    return "-" if not x else (f"{x:.1f}" if x < 1000 else f"{x:.0f}")


def table_rows(doc: dict) -> list[tuple]:
    """One row a record, cells as :data:`HEADER`; the function and shape on its first record only."""
    rows, kv_us, last = [], {}, None
    for r in doc["records"]:
        if r["impl"] == "kvattn":
            kv_us[r["function"]] = r.get("us")
    for r in doc["records"]:
        first = r["function"] != last
        last = r["function"]
        base = kv_us.get(r["function"])
        if r["status"] == "ok":
            ratio = _ratio(r["us"] / base) if base and r.get("us") else "-"
            err = "-" if r.get("rel_err") is None else f"{r['rel_err']:.1e}"
            rate = format_rate(r["rate"], r["unit"]) if r.get("rate") else "-"
            cells = (r["impl"], _us(r.get("graph_us")), _us(r.get("eager_us")), rate, ratio, err, r.get("note", ""))
        else:
            cells = (r["impl"], "-", "-", "-", "-", "-", f"{r['status']}: {r.get('note', '')}")
        rows.append(((r["function"], r["shape"]) if first else ("", "")) + cells)
    return rows


def print_report(doc: dict, out=None, wide: bool = False) -> None:
    """The title (versions, device, date), the method, then the table."""
    out = out or sys.stdout
    env = doc["env"]
    head = (f"kvattn {env['kvattn']} bench on {env['device']}, {env['date'][:16].replace('T', ' ')} UTC, "
            f"torch {env['torch']}, triton {env['triton']}")
    if wide:
        print(head, file=out)
        print(doc["method"], file=out)
        print(file=out)
        print("\n".join(aligned_lines(table_rows(doc), HEADER)), file=out)
        return
    for text in (head, doc["method"]):
        print(textwrap.fill(text, WIDTH), file=out)
    print(file=out)
    _print_narrow(table_rows(doc), out)


def _print_narrow(rows: list[tuple], out) -> None:
    """The table in ``WIDTH`` columns: a title line a function (its shape), then a line a record
    with the numbers, its note wrapped beneath it."""
    cells = [r[2:-1] for r in rows]
    header = HEADER[2:-1]
    widths = [max(len(str(c[i])) for c in cells + [header]) for i in range(len(header))]

    def line(values):
        return ("  " + "  ".join(str(v).ljust(w) for v, w in zip(values, widths))).rstrip()

    print(line(header), file=out)
    for r, c in zip(rows, cells):
        if r[0]:
            print(textwrap.fill(f"{r[0]}: {r[1]}", WIDTH, subsequent_indent="  "), file=out)
        print(line(c), file=out)
        if r[-1]:
            print(textwrap.fill(r[-1], WIDTH, initial_indent="      ", subsequent_indent="      "), file=out)
