"""Turning a results document into the compact stdout table and the RESULTS.md rows."""

from __future__ import annotations

from collections import OrderedDict


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
    ok = [r for r in recs if r["family"] != "kvattn" and r["status"] == "ok" and r.get("fraction") is not None]
    return sorted(ok, key=lambda r: -r["fraction"])


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
    rows = [("shape", "eager us", "graph us", "metric", "frac", "best peer (frac, us)", "check")]
    for shape, recs in _by_shape(doc).items():
        kv = _kvattn(recs)
        peers = _peers_ok(recs)
        best = f"{peers[0]['impl']} {peers[0]['fraction']:.2f} ({_us(peers[0]['us'])})" if peers else "-"
        if kv["status"] == "ok":
            err = kv.get("rel_err")
            check = "-" if err is None else f"{err:.1e}"
            rows.append((shape, _us(kv.get("eager_us")), _us(kv.get("graph_us")), kv.get("metric", "-"),
                         _frac(kv.get("fraction")), best, check))
        else:
            rows.append((shape, _status_text(kv)[:40], "", "", "", best, ""))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([header_line(doc), *lines])


def _peer_cell(recs: list[dict]) -> str:
    parts = [f"{r['impl']} {r['fraction']:.2f} ({_us(r['us'])} us)" for r in _peers_ok(recs)]
    na = [r["impl"] for r in recs if r["family"] != "kvattn" and r["status"] == "not available"]
    bad = [r["impl"] for r in recs if r["family"] != "kvattn" and r["status"] == "error"]
    if na:
        parts.append("n/a: " + ", ".join(na))
    if bad:
        parts.append("failed: " + ", ".join(bad))
    return "; ".join(parts) if parts else "-"


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
            f"{_kvattn_backends(doc)}. Peers: fraction (graph us), best first.")


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
        "| shape | kvattn us (eager / graph) | GB/s or TFLOP/s | fraction | check | peers |",
        "|---|---|---|---|---|---|",
    ]
    for shape, recs in _by_shape(doc).items():
        kv = _kvattn(recs)
        if kv["status"] == "ok":
            err = kv.get("rel_err")
            cells = [f"{_us(kv.get('eager_us'))} / {_us(kv.get('graph_us'))}", kv.get("metric", "-"),
                     _frac(kv.get("fraction")), "-" if err is None else f"{err:.1e}"]
        else:
            cells = [_status_text(kv), "-", "-", "-"]
        out.append(f"| {shape} | " + " | ".join(cells) + f" | {_peer_cell(recs)} |")
    return "\n".join(out) + "\n"
