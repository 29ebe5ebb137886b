"""The sweep suite (``benchmarks/sweep.py``): drawn from a fixed seed, the same on every call, at
least 60 shapes covering what the issue lists, each within the byte bound, its ragged lengths its
own seeded draw recorded in the results; ``--suite sweep --list`` prints one line per shape."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import metrics, peers_flashinfer, run, sweep  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402

SWEEP = sweep.SWEEP


def test_sweep_is_the_same_draw_every_time():
    again = sweep.draw()
    assert [s.id for s in again] == [s.id for s in SWEEP]
    assert [s.seq_lens() for s in again] == [s.seq_lens() for s in SWEEP]
    assert [s.seq_lens() for s in SWEEP] == [s.seq_lens() for s in SWEEP]  # a shape's draw is stable too
    other = sweep.draw(seed=sweep.SWEEP_SEED + 1)
    assert [s.id for s in other] != [s.id for s in SWEEP]


def test_sweep_size_ids_and_byte_bound():
    assert len(SWEEP) >= 60
    ids = [s.id for s in SWEEP]
    assert len(set(ids)) == len(ids)
    assert all(s.id.startswith(f"sw{i:02d} ") for i, s in enumerate(SWEEP))
    for s in SWEEP:
        assert metrics.work(s).bytes <= sweep.MAX_BYTES, s.id
        assert not s.peers and "sweep" in s.tags  # torch's peers off: FlashInfer is the sweep's peer


def test_sweep_covers_what_engines_send():
    dec = [s for s in SWEEP if s.suite in ("decode", "spec_decode")]
    mla = [s for s in SWEEP if s.suite == "mla"]
    assert {(s.num_qo_heads, s.num_kv_heads, s.head_dim) for s in dec} == set(sweep.LAYOUTS)
    assert {s.page_size for s in dec} == {16, 32, 64}
    assert {s.kv_dtype for s in dec} == {"bfloat16", "fp8", "nvfp4"}
    assert {s.layout for s in dec} == {"NHD", "HND"}
    assert {s.q_len for s in dec} >= {1, 2, 3, 4} and max(s.q_len for s in dec) <= 4
    assert min(s.batch for s in dec) == 1 and max(s.batch for s in dec) > 128
    assert max(s.kv_len for s in dec) > 65536 and all(s.kv_len <= sweep.MAX_LEN for s in dec)
    kinds = {("equal" if not s.ragged else s.len_dist) for s in dec}
    assert kinds == {"equal", "uniform", "lognormal"}
    assert {s.num_qo_heads for s in mla} == set(sweep.MLA_HEADS)
    assert {s.page_size for s in mla} == {16, 32, 64} and {s.kv_dtype for s in mla} == {"bfloat16", "fp8"}
    assert all(s.ragged for s in mla) and all(1024 <= s.kv_len <= 65536 for s in mla)
    # The FlashInfer compile budget: fp8 rows at D 128 with groups 4 / 8, speculative rows on bf16.
    assert all(s.head_dim == 128 and s.group in (4, 8) for s in dec if s.kv_dtype == "fp8")
    assert all(s.kv_dtype == "bfloat16" for s in dec if s.q_len > 1)


def test_ragged_lengths_are_each_rows_own_seeded_draw():
    ragged = [s for s in SWEEP if s.ragged]
    assert len({s.len_seed for s in ragged}) == len(ragged)
    for s in ragged:
        lens = s.seq_lens()
        assert len(lens) == s.batch and all(max(1, s.q_len) <= n <= s.kv_len for n in lens), s.id
    logn = [s for s in ragged if s.len_dist == "lognormal" and s.batch >= 64]
    assert logn, "a large heavy-tailed batch"
    for s in logn:  # heavy tail: the median well below the mean's share of the longest
        lens = sorted(s.seq_lens())
        assert lens[len(lens) // 2] < sum(lens) / len(lens) < lens[-1], s.id


def test_lognormal_draw_follows_its_parameters():
    s = Shape("decode", 4000, 1 << 20, ragged=True, len_dist="lognormal", len_median=1000, len_sigma=1.0,
              len_seed=7)
    lens = sorted(s.seq_lens())
    assert 900 < lens[len(lens) // 2] < 1100  # the median
    logs = [math.log(n) for n in lens]
    mean = sum(logs) / len(logs)
    assert 0.9 < math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs)) < 1.1  # sigma
    with pytest.raises(ValueError, match="len_dist='lognormal' needs"):
        Shape("decode", 4, 100, ragged=False, len_dist="lognormal", len_median=10, len_sigma=1.0)
    with pytest.raises(ValueError, match="len_dist"):
        Shape("decode", 4, 100, ragged=True, len_dist="zipf")


def test_shape_dict_records_the_draw():
    s = next(s for s in SWEEP if s.ragged and s.len_dist == "lognormal")
    d = json.loads(json.dumps(s.as_dict()))
    assert d["seq_lens"] == s.seq_lens() and d["ragged_seed"] == s.len_seed
    assert d["len_dist"] == "lognormal" and d["len_median"] == s.len_median and d["len_sigma"] == s.len_sigma
    assert d["id"] == s.id and d["seq_lens_sum"] == sum(s.seq_lens())


def test_fit_drops_requests_then_length():
    big = Shape("decode", 256, 131072, ragged=True, len_dist="uniform", len_seed=3)
    fitted = sweep._fit(big, 1 << 30)
    assert metrics.work(fitted).bytes <= 1 << 30 and fitted.batch < 256 and fitted.kv_len == 131072
    one = sweep._fit(Shape("decode", 1, 1 << 24), 1 << 30)
    assert one.batch == 1 and metrics.work(one).bytes <= 1 << 30 and one.kv_len < 1 << 24


def test_sweep_list_prints_one_line_per_shape(capsys):
    assert run.main(["--suite", "sweep", "--list"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert len(lines) == len(SWEEP)
    assert all(line.startswith(s.id) for line, s in zip(lines, SWEEP))
    assert all("FlashInfer (" in line for line, s in zip(lines, SWEEP) if s.kv_dtype != "nvfp4")
    assert "FlashInfer variants compiled for this selection" in captured.err


def test_sweep_is_not_in_the_default_selection():
    assert not any("sweep" in s.tags for s in run.select_shapes(None))
    both = run.select_shapes(["mla", "sweep"])
    assert [s for s in both if "sweep" in s.tags] == SWEEP
    with pytest.raises(ValueError, match="unknown suite"):
        run.select_shapes(["sweeps"])


def test_sweep_compiles_few_flashinfer_variants():
    keys = peers_flashinfer.variant_keys(SWEEP)
    assert len(keys) <= 12, [peers_flashinfer.describe(k) for k in keys]
    assert {k[0] for k in keys} == {"fa2-tc", "xqa", "fa3-mla"}
