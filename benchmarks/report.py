"""Turning a results document into the compact stdout table and the RESULTS.md rows.

Every shape's kvattn record carries ``fi_ratio``: kvattn's CUDA-graph time over the best
FlashInfer kernel's (:func:`attach_fi_ratio`; below 1 kvattn is faster). :func:`summary` groups the
shapes by class (suite, cache dtype, length distribution; MLA by head count) and gives, per class
and overall, the geometric mean and the worst ratio and the fractions of copy bandwidth.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from kvattn.benchmarking.table import aligned_lines

FI_FAMILY = "flashinfer"


def _by_shape(doc: dict) -> "OrderedDict[str, list[dict]]":
    groups: OrderedDict[str, list[dict]] = OrderedDict()
    for rec in doc["records"]:
        groups.setdefault(rec["shape"], []).append(rec)
    return groups


def _us(x) -> str:
    return "-" if not x else (f"{x:.1f}" if x < 100 else f"{x:.0f}")


def _frac(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _kvattn(recs: list[dict]) -> dict:
    # A shape whose process died before kvattn ran has only the "device" error record.
    return next((r for r in recs if r["impl"] == "kvattn"), recs[0] if recs else {"status": "missing"})


def _peers_ok(recs: list[dict]) -> list[dict]:
    ok = [r for r in recs if r["family"] != "kvattn" and r["status"] == "ok" and r.get("fraction") is not None
          and not r.get("check_failed")]
    return sorted(ok, key=lambda r: -r["fraction"])


def _fi_ok(recs: list[dict]) -> list[dict]:
    """FlashInfer records with a graph time whose output agreed with kvattn's."""
    return [r for r in recs if r.get("family") == FI_FAMILY and r.get("status") == "ok" and r.get("graph_us")
            and not r.get("check_failed")]


def attach_fi_ratio(records: list[dict]) -> None:
    """Put kvattn / best-FlashInfer (graph times) on kvattn's record, and kvattn / itself on each
    FlashInfer record. ``fi_ratio`` stays None when either side has no graph time."""
    kv = next((r for r in records if r.get("impl") == "kvattn"), None)
    if kv is None:
        return
    kv_us = kv.get("graph_us") if kv.get("status") == "ok" else None
    fi = _fi_ok(records)
    for r in fi:
        r["kvattn_ratio"] = kv_us / r["graph_us"] if kv_us else None
    kv["fi_ratio"] = None
    if not fi:
        return
    best = min(fi, key=lambda r: r["graph_us"])
    kv.update(fi_best=best["impl"], fi_best_us=best["graph_us"],
              fi_best_fraction_copy_bw=best.get("fraction_copy_bw"),
              fi_ratio=kv_us / best["graph_us"] if kv_us else None)


def _ratio_cell(kv: dict) -> str:
    r = kv.get("fi_ratio")
    return "-" if r is None else f"{r:.3f} {kv['fi_best'].removeprefix('fi-')}"


def _status_text(rec: dict) -> str:
    if rec["status"] == "ok":
        return ""
    return rec.get("note") or rec["status"] if rec["status"] != "error" else "ERROR " + rec.get("error", "")[:60]


def header_line(doc: dict) -> str:
    c = doc.get("ceilings", {})
    env = doc["env"]

    def num(key, unit):
        return f"{c[key]:.0f} {unit}" if c.get(key) else "n/a"

    return (f"{env['date']} | {env['device']} | torch {env['torch']} | triton {env['triton']} | "
            f"kvattn {env.get('kvattn', '?')} ({env.get('git') or 'no git'}) | ceilings: copy "
            f"{num('copy_gbps', 'GB/s')}, bf16 matmul {num('matmul_bf16_tflops', 'TFLOP/s')}, fp8 matmul "
            f"{num('matmul_fp8_tflops', 'TFLOP/s')}")


def table(doc: dict) -> str:
    """One line per shape: kvattn eager/graph us, metric, fraction, best peer, check."""
    rows = [("shape", "eager us", "graph us", "metric", "frac", "kv/FI", "best peer (frac, us)", "check")]
    for shape, recs in _by_shape(doc).items():
        kv = _kvattn(recs)
        peers = _peers_ok(recs)
        best = f"{peers[0]['impl']} {peers[0]['fraction']:.2f} ({_us(peers[0]['us'])})" if peers else "-"
        if kv["status"] == "ok":
            err = kv.get("rel_err")
            check = "-" if err is None else f"{err:.1e}"
            rows.append((shape, _us(kv.get("eager_us")), _us(kv.get("graph_us")), kv.get("metric", "-"),
                         _frac(kv.get("fraction")), _ratio_cell(kv), best, check))
        else:
            rows.append((shape, _status_text(kv)[:40], "", "", "", "", best, ""))
    return "\n".join([header_line(doc), *_aligned(rows), "", *_aligned(summary_rows(doc))])


def _aligned(rows: list[tuple]) -> list[str]:
    """``rows[0]`` is the header: the harness's console table (columns under a rule of dashes)."""
    return aligned_lines(rows[1:], rows[0])


def shape_class(info: dict) -> str:
    """A shape's class for the summary, from its configuration (``doc["shapes"][id]``): suite,
    cache dtype and length distribution (equal, uniform, lognormal); MLA by query heads."""
    suite = info.get("suite", "?")
    kv = {"bfloat16": "bf16"}.get(info.get("kv_dtype"), info.get("kv_dtype", "?"))
    if suite in ("decode", "spec_decode"):
        dist = info.get("len_dist", "uniform") if info.get("ragged") else "equal"
        return f"{suite} {kv} {dist}"
    if suite == "mla":
        return f"mla {kv} Hq{info.get('num_qo_heads', '?')}"
    return f"{suite} {kv}"


def _groups(doc: dict) -> "OrderedDict[str, list[tuple[str, dict]]]":
    """(shape id, kvattn record) per class, then the issue's target groups, then all rows."""
    shapes = doc.get("shapes", {})
    by_class: dict[str, list] = {}
    ragged_p16, fp8, every = [], [], []
    for shape, recs in _by_shape(doc).items():
        kv = _kvattn(recs)
        if kv.get("status") != "ok":
            continue
        info = shapes.get(shape, {"suite": kv.get("suite")})
        by_class.setdefault(shape_class(info), []).append((shape, kv))
        every.append((shape, kv))
        if info.get("suite") in ("decode", "spec_decode"):
            if info.get("ragged") and info.get("page_size") == 16:
                ragged_p16.append((shape, kv))
            if info.get("kv_dtype") == "fp8":
                fp8.append((shape, kv))
    groups = OrderedDict(sorted(by_class.items()))
    if ragged_p16:
        groups["decode ragged, pages of 16"] = ragged_p16
    if fp8:
        groups["decode fp8 caches"] = fp8
    groups["all"] = every
    return groups


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(doc: dict) -> list[dict]:
    """Per class and overall: rows, rows with a FlashInfer ratio, geometric mean and worst ratio
    (and its shape), kvattn's fraction of copy bandwidth (geometric mean and lowest), the best
    FlashInfer kernel's (geometric mean)."""
    out = []
    for name, rows in _groups(doc).items():
        ratios = [(kv["fi_ratio"], shape) for shape, kv in rows if kv.get("fi_ratio")]
        fracs = [kv.get("fraction_copy_bw") for _, kv in rows if kv.get("fraction_copy_bw")]
        fi_fracs = [kv.get("fi_best_fraction_copy_bw") for _, kv in rows if kv.get("fi_ratio")]
        worst = max(ratios) if ratios else (None, None)
        out.append({"class": name, "rows": len(rows), "with_fi": len(ratios),
                    "geomean_ratio": geomean([r for r, _ in ratios]), "worst_ratio": worst[0], "worst_shape": worst[1],
                    "copy_fraction_geomean": geomean(fracs), "copy_fraction_min": min(fracs) if fracs else None,
                    "fi_copy_fraction_geomean": geomean(fi_fracs)})
    return out


def summary_rows(doc: dict) -> list[tuple]:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    rows = [("class", "rows", "w/ FI", "kv/FI geomean", "kv/FI worst (shape)", "copy frac kvattn (geomean / min)",
             "copy frac best FI")]
    for g in summary(doc):
        worst = "-" if g["worst_ratio"] is None else f"{g['worst_ratio']:.3f} ({g['worst_shape']})"
        rows.append((g["class"], g["rows"], g["with_fi"], num(g["geomean_ratio"], ".3f"), worst,
                     f"{num(g['copy_fraction_geomean'], '.2f')} / {num(g['copy_fraction_min'], '.2f')}",
                     num(g["fi_copy_fraction_geomean"], ".2f")))
    return rows


def _peer_cell(recs: list[dict]) -> str:
    parts = [f"{r['impl']} {r['fraction']:.2f} ({_us(r['us'])} us)" for r in _peers_ok(recs)]
    na = [r["impl"] for r in recs if r["family"] != "kvattn" and r["status"] == "not available"]
    bad = [r["impl"] for r in recs if r["family"] != "kvattn" and r["status"] == "error"]
    wrong = [r["impl"] for r in recs if r.get("check_failed")]
    if na:
        parts.append("n/a: " + ", ".join(na))
    if bad:
        parts.append("failed: " + ", ".join(bad))
    if wrong:
        parts.append("CHECK FAILED (output differs from kvattn's): " + ", ".join(wrong))
    return "; ".join(parts) if parts else "-"


def _fi_line(doc: dict) -> str:
    """FlashInfer's version and the prebuild's cost, from ``env["flashinfer"]`` (empty if absent)."""
    fi = doc.get("env", {}).get("flashinfer")
    if not fi:
        return ""
    text = f"FlashInfer {fi['version']}" if fi.get("version") else f"FlashInfer not available ({fi.get('error')})"
    pre = fi.get("prebuild")
    if pre:
        text += f"; prebuild of {len(pre.get('variants', []))} variants: {pre.get('seconds')} s"
        if pre.get("error"):
            text += f" (error: {pre['error'][:200]})"
    return text + "."


def _kvattn_backends(doc: dict) -> str:
    """What ran for kvattn, from its records' ``backend``: Triton kernels, the reference, or both."""
    seen = sorted({r.get("backend") for r in doc["records"] if r["impl"] == "kvattn" and r.get("backend")})
    if seen == ["triton"]:
        return "kvattn ran its Triton kernels"
    if seen == ["reference"]:
        return "kvattn ran its plain-PyTorch reference (no Triton kernel was timed)"
    if seen:
        ref = sorted({r["shape"].split()[0] for r in doc["records"]
                      if r["impl"] == "kvattn" and r.get("backend") == "reference"})
        return f"kvattn ran its Triton kernels, and the reference for {', '.join(ref)}"
    return "kvattn did not run"


def method(doc: dict) -> str:
    """How the numbers were measured, as the run did it: a CPU run has no L2 flush and no graphs."""
    if doc["env"].get("device") == "cpu":
        return (f"CPU run, a check of the harness and not a measurement: us = median of host-timed eager calls "
                f"(no L2 flush, no CUDA graphs); {_kvattn_backends(doc)}. Fraction: of the CPU's own copy and "
                "matmul figures above. Peers: fraction (us), best first.")
    return ("us = `do_bench` median, L2 flushed; graph = CUDA-graph replay of one call. Fraction: of copy bandwidth "
            "(decode), of the matrix rate (prefill), of the binding one (MLA), from the graph time. "
            f"{_kvattn_backends(doc)}. kvattn / FI: kvattn's graph time over the best FlashInfer kernel's "
            "(below 1: kvattn faster). Peers: fraction (graph us), best first.")


def markdown(doc: dict) -> str:
    """A block for the top of ``benchmarks/RESULTS.md``: header, then one row per shape."""
    env = doc["env"]
    out = [
        f"### {env['date'][:10]} - {env['device']} - torch {env['torch']}, triton {env['triton']}"
        f" - kvattn {env.get('kvattn', '?')} ({env.get('git') or 'no git'})",
        "",
        header_line(doc),
        "",
        f"Command: `{env.get('command', '')}`. {method(doc)}",
        "",
        "| shape | kvattn us (eager / graph) | GB/s or TFLOP/s | fraction | kvattn / FI | check | peers |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, recs in _by_shape(doc).items():
        kv = _kvattn(recs)
        if kv["status"] == "ok":
            err = kv.get("rel_err")
            cells = [f"{_us(kv.get('eager_us'))} / {_us(kv.get('graph_us'))}", kv.get("metric", "-"),
                     _frac(kv.get("fraction")), _ratio_cell(kv), "-" if err is None else f"{err:.1e}"]
        else:
            cells = [_status_text(kv), "-", "-", "-", "-"]
        out.append(f"| {shape} | " + " | ".join(cells) + f" | {_peer_cell(recs)} |")
    rows = summary_rows(doc)
    out += ["", "Summary (kvattn / best FlashInfer kernel, graph times; fractions of copy bandwidth):", "",
            "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows[1:]]
    fi = _fi_line(doc)
    if fi:
        out += ["", fi]
    return "\n".join(out) + "\n"
