"""One small call per kernel variant, for compute-sanitizer (``benchmarks/sanitize.sh`` runs it
under memcheck, racecheck and synccheck).

Every kernel family of kvattn, on small shapes so each tool finishes in seconds: decode (one
split, split-KV with the in-kernel merge, split-KV with the combine launch, fp8 cache), xqa
(a persistent grid), single decode (plain, RoPE), MLA (Triton, Gluon, warp-specialised Gluon:
mbarriers and TMA), prefill (Triton, warp-specialised Gluon), the append kernel, the merge
kernels; then the device-side clamps (lengths of 2^31 - 1 and -2^31, uint32 lengths past 2^31,
negative and too large ``cum_seq_lens_q``, corrupt page ids) and the batch-invariant mode.

    PYTHONPATH=src python benchmarks/sanitize_driver.py            # every variant
    PYTHONPATH=src python benchmarks/sanitize_driver.py mla_gluon  # those whose name contains it

Each variant prints ``ok <name> <ms>`` (or ``FAIL <name>: <error>``); the exit status is the
number of failures. Outputs are checked for NaN where the call must produce finite values.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

import torch

import kvattn
from kvattn.runtime import env as _env
from kvattn.formats import FP8_DTYPE
from kvattn.testing import make_paged_kv

DEV = os.environ.get("SANITIZE_DEVICE", "cuda")  # "cpu": a smoke test of the calls (reference backend)
BF16 = torch.bfloat16
WS_BYTES = 32 << 20


def _ws():
    return torch.zeros(WS_BYTES, dtype=torch.uint8, device=DEV)


def _finite(t):
    assert torch.isfinite(t.float()).all(), "non-finite output"


# ---------------------------------------------------------------------------------------------
# decode / xqa / single decode
# ---------------------------------------------------------------------------------------------
def _decode(lens=(300, 7, 0, 129), *, hkv=2, group=4, d=128, page=16, kv_format="bfloat16", seq_lens=None,
            tables=None, max_len=None):
    case = make_paged_kv(list(lens), num_kv_heads=hkv, head_dim=d, page_size=page, kv_format=kv_format,
                         dtype=BF16, device=DEV, seed=1)
    q = torch.randn(len(lens), hkv * group, d, device=DEV).to(BF16)
    return kvattn.decode.xqa_batch_decode_with_kv_cache(
        q, case.kv_cache, _ws(), case.block_tables if tables is None else tables(case.block_tables),
        case.seq_lens if seq_lens is None else seq_lens(case), max_len or max(max(lens), 1), bmm1_scale=d ** -0.5,
        kv_cache_sf=case.kv_cache_sf)


def decode_one_split():
    from kvattn.ops.decode import configs
    with configs.override(min_chunk=1 << 20):
        _finite(_decode())


def _decode_split(fused_merge: str):
    from kvattn.ops.decode import configs
    with _env.switches(KVATTN_FUSED_MERGE=fused_merge), configs.override(min_chunk=32, waves=8):
        _finite(_decode())


def decode_split_fused_merge():
    _decode_split("1")


def decode_split_combine():
    _decode_split("0")


def decode_fp8_cache():
    _finite(_decode(kv_format="fp8"))


def decode_spec_q3():
    hkv, group, d, page = 2, 4, 128, 16
    lens = [200, 40]
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=BF16, device=DEV, seed=2)
    q = torch.randn(len(lens) * 3, hkv * group, d, device=DEV).to(BF16)
    out = kvattn.decode.xqa_batch_decode_with_kv_cache(q, case.kv_cache, _ws(), case.block_tables, case.seq_lens,
                                                       200, bmm1_scale=0.1, q_len_per_req=3)
    _finite(out)


def xqa_persistent():
    hkv, group, d, page = 2, 4, 128, 16
    lens = [300, 5, 64]
    case = make_paged_kv(lens, num_kv_heads=hkv, head_dim=d, page_size=page, dtype=BF16, form="tuple", device=DEV,
                         seed=3)
    k, v = case.kv_cache
    q = torch.randn(len(lens), 1, hkv * group, d, device=DEV).to(BF16)
    out = torch.empty_like(q)
    kvattn.xqa.xqa(q, k, v, case.block_tables, case.seq_lens.view(-1, 1), out, _ws(),
                   torch.zeros(8, dtype=torch.uint32, device=DEV), hkv, page, sm_count=2, kv_layout="NHD")
    _finite(out)


def single_decode():
    q = torch.randn(32, 128, device=DEV).to(BF16)
    k = torch.randn(700, 8, 128, device=DEV).to(BF16)
    v = torch.randn(700, 8, 128, device=DEV).to(BF16)
    _finite(kvattn.decode.single_decode_with_kv_cache(q, k, v))


def single_decode_rope():
    q = torch.randn(32, 128, device=DEV).to(BF16)
    k = torch.randn(700, 32, 128, device=DEV).to(BF16)
    v = torch.randn(700, 32, 128, device=DEV).to(BF16)
    _finite(kvattn.decode.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA"))


# ---------------------------------------------------------------------------------------------
# MLA
# ---------------------------------------------------------------------------------------------
def _mla(*, gluon="1", ws="1", lens=(200, 64, 0), hq=64, page=64, seq_lens=None, max_len=None, fp8=False, q_len=1):
    # (KVATTN_GLUON=1 asks for the Gluon kernels, as the GPU-verified Tritons run them by default;
    # fp8: an e4m3 query and cache, the bf16 draws converted; q_len: query tokens a request)
    with _env.switches(KVATTN_GLUON=gluon, KVATTN_GLUON_WS=ws):
        case = make_paged_kv(list(lens), num_kv_heads=1, head_dim=576, page_size=page, dtype=BF16, form="shared",
                             device=DEV, seed=4)
        cache = case.kv_cache[:, 0, :, 0]
        q = torch.randn(len(lens), q_len, hq, 576, device=DEV).to(BF16)
        if fp8:
            cache, q = cache.to(torch.float8_e4m3fn), q.to(torch.float8_e4m3fn)
        return kvattn.mla.xqa_batch_decode_with_kv_cache_mla(
            q, cache, _ws(), 128, 512, 64, case.block_tables, case.seq_lens if seq_lens is None else seq_lens(case),
            max_len or max(lens), bmm1_scale=0.07)


def mla_triton():
    _finite(_mla(gluon="0"))


def mla_gluon():
    _finite(_mla(ws="0"))


def mla_gluon_ws():
    _finite(_mla())


def mla_gluon_ws_fp8():
    _finite(_mla(fp8=True))


# Multi-token prediction: 16 heads x 4 tokens in the 64-row programs (per-row key limits), a request
# exactly 4 long and one shorter (rows at negative positions), on each kernel.
MTP_LENS = (200, 4, 2, 0, 129)


def mla_mtp_triton():
    _finite(_mla(gluon="0", hq=16, q_len=3, lens=MTP_LENS))


def mla_mtp_gluon():
    _finite(_mla(ws="0", hq=16, q_len=4, lens=MTP_LENS))


def mla_mtp_gluon_ws():
    _finite(_mla(hq=16, q_len=4, lens=MTP_LENS))


def mla_mtp_gluon_ws_fp8():
    _finite(_mla(fp8=True, hq=16, q_len=4, lens=MTP_LENS))


# ---------------------------------------------------------------------------------------------
# prefill
# ---------------------------------------------------------------------------------------------
def _prefill(*, page, d=128, lens=(150, 64), q_lens=(70, 64), seq_lens=None, cum_q=None, out_rows=None, fmt=None,
             q_dtype=BF16, ws=None):
    hkv, group = 2, 4
    case = make_paged_kv(list(lens), num_kv_heads=hkv, head_dim=d, page_size=page, dtype=BF16, device=DEV, seed=5,
                         **({"kv_format": fmt} if fmt else {}))
    rows = sum(q_lens)
    q = torch.randn(rows, hkv * group, d, device=DEV).to(q_dtype)
    cq = torch.tensor([0, q_lens[0], rows], dtype=torch.int32, device=DEV) if cum_q is None else cum_q
    ckv = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device=DEV)
    out = torch.empty(rows if out_rows is None else out_rows, hkv * group, d, dtype=BF16, device=DEV)
    kvattn.prefill.trtllm_batch_context_with_kv_cache(
        q[: out.shape[0]], case.kv_cache, _ws() if ws is None else ws, case.block_tables,
        case.seq_lens if seq_lens is None else seq_lens(case), max(q_lens), max(lens), d ** -0.5, 1.0, 2, cq, ckv,
        out=out, kv_layout="NHD", kv_block_scales=case.kv_cache_sf)
    return out


def prefill_triton():
    with _env.switches(KVATTN_GLUON="0"):  # (pages of 16 take the Gluon kernel on Hopper otherwise)
        _finite(_prefill(page=16))


def prefill_gluon_ws():
    _finite(_prefill(page=64))


def prefill_gluon_ws_small_pages():
    _finite(_prefill(page=16))


def prefill_gluon_ws_fp8():
    """A bf16 query over an fp8 cache: the converter partition turns K and V into float16."""
    _finite(_prefill(page=64, fmt="fp8"))


def prefill_gluon_ws_fp8q():
    """An fp8 query and cache: scores on the copied K, V converted."""
    _finite(_prefill(page=64, fmt="fp8", q_dtype=FP8_DTYPE))


def _staged(**kw):
    """A call whose quantised pages are staged in a workspace big enough for them (staging's
    threshold of query rows lifted: these calls are small)."""
    from kvattn.ops.prefill import configs as prefill_configs
    from kvattn.ops.prefill import plan as prefill_plan

    saved = dict(prefill_configs.STAGE_MIN_ROWS)
    prefill_configs.STAGE_MIN_ROWS.update(dict.fromkeys(prefill_configs.STAGE_MIN_ROWS, 0))
    prefill_plan._PLANS.clear()  # (plans hold the threshold as it was)
    try:
        return _prefill(ws=torch.zeros(8 << 20, dtype=torch.uint8, device=DEV), **kw)
    finally:
        prefill_configs.STAGE_MIN_ROWS.update(saved)
        prefill_plan._PLANS.clear()


def prefill_staged_fp8():
    """A bf16 query over an fp8 cache, its pages staged as bf16."""
    _finite(_staged(page=64, fmt="fp8"))


def prefill_staged_fp8q():
    """An fp8 query and cache: scores on the copied K, V staged as float16."""
    _finite(_staged(page=64, fmt="fp8", q_dtype=FP8_DTYPE))


def prefill_staged_nvfp4():
    """A bf16 query over an NVFP4 cache, its pages staged as bf16."""
    _finite(_staged(page=16, fmt="nvfp4"))


# ---------------------------------------------------------------------------------------------
# append, merge
# ---------------------------------------------------------------------------------------------
def append():
    hkv, d, page = 2, 128, 16
    cache = torch.zeros(8, 2, page, hkv, d, dtype=BF16, device=DEV)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32, device=DEV)
    n = 40
    key = torch.randn(n, hkv, d, device=DEV).to(BF16)
    b = torch.tensor([i % 2 for i in range(n)], dtype=torch.int32, device=DEV)
    p = torch.arange(n, dtype=torch.int32, device=DEV) // 2
    # tokens aimed outside the batch, the table and the pool: dropped
    b[0], p[1], tables[1, 2] = 7, 10_000, 1 << 30
    kvattn.append_paged_kv_cache(key, key.clone(), cache, tables, b, p)


def merge():
    o = torch.randn(3, 5, 8, 128, device=DEV).to(BF16)
    lse = torch.randn(3, 5, 8, device=DEV)
    lse[1, 0] = float("-inf")
    out, out_lse = kvattn.merge_states(o, lse)
    _finite(out)
    out, out_lse = kvattn.merge_state(o[0], lse[0], o[1], lse[1])
    _finite(out)


# ---------------------------------------------------------------------------------------------
# device-side clamps (KVATTN_DEBUG off): nothing outside the tensors whatever they hold
# ---------------------------------------------------------------------------------------------
def _full(case, value, dtype=torch.int32):
    return torch.full(case.seq_lens.shape, value, dtype=torch.int64).to(dtype).to(DEV)


def guard_decode_lengths():
    _decode(seq_lens=lambda c: _full(c, 2**31 - 1), max_len=320)
    _decode(seq_lens=lambda c: _full(c, -(2**31)), max_len=320)
    _decode(seq_lens=lambda c: _full(c, 2**32 - 1, torch.int64).to(torch.uint32), max_len=320)


def guard_decode_page_ids():
    def corrupt(t):
        t = t.clone()
        t[0, 0], t[0, 1], t[1, 0] = 2**31 - 1, -(2**31), -1
        return t
    _decode(tables=corrupt)


def guard_mla_lengths():
    for gluon, ws in (("0", "0"), ("1", "0"), ("1", "1")):
        _mla(gluon=gluon, ws=ws, seq_lens=lambda c: _full(c, 2**31 - 1), max_len=256)
        _mla(gluon=gluon, ws=ws, seq_lens=lambda c: _full(c, -5), max_len=256)


def guard_prefill():
    for page in (16, 64):
        _prefill(page=page, seq_lens=lambda c: _full(c, 2**31 - 1))
        for cum in ([-50, 20, 134], [0, 100, 40], [-(2**31), 5, 2**31 - 1]):
            dtype = torch.int64 if max(map(abs, cum)) >= 2**31 else torch.int32
            _prefill(page=page, cum_q=torch.tensor(cum, dtype=dtype, device=DEV))
        _prefill(page=page, out_rows=60)  # rows of the batch past `out` (cum_seq_lens_q[-1] > rows)


# ---------------------------------------------------------------------------------------------
# racecheck calibration (benchmarks/sanitize_calibration.py): exchanges ordered by construction
# ---------------------------------------------------------------------------------------------
def _calibration(rounds: int, layout: str, meet: bool = False):
    """(Gluon kernels: a GPU only; with SANITIZE_DEVICE=cpu the variants pass without running.)"""
    if DEV == "cuda":
        from sanitize_calibration import run
        run(rounds, layout, meet)


def calibration_exchange():
    _calibration(1, "thread")


def calibration_exchange_loop():
    _calibration(4, "thread")


def calibration_exchange_rows():
    _calibration(4, "rows")


def calibration_exchange_meet():
    _calibration(1, "rows", meet=True)


def calibration_exchange_quads():
    _calibration(4, "quads")


# ---------------------------------------------------------------------------------------------
# batch-invariant mode
# ---------------------------------------------------------------------------------------------
def invariant_decode_mla():
    from kvattn.ops.decode import configs as dc
    from kvattn.ops.mla import configs as mc
    with kvattn.batch_invariant(), dc.override(invariant_span=128), mc.override(invariant_span=128):
        _finite(_decode())
        _finite(_mla())
        _finite(_mla(gluon="0"))
        single_decode()


VARIANTS = [
    decode_one_split, decode_split_fused_merge, decode_split_combine, decode_fp8_cache, decode_spec_q3,
    xqa_persistent, single_decode, single_decode_rope, mla_triton, mla_gluon, mla_gluon_ws, mla_gluon_ws_fp8,
    mla_mtp_triton, mla_mtp_gluon, mla_mtp_gluon_ws, mla_mtp_gluon_ws_fp8,
    prefill_triton,
    prefill_gluon_ws, prefill_gluon_ws_small_pages, prefill_gluon_ws_fp8, prefill_gluon_ws_fp8q,
    prefill_staged_fp8, prefill_staged_fp8q, prefill_staged_nvfp4, append, merge, guard_decode_lengths, guard_decode_page_ids,
    guard_mla_lengths, guard_prefill,
    invariant_decode_mla, calibration_exchange, calibration_exchange_loop, calibration_exchange_rows,
    calibration_exchange_meet, calibration_exchange_quads,
]


def main(argv) -> int:
    torch.manual_seed(0)
    wanted = [a for a in argv if not a.startswith("-")]
    failures = 0
    for fn in VARIANTS:
        if wanted and not any(w in fn.__name__ for w in wanted):
            continue
        t0 = time.perf_counter()
        try:
            fn()
            if DEV == "cuda":
                torch.cuda.synchronize()
            print(f"ok {fn.__name__} {1e3 * (time.perf_counter() - t0):.0f} ms", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on: one tool run covers every variant
            failures += 1
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=3)
    print(f"driver: {failures} failure(s)", flush=True)
    return failures


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
