"""The FlashInfer peers (``benchmarks/peers_flashinfer.py``) off the GPU machine.

FlashInfer is not importable here: the peers must then be reported ``not available`` with the
reason, never break a run. The forms they hand FlashInfer are checked on CPU tensors: attention
computed in float64 from FlashInfer's CSR page list (``indptr``, ``indices``, ``last_page_len``)
and XQA's draft mask, by FlashInfer's rules, must be kvattn's attention on the same pools (unused
cache rows poisoned with NaN, lengths off the page, random page order).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import peers_flashinfer as fi  # noqa: E402
from benchmarks import problems, run  # noqa: E402
from benchmarks.runner import Options, run_shape  # noqa: E402
from benchmarks.shapes import SMOKE, Shape  # noqa: E402
from kvattn.benchmarking.timing import Timer  # noqa: E402

CPU = torch.device("cpu")
SMALL = dict(num_qo_heads=4, num_kv_heads=2, head_dim=64)
DECODE = [
    Shape("decode", 3, 80, page_size=16, layout="NHD", ragged=True, len_seed=5, **SMALL),
    Shape("decode", 2, 33, page_size=16, layout="HND", **SMALL),  # one token past a page
    Shape("decode", 4, 70, page_size=32, layout="HND", ragged=True, len_dist="lognormal", len_median=20,
          len_sigma=1.0, len_seed=9, **SMALL),
    Shape("spec_decode", 3, 50, q_len=3, page_size=16, layout="NHD", ragged=True, len_seed=4, **SMALL),
]
MLA = Shape("mla", 3, 90, num_qo_heads=16, num_kv_heads=1, head_dim=576, page_size=16, ragged=True, len_seed=2)


@pytest.fixture
def no_flashinfer(monkeypatch):
    """``import flashinfer`` raises ImportError, as on a machine without it."""
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    fi.reset_import_state()
    yield
    fi.reset_import_state()


def _poison_unused(pools) -> None:
    """NaN in every cache row no request owns (tails of last pages, the spare page)."""
    ps = pools.page_size
    owned = torch.zeros(pools.k.shape[0], ps, dtype=torch.bool)
    for b, n in enumerate(pools.lens):
        for j in range(n):
            owned[int(pools.tables[b, j // ps]), j % ps] = True
    for pool in (pools.k, pools.v) if pools.v is not None else (pools.k,):
        view = pool if (pools.layout == "NHD" or pool.dim() == 3) else pool.transpose(1, 2)  # [P, page, ...]
        view[~owned] = float("nan")


def _tokens_from_csr(pool, layout, indptr, indices, last, page, b):
    """Request ``b``'s rows by FlashInfer's CSR rule: its pages in order, all full but the last."""
    pages = indices[int(indptr[b]):int(indptr[b + 1])].tolist()
    rows = []
    for i, p in enumerate(pages):
        n = int(last[b]) if i == len(pages) - 1 else page
        for r in range(n):
            if pool.dim() == 3:
                rows.append(pool[p, r])
            else:
                rows.append(pool[p, r] if layout == "NHD" else pool[p, :, r])
    return torch.stack(rows).double()


def _fi_decode_attention(q, k_pool, v_pool, layout, csr, page, q_len, mask, scale):
    """float64 ``[B * q_len, Hq, D]``: FlashInfer's paged decode from the CSR form; draft row ``r``
    of a request with ``L`` keys sees the ``L - q_len`` cached keys and the drafts its mask bits say."""
    indptr, indices, last = csr
    b_count = len(last)
    hq = q.shape[1]
    outs = []
    for b in range(b_count):
        k = _tokens_from_csr(k_pool, layout, indptr, indices, last, page, b)  # [L, Hkv, D]
        v = _tokens_from_csr(v_pool, layout, indptr, indices, last, page, b)
        g = hq // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        n = k.shape[0]
        qb = q[b * q_len:(b + 1) * q_len].double()  # [q_len, Hq, D]
        s = torch.einsum("ihd,jhd->hij", qb, k) * scale
        seen = torch.ones(q_len, n, dtype=torch.bool)
        if mask is not None:
            seen[:, n - q_len:] = mask[b]
        s = s.masked_fill(~seen[None], float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", s.softmax(-1), v))
    return torch.cat(outs)


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# -- conversions ---------------------------------------------------------------------------------


def test_csr_pages_lists_each_requests_pages_in_order():
    tables = torch.tensor([[7, 3, 9], [4, 0, 0], [1, 8, 0], [0, 0, 0]], dtype=torch.int32)
    lens = [33, 16, 17, 0]
    indptr, indices, last = fi.csr_pages(tables, lens, 16)
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32
    assert indptr.tolist() == [0, 3, 4, 6, 6]
    assert indices.tolist() == [7, 3, 9, 4, 1, 8]
    assert last.tolist() == [1, 16, 1, 0]
    with pytest.raises(ValueError, match="cannot hold"):
        fi.csr_pages(tables, [49, 1, 1, 1], 16)
    with pytest.raises(ValueError, match="B = len"):
        fi.csr_pages(tables, [1, 1], 16)


@pytest.mark.parametrize("q_len", [1, 2, 3, 4, 16, 17, 33])
def test_xqa_mask_is_causal_among_the_drafts(q_len):
    mask = fi.xqa_causal_mask(2, q_len)
    assert mask.dtype == torch.int16 and mask.shape == (2, q_len, (q_len + 31) // 32 * 2)
    assert torch.equal(fi.mask_bits(mask, q_len), torch.ones(q_len, q_len, dtype=torch.bool).tril().expand(2, -1, -1))
    assert mask.view(torch.uint16).shape == mask.shape  # the kernel's dtype, the same bits
    if q_len >= 16:  # the 16th draft sees a full first word: 0xFFFF, -1 as int16
        assert int(mask[0, 15, 0]) == -1
    assert int(mask[0, 0, 0]) == 1 and (q_len < 2 or int(mask[0, 1, 0]) == 3)


@pytest.mark.parametrize("shape", DECODE, ids=lambda s: s.id)
def test_flashinfer_decode_forms_compute_kvattns_attention(shape):
    prob = problems.build(shape, CPU, l2_bytes=1 << 40, workspace_mib=16)
    spec = prob.sets[0].spec
    _poison_unused(spec.pools)
    want = prob.sets[0].kvattn().float()
    assert torch.isfinite(want).all()
    p = spec.pools
    csr = fi.csr_pages(p.tables, p.lens, p.page_size)
    q = fi.decode_query(spec)
    assert q.shape == (shape.batch * shape.q_len, shape.num_qo_heads, shape.head_dim)
    mask = None
    if shape.q_len > 1:
        mask = fi.mask_bits(fi.xqa_causal_mask(shape.batch, shape.q_len), shape.q_len)
    got = _fi_decode_attention(q, p.k, p.v, p.layout, csr, p.page_size, shape.q_len, mask, spec.native["scale"])
    assert torch.isfinite(got).all()
    assert _rel(want, got) < 1e-2
    if shape.q_len > 1:  # the mask matters: drafts seeing each other (no mask) is another attention
        full = torch.ones_like(mask)
        wrong = _fi_decode_attention(q, p.k, p.v, p.layout, csr, p.page_size, shape.q_len, full, spec.native["scale"])
        assert _rel(want, wrong) > 1e-2


def test_flashinfer_mla_form_computes_kvattns_attention():
    prob = problems.build(MLA, CPU, l2_bytes=1 << 40, workspace_mib=16)
    spec = prob.sets[0].spec
    _poison_unused(spec.pools)
    want = prob.sets[0].kvattn().float()  # [B, H, 512]
    p = spec.pools
    indptr, indices, last = fi.csr_pages(p.tables, p.lens, p.page_size)
    q = spec.native["q"].reshape(MLA.batch, MLA.num_qo_heads, 576)  # the packed query FlashInfer takes
    outs = []
    for b in range(MLA.batch):
        lat = _tokens_from_csr(p.k, "NHD", indptr, indices, last, p.page_size, b)  # [L, 576]
        s = torch.einsum("hd,jd->hj", q[b].double(), lat) * problems.MLA_SCALE
        outs.append(s.softmax(-1) @ lat[:, :512])  # values: the first 512 (ckv) columns
    assert _rel(want, torch.stack(outs)) < 1e-2


def test_prefill_query_offsets_are_kvattns():
    shape = next(s for s in SMOKE if s.reqs)
    prob = problems.build(shape, CPU, l2_bytes=1 << 40, workspace_mib=16)
    cum_q = prob.sets[0].spec.native["cum_q"]
    assert cum_q.dtype == torch.int32 and cum_q.tolist() == [0, *torch.tensor(shape.q_lens()).cumsum(0).tolist()]


# -- which kernels, which variants ---------------------------------------------------------------


def test_kernel_menu():
    grid = Shape("decode", 64, 8192, page_size=64)
    assert [n for n, _ in fi.kernels(grid)[0]] == ["fi-fa2-tc", "fi-fa2", "fi-xqa"]
    spec = Shape("spec_decode", 64, 4096, q_len=4)
    assert [k for _, k in fi.kernels(spec)[0]] == [("fa2-tc", "bfloat16", 128), ("xqa", "bfloat16", 16, 128, 4, 4)]
    fp8 = Shape("decode", 64, 8192, kv_dtype="fp8")
    assert [n for n, _ in fi.kernels(fp8)[0]] == ["fi-fa2", "fi-xqa"]
    nvfp4, why = fi.kernels(Shape("decode", 64, 8192, kv_dtype="nvfp4"))
    assert nvfp4 == [] and "NVFP4" in why
    sweep_bf16 = Shape("decode", 8, 1000, page_size=32, tags=("sweep",))
    assert [n for n, _ in fi.kernels(sweep_bf16)[0]] == ["fi-fa2-tc"]
    sweep_fp8 = Shape("decode", 8, 1000, page_size=32, kv_dtype="fp8", tags=("sweep",))
    assert [k for _, k in fi.kernels(sweep_fp8)[0]] == [("xqa", "fp8", 32, 128, 4, 1)]
    assert fi.kernels(Shape("decode", 8, 1000, page_size=8))[0][-1][0] == "fi-fa2"  # XQA takes pages of 16-128
    assert [k for _, k in fi.kernels(Shape("mla", 8, 1000, num_qo_heads=16, num_kv_heads=1, head_dim=576,
                                               kv_dtype="fp8", q_dtype="fp8"))[0]] == [("fa3-mla", "fp8")]
    assert fi.kernels(Shape("prefill", 1, 64, q_len=64, kv_dtype="fp8", q_dtype="fp8"))[0] == []
    single = Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode="ROPE_LLAMA")
    assert fi.kernels(single)[0] == [("fi-single", ("single", "bfloat16", 128, "ROPE_LLAMA"))]


def test_grid_variants_are_few_and_named():
    keys = fi.variant_keys(run.select_shapes(["decode", "single_decode", "mla"]))
    names = [fi.describe(k) for k in keys]
    assert len(keys) <= 12 and len(set(names)) == len(names)
    assert "xqa fp8 p16 D128 g4" in names and "fa3-mla bf16" in names and "single-decode bf16 D128 NONE" in names


# -- without flashinfer ----------------------------------------------------------------------------


def test_load_reports_the_import_error(no_flashinfer):
    with pytest.raises(fi.NotAvailable, match="flashinfer not importable"):
        fi.load()
    info = fi.prebuild([DECODE[0]])
    assert info["error"] and "not importable" in info["error"]
    assert info["variants"] == ["fa2-decode bf16 D64", "fa2-tc bf16 D64", "xqa bf16 p16 D64 g2"]


@pytest.mark.parametrize("shape", [DECODE[3], SMOKE[3], MLA, Shape("decode", 2, 64, kv_dtype="nvfp4", **SMALL)],
                         ids=lambda s: s.id)
def test_run_shape_without_flashinfer_records_not_available(no_flashinfer, shape):
    timer = Timer(CPU, warmup_ms=1, rep_ms=1)
    opt = Options(l2_bytes=1 << 40, workspace_mib=16, flex=False, sdpa_backends=())
    recs = run_shape(shape, CPU, timer, {}, opt, log=lambda *a: None)
    assert recs[0]["impl"] == "kvattn" and recs[0]["status"] == "ok"
    fi_recs = [r for r in recs if r["family"] == fi.FAMILY]
    assert fi_recs and all(r["status"] == "not available" for r in fi_recs)
    want = [n for n, _ in fi.kernels(shape)[0]] or ["fi"]
    assert [r["impl"] for r in fi_recs] == want
    assert all(("not importable" in r["note"]) or ("NVFP4" in r["note"]) for r in fi_recs)
    assert recs[0]["fi_ratio"] is None


def test_run_without_flashinfer_says_so(no_flashinfer, tmp_path, monkeypatch):
    ceilings = {"copy_gbps": 1.0, "matmul_bf16_tflops": 1.0, "matmul_fp8_tflops": None, "errors": None}
    monkeypatch.setattr(run.ceilings_mod, "measure", lambda dev, timer: dict(ceilings))
    doc = run.run(["sweep"], out=str(tmp_path / "r.json"), md=str(tmp_path / "r.md"), smoke=True,
                  filters=["sw05"], device="cpu", print_table=False, fi_prebuild=True)
    assert "not importable" in doc["env"]["flashinfer"]["error"]
    assert doc["env"]["flashinfer"]["prebuild"]["error"]
    assert "FlashInfer not available" in (tmp_path / "r.md").read_text()
    assert doc["summary"][-1]["class"] == "all" and doc["summary"][-1]["rows"] == 1
    assert doc["selection"]["flashinfer"]


# -- the peers' plumbing, against a stand-in FlashInfer --------------------------------------------


class _FakeFlashInfer:
    """A stand-in for ``flashinfer`` on a CPU: each entry point the peers call, with FlashInfer's
    signature, computing FlashInfer's attention in float64 from the forms it is handed (the CSR
    page list, the block table and lengths, XQA's draft mask). ``ignore_mask`` makes XQA let the
    drafts see each other: a mis-set peer the check must catch."""

    def __init__(self, ignore_mask: bool = False):
        fake = self
        self.ignore_mask = ignore_mask
        self.calls: list[str] = []

        class Decode:
            def __init__(self, ws, layout, use_tensor_cores=False, backend="auto"):
                self.layout = layout
                fake.calls.append(f"decode tc={use_tensor_cores} backend={backend}")

            def plan(self, indptr, indices, last, hq, hkv, d, page, *, q_data_type, kv_data_type, o_data_type,
                     sm_scale, q_len_per_req):
                self.csr, self.page, self.scale, self.q_len = (indptr, indices, last), page, sm_scale, q_len_per_req

            def run(self, q, kv, out):
                b = len(self.csr[2])
                mask = torch.ones(self.q_len, self.q_len, dtype=torch.bool).tril().expand(b, -1, -1)
                o = _fi_decode_attention(q, kv[0], kv[1], self.layout, self.csr, self.page, self.q_len, mask, self.scale)
                return out.copy_(o)

        def xqa_batch_decode_with_kv_cache(q, kv, ws, tables, seq, max_len, *, bmm1_scale, bmm2_scale, out,
                                           kv_layout, q_len_per_req, mask):
            fake.calls.append("xqa")
            lens = seq.view(torch.int32).tolist()
            page = kv[0].shape[1] if kv_layout == "NHD" else kv[0].shape[2]
            bits = None
            if q_len_per_req > 1:
                bits = fi.mask_bits(mask.view(torch.int16), q_len_per_req)
                if fake.ignore_mask:
                    bits = torch.ones_like(bits)
            csr = fi.csr_pages(tables, lens, page)
            o = _fi_decode_attention(q, kv[0], kv[1], kv_layout, csr, page, q_len_per_req, bits, bmm1_scale)
            return out.copy_(o)

        class MLA:
            def __init__(self, ws, backend="auto"):
                fake.calls.append(f"mla backend={backend}")

            def plan(self, *, metadata, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale,
                     q_data_type, kv_data_type):
                assert (head_dim_ckv, head_dim_kpe, q_data_type) == (512, 64, torch.bfloat16)
                self.meta, self.page, self.scale = metadata, page_size, sm_scale

            def run(self, *, query, kv_cache, out, **scales):
                m = self.meta
                outs = []
                for b in range(query.shape[0]):
                    lat = _mla_tokens(kv_cache, m, self.page, b)
                    s = torch.einsum("hd,jd->hj", query[b].double(), lat) * self.scale
                    outs.append(s.softmax(-1) @ lat[:, :512])
                return out.copy_(torch.stack(outs))

        class Meta:
            @staticmethod
            def csr(qo_indptr, kv_indptr, kv_indices, kv_len_arr):
                return types.SimpleNamespace(kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr)

        self.BatchDecodeWithPagedKVCacheWrapper = Decode
        self.decode = types.SimpleNamespace(xqa_batch_decode_with_kv_cache=xqa_batch_decode_with_kv_cache)
        self.mla = types.SimpleNamespace(BatchMLAPagedAttentionWrapper=MLA, MLAPlanMetadata=Meta)
        self.__version__ = "stand-in"


def _mla_tokens(pool, meta, page, b):
    """Request ``b``'s latent rows from FlashInfer's MLA CSR metadata (pages and lengths)."""
    pages = meta.kv_indices[int(meta.kv_indptr[b]):int(meta.kv_indptr[b + 1])].tolist()
    n = int(meta.kv_len_arr[b])
    rows = [pool[p, r] for i, p in enumerate(pages) for r in range(min(page, n - i * page))]
    return torch.stack(rows).double()


@pytest.fixture
def fake_flashinfer(monkeypatch):
    def install(**kw):
        fake = _FakeFlashInfer(**kw)
        monkeypatch.setitem(sys.modules, "flashinfer", fake)
        monkeypatch.setitem(sys.modules, "flashinfer.mla", fake.mla)
        fi.reset_import_state()
        return fake

    yield install
    fi.reset_import_state()


@pytest.mark.parametrize("shape", [DECODE[0], DECODE[1], DECODE[3], MLA], ids=lambda s: s.id)
def test_peers_hand_flashinfer_kvattns_problem(fake_flashinfer, shape):
    fake = fake_flashinfer()
    timer = Timer(CPU, warmup_ms=1, rep_ms=1)
    opt = Options(l2_bytes=1 << 40, workspace_mib=16, flex=False, sdpa_backends=())
    recs = run_shape(shape, CPU, timer, {}, opt, log=lambda *a: None)
    fi_recs = [r for r in recs if r["family"] == fi.FAMILY]
    assert [r["impl"] for r in fi_recs] == [n for n, _ in fi.kernels(shape)[0] if n != "fi-fa2" or shape.q_len == 1]
    for r in fi_recs:
        assert r["status"] == "ok", r
        assert r["check_against"] == "kvattn" and r["rel_err"] < 1e-2 and not r.get("check_failed")
    assert recs[0]["check_against"] == fi_recs[0]["impl"]  # no torch peer ran: kvattn's check is FlashInfer's
    if shape.suite != "mla":
        assert "decode tc=True backend=fa2" in fake.calls and "xqa" in fake.calls


def test_a_mis_set_peer_is_caught(fake_flashinfer):
    fake_flashinfer(ignore_mask=True)
    timer = Timer(CPU, warmup_ms=1, rep_ms=1)
    opt = Options(l2_bytes=1 << 40, workspace_mib=16, flex=False, sdpa_backends=())
    recs = run_shape(DECODE[3], CPU, timer, {}, opt, log=lambda *a: None)
    by = {r["impl"]: r for r in recs}
    assert not by["fi-fa2-tc"].get("check_failed")
    assert by["fi-xqa"]["check_failed"] and "CHECK FAILED" in by["fi-xqa"]["note"]
