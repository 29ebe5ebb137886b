"""The prefill grid's chunked and mixed rows and their SDPA peers.

The peers must compute kvattn's attention: query row ``i`` of a request with ``Lq`` new rows over
``L`` keys sees keys ``j <= L - Lq + i`` (lower-right causal). Each backend's formulation (torch's
``causal_lower_right`` for flash / efficient, an explicit additive mask for cuDNN, one call per
request for a mixed batch) is run here on CPU tensors with SDPA's math backend and compared with
kvattn's CPU prefill and with the attention computed in float64 from the pages.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import metrics, peers_flex, peers_sdpa, problems, run, shapes  # noqa: E402
from benchmarks.runner import Options, run_shape  # noqa: E402
from benchmarks.shapes import Shape, mixed_prefill  # noqa: E402
from kvattn.benchmarking.timing import Timer  # noqa: E402

CPU = torch.device("cpu")
SMALL = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16)
# A chunked step (rows fewer than keys, lengths on the page) and mixed batches in both layouts
# (lengths off the page: the last page of each request has unused rows, poisoned below).
CHUNKED = Shape("prefill", 2, 80, q_len=24, layout="HND", **SMALL)
MIXED = [s for s in shapes.SMOKE if s.reqs][0]
MIXED_NHD = mixed_prefill(((5, 70), (33, 33), (16, 40)), layout="NHD", **SMALL)


def _allowed(q_len: int, kv_len: int) -> torch.Tensor:
    """The definition, element by element: row i sees key j iff j <= kv_len - q_len + i."""
    return torch.tensor([[j <= kv_len - q_len + i for j in range(kv_len)] for i in range(q_len)])


def _poison_unused_rows(pools) -> None:
    """NaN in every cache row no request owns (tails of last pages, the spare page)."""
    ps = pools.page_size
    owned = torch.zeros(pools.k.shape[0], ps, dtype=torch.bool)
    for b, n in enumerate(pools.lens):
        for j in range(n):
            owned[int(pools.tables[b, j // ps]), j % ps] = True
    for pool in (pools.k, pools.v):
        view = pool if pools.layout == "NHD" else pool.transpose(1, 2)  # [P, page, H, D]
        view[~owned] = float("nan")


def _float64_attention(spec) -> torch.Tensor:
    """``[sum_q, Hq, D]``: each request's rows over its keys read from the pages, in float64."""
    p = spec.pools
    q_lens = spec.q_lens or [spec.q_len] * len(spec.lens)
    q_all = spec.to_common(spec.q_parts()) if spec.q_lens else spec.to_common(spec.q4)
    hq = q_all.shape[1]
    g = hq // spec.num_kv_heads
    outs, start = [], 0
    for b, (lq, n) in enumerate(zip(q_lens, spec.lens)):
        rows = []
        for j in range(n):
            page, r = int(p.tables[b, j // p.page_size]), j % p.page_size
            rows.append((p.k[page, r], p.v[page, r]) if p.layout == "NHD" else (p.k[page, :, r], p.v[page, :, r]))
        k = torch.stack([x[0] for x in rows]).double().repeat_interleave(g, dim=1)  # [n, Hq, D]
        v = torch.stack([x[1] for x in rows]).double().repeat_interleave(g, dim=1)
        q = q_all[start : start + lq].double()
        s = torch.einsum("ihd,jhd->hij", q, k) * spec.scale
        s = s.masked_fill(~_allowed(lq, n)[None], float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", s.softmax(-1), v))
        start += lq
    return torch.cat(outs)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# -- the masks ----------------------------------------------------------------------------------


@pytest.mark.parametrize("q_len,kv_len", [(1, 5), (3, 7), (4, 9), (6, 6), (16, 1000)])
def test_lower_right_bias_is_the_float64_definition(q_len, kv_len):
    bias = peers_sdpa.lower_right_bias(q_len, kv_len, torch.bfloat16, CPU)
    assert bias.shape == (1, 1, q_len, kv_len) and bias.dtype == torch.bfloat16
    allowed = _allowed(q_len, kv_len)
    b = bias[0, 0].double()
    assert (b[allowed] == 0).all()
    assert (b[~allowed] <= -6.5e4).all() and torch.isfinite(b).all()  # SDPA's own finite cuDNN value
    # Added to any bf16 logit, a masked key's weight is exactly 0 in float32 (float64 here).
    logits = torch.full((q_len, kv_len), 100.0, dtype=torch.float64) + b
    w = logits.softmax(-1)
    assert (w[~allowed] == 0).all()


@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn"])
def test_causal_kwargs_align_at_the_last_key(backend):
    assert peers_sdpa.causal_kwargs(8, 8, backend, torch.bfloat16, CPU) == {"is_causal": True}
    kw = peers_sdpa.causal_kwargs(3, 7, backend, torch.bfloat16, CPU)
    assert set(kw) == {"attn_mask"}
    mask = kw["attn_mask"]
    if backend == "cudnn":  # a dense additive tensor: cuDNN is never reached through CausalBias
        assert isinstance(mask, torch.Tensor) and type(mask) is torch.Tensor
        allowed = mask[0, 0] == 0
    else:
        from torch.nn.attention.bias import CausalBias

        assert isinstance(mask, CausalBias)
        allowed = mask._materialize(CPU)
    assert torch.equal(allowed, _allowed(3, 7))


# -- the formulations against kvattn --------------------------------------------------------------


@pytest.mark.parametrize("shape", [CHUNKED, MIXED, MIXED_NHD], ids=lambda s: s.id)
def test_sdpa_formulations_compute_kvattns_attention(shape):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    prob = problems.build(shape, CPU, l2_bytes=1 << 40, workspace_mib=16)
    spec = prob.sets[0].spec
    if shape.reqs:
        _poison_unused_rows(spec.pools)
    kv = prob.sets[0].kvattn().float()
    want = _float64_attention(spec)
    assert _rel(kv, want) < 1e-2
    for backend in ("flash", "efficient", "cudnn"):
        for expand in (False, True):
            fn, unfold = peers_sdpa.attention_fn(spec, backend, expand)
            with sdpa_kernel([SDPBackend.MATH]):
                out = spec.to_common(unfold(fn())).float()
            assert out.shape == kv.shape
            assert torch.isfinite(out).all(), (backend, expand)
            assert _rel(out, want) < 1e-2, (backend, expand)
            assert _rel(out, kv) < 1e-2, (backend, expand)
            prep, unfold = peers_sdpa.prep_fn(spec, backend, expand)
            with sdpa_kernel([SDPBackend.MATH]):
                assert torch.equal(spec.to_common(unfold(prep())).float(), out), (backend, expand)


def test_upper_left_causality_would_be_caught():
    """The comparison above tells the alignments apart: SDPA's own is_causal (upper left) on the
    chunked step is far from kvattn's attention."""
    prob = problems.build(CHUNKED, CPU, l2_bytes=1 << 40, workspace_mib=16)
    spec = prob.sets[0].spec
    q, k, v = peers_sdpa.dense_kv(spec)
    wrong = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.scale,
                                                             enable_gqa=True)
    assert _rel(spec.to_common(wrong), _float64_attention(spec)) > 0.1


def test_mixed_batch_peers_are_one_call_per_request():
    prob = problems.build(MIXED, CPU, l2_bytes=1 << 40, workspace_mib=16)
    spec = prob.sets[0].spec
    assert spec.q_lens == [40, 24, 1, 9] and spec.lens == [40, 88, 50, 33]
    fn, _ = peers_sdpa.attention_fn(spec, "cudnn")
    outs = fn()
    assert [tuple(o.shape) for o in outs] == [(1, 4, n, 64) for n in spec.q_lens]
    with pytest.raises(ValueError, match="mixed batch"):
        peers_sdpa.dense_kv(spec)


def test_run_shape_times_the_mixed_batch_beside_its_peers():
    """The harness end to end on a CPU: kvattn, each SDPA variant alone and +gather, flex's record."""
    timer = Timer(CPU, warmup_ms=1, rep_ms=1)
    recs = run_shape(MIXED, CPU, timer, {}, Options(l2_bytes=1 << 40, workspace_mib=16), log=lambda *a: None)
    by = {r["impl"]: r for r in recs}
    assert by["kvattn"]["status"] == "ok"
    assert by["kvattn"]["flops"] == metrics.work(MIXED).flops
    flash = by["sdpa-flash"]
    assert flash["status"] == "ok" and flash["check_against"] == "kvattn" and flash["rel_err"] < 1e-2
    assert "one SDPA call per request (4 calls)" in flash["note"]
    gather = by["sdpa-flash+gather"]
    assert gather["status"] == "ok" and gather["includes"] == "gather" and gather["us"] > 0
    assert by["flex-paged"]["status"] == "not available" and "mixed batch" in by["flex-paged"]["note"]
    assert "flex-gathered" not in by


# -- the registry, the work, the listing ----------------------------------------------------------


def test_prefill_suite_times_the_chunked_and_mixed_steps_with_peers():
    rows = {s.id: s for s in shapes.select(shapes.GRID, suites=["prefill"])}
    chunked = rows["prefill bf16 4x512x16384 p64 HND"]
    assert chunked.peers and chunked.q_lens() == [512] * 4 and chunked.seq_lens() == [16384] * 4
    mixed = [s for s in rows.values() if s.reqs]
    assert len(mixed) == 1 and mixed[0].peers
    m = mixed[0]
    assert m.id == f"prefill bf16 mixed8 q{sum(m.q_lens())}/kv{sum(m.seq_lens())} p64 HND"
    assert m.reqs == shapes.MIXED_PREFILL and (m.batch, m.q_len, m.kv_len) == (8, 4000, 16384)
    assert any(q == n for q, n in m.reqs) and any(q < n for q, n in m.reqs)  # prompts and chunks
    assert min(q for q, _ in m.reqs) < 16  # a request with fewer rows than a 16-row matrix tile
    # Causal FLOPs near the other prefill rows' (1-2 ms at ~500 TFLOP/s).
    assert 0.5 < metrics.work(m).flops / 500e12 * 1e3 < 2.0
    d = m.as_dict()
    assert d["reqs"] == [list(p) for p in shapes.MIXED_PREFILL] and d["q_lens_sum"] == sum(m.q_lens())
    assert json.loads(json.dumps(d))["id"] == m.id


@pytest.mark.parametrize("shape", [MIXED, CHUNKED, Shape("prefill", 3, 100, q_len=100, **SMALL)],
                         ids=lambda s: s.id)
def test_prefill_flops_count_the_allowed_pairs(shape):
    from kvattn.reference.prefill import context_allowed

    pairs = sum(int(context_allowed(n, q, -1, CPU).sum()) for q, n in zip(shape.q_lens(), shape.seq_lens()))
    w = metrics.work(shape)
    assert w.flops == 4.0 * shape.head_dim * shape.num_qo_heads * pairs
    rows = sum(shape.q_lens())
    kv = sum(shape.seq_lens()) * shape.num_kv_heads * shape.head_dim * 2 * 2
    assert w.bytes == kv + rows * shape.num_qo_heads * shape.head_dim * (2 + 2)


def test_grid_mixed_flops_count_the_allowed_pairs():
    from kvattn.reference.prefill import context_allowed

    m = [s for s in shapes.GRID if s.reqs][0]
    pairs = sum(int(context_allowed(n, q, -1, CPU).sum()) for q, n in m.reqs)
    assert metrics.work(m).flops == 4.0 * 128 * 32 * pairs


def test_mixed_shape_checks_its_pairs():
    with pytest.raises(ValueError, match="reqs: batch, q_len, kv_len"):
        Shape("prefill", 3, 100, q_len=10, reqs=((10, 100), (5, 50)))
    with pytest.raises(ValueError, match="1 <= q_len <= kv_len"):
        mixed_prefill(((10, 5),))
    with pytest.raises(ValueError, match="for prefill shapes"):
        Shape("decode", 1, 100, reqs=((1, 100),))
    with pytest.raises(ValueError, match="at least one"):
        mixed_prefill(())


def test_run_list_names_the_new_rows_and_their_peers(capsys):
    assert run.main(["--suite", "prefill", "--filter", "4x512x16384,mixed", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("prefill bf16 4x512x16384 p64 HND ") and "kvattn + peers" in lines[0]
    assert lines[1].startswith("prefill bf16 mixed8 ") and "kvattn + peers" in lines[1]
    # causal=False beside it: no SDPA / flex peer (their formulations are causal), FlashInfer's fa3
    # prefill with causal=False where it can be imported
    assert lines[2].startswith("prefill bf16 4x512x16384 p64 HND bidirectional") and "+ peers" not in lines[2]
    assert run.main(["--suite", "prefill", "--filter", "p16", "--list", "--no-peers"]) == 0
    assert all("kvattn only" in x for x in capsys.readouterr().out.strip().splitlines())


def test_flex_has_no_mixed_batch_form():
    prob = problems.build(MIXED, CPU, l2_bytes=1 << 40, workspace_mib=16)
    specs = [s.spec for s in prob.sets]
    (name, make), = list(peers_flex.variants(specs))
    assert name == "flex-paged"
    with pytest.raises(peers_flex.NotAvailable, match="mixed batch"):
        make()
    assert list(peers_flex.variants(specs, paged_failed=True)) == []


def test_results_json_records_the_mixed_batch_pairs(monkeypatch, tmp_path):
    """A result row names its shape by id; the document also keeps each shape's configuration."""
    ceilings = {"copy_gbps": 1.0, "matmul_bf16_tflops": 1.0, "matmul_fp8_tflops": None, "errors": None}
    monkeypatch.setattr(run.ceilings_mod, "measure", lambda dev, timer: dict(ceilings))
    monkeypatch.setattr(run, "run_shape", lambda shape, *a, **k: [{"shape": shape.id, "impl": "kvattn",
                                                                   "status": "ok"}])
    path = tmp_path / "r.json"
    run.run(["prefill"], out=str(path), smoke=True, filters=["mixed"], device="cpu", print_table=False)
    doc = json.loads(path.read_text())
    assert doc["done"] == [MIXED.id]
    assert doc["shapes"][MIXED.id]["reqs"] == [list(p) for p in MIXED.reqs]
    assert doc["shapes"][MIXED.id]["q_lens_sum"] == sum(MIXED.q_lens())
