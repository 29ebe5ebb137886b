"""Call builders of the decode family: batch decode (:func:`kvattn.xqa_batch_decode_with_kv_cache`),
``xqa`` and single decode."""

from __future__ import annotations

import random

import torch

from .. import dense
from ..formats import FP8_DTYPE
from ..testing import randn, seeded
from .call import Call
from .build_common import (
    DTYPES, _scale, _num, widen, _views, _pages, _seq_lens, _host_bound, _rewrite_paged, _cu, _spec_mask,
    _decode_exact, _kind, _call, _workspace, own, float64,
)


def _batch_decode(spec, device) -> Call:
    g = seeded(spec["seed"] + 1)
    qdt = DTYPES[spec["dtype"]]
    fmt = spec["dtype"] if spec["kv_format"] == "half" else spec["kv_format"]
    hkv, d, nq = spec["kv_heads"], spec["head_dim"], spec["q_len"]
    hq, bsz = hkv * spec["group"], spec["batch"]
    c = _pages(spec, device, fmt, num_kv_heads=hkv, head_dim=d, layout=spec["layout"], form=spec["form"])
    cache, sf = c.kv_cache, c.kv_cache_sf
    if spec["view"] == "strided":
        cache, sf = widen(cache, g), widen(sf, g)
    drafts = spec["drafts"]  # ragged drafts: rows of request b at cu[b] : cu[b + 1]
    rows = bsz * nq if drafts is None else sum(drafts)
    query = randn(rows, hq, d, dtype=qdt, device=device, generator=g)
    seq_lens = _seq_lens(c.seq_lens, spec["seq_lens_dtype"])
    tables = c.block_tables
    bmm1 = _scale(spec["bmm1_scale"], device, d ** -0.5)
    bmm2 = _scale(spec["bmm2_scale"], device, 1.0)
    sinks = randn(hq, generator=g, scale=2.0).to(device) if spec["sinks"] else None
    mask = None
    if spec["mask"]:
        mask = _spec_mask(g, (bsz, nq) if drafts is None else (rows,), nq, device)
    cu = _cu(drafts, device, spec["cu_dtype"])
    out_dtype = {"none": None, "query": qdt, "float32": torch.float32, "fp8": FP8_DTYPE}[spec["out"]]
    out = None if out_dtype is None else torch.empty(rows, hq, d, dtype=out_dtype, device=device)
    lse = torch.empty(rows, hq, dtype=torch.float32, device=device) if spec["lse_given"] else None
    query, tables, seq_lens, out, lse = _views(spec, query=query, tables=tables, seq_lens=seq_lens, out=out, lse=lse)
    ws = _workspace(device)
    kw = dict(query=query, kv_cache=cache, workspace_buffer=ws, block_tables=tables, seq_lens=seq_lens,
              max_seq_len=_host_bound(spec), bmm1_scale=bmm1, bmm2_scale=bmm2, window_left=spec["window_left"],
              out=out, sinks=sinks, kv_layout=spec["layout"], enable_pdl=spec["enable_pdl"], q_len_per_req=nq,
              o_scale=spec["o_scale"], mask=mask, kv_cache_sf=sf, q_cu_seq_lens=cu, return_lse=spec["return_lse"],
              lse=lse)

    def exact(kw=kw, drafts=drafts):
        common = {k: v for k, v in kw.items()
                  if k not in ("return_lse", "query", "block_tables", "seq_lens", "q_len_per_req", "mask",
                               "q_cu_seq_lens")}
        return _decode_exact(kw["query"], drafts, nq, kw["mask"], kw["block_tables"], kw["seq_lens"], **common)

    def request(b):
        sub = dict(kw)
        if drafts is None:
            r = slice(b * nq, (b + 1) * nq)
            sub_mask = None if mask is None else mask[b:b + 1]
        else:
            r = slice(sum(drafts[:b]), sum(drafts[:b + 1]))
            sub_mask = None if mask is None else mask[r]
            sub["q_cu_seq_lens"] = _cu([drafts[b]], device, spec["cu_dtype"])
        sub.update(query=own(query[r]), block_tables=own(tables[b:b + 1]), seq_lens=own(seq_lens[b:b + 1]),
                   mask=own(sub_mask),
                   out=None if out is None else torch.empty_like(out[r]),
                   lse=None if lse is None else torch.empty_like(lse[r]))
        one = None if drafts is None else [drafts[b]]
        return _call(spec, sub, lambda: exact(sub, one), out_kind, [sub["out"], sub["lse"]], stored, 1)

    out_kind = _kind(out_dtype or qdt)
    stored = spec["o_scale"] if out_dtype == FP8_DTYPE else 1.0
    call = _call(spec, kw, exact, out_kind, [out, lse], stored, bsz)
    call.request = request
    # Ragged drafts stay with their request's position (the offsets are not rewritten), so the
    # rows are not permuted and each length stays at or above its drafts.
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens}, spec["lens"],
                                  [nq] * bsz if drafts is None else drafts, drafts is None, [bmm1, bmm2])
    return call


def _xqa(spec, device) -> Call:
    g = seeded(spec["seed"] + 1)
    qdt = DTYPES[spec["dtype"]]
    fmt = spec["dtype"] if spec["kv_format"] == "half" else spec["kv_format"]
    hkv, d, page = spec["kv_heads"], spec["head_dim"], spec["page"]
    group, nq, drafts = spec["group"], spec["q_len"], spec["drafts"]
    hq, bsz = hkv * group, spec["batch"]
    c = _pages(spec, device, fmt, num_kv_heads=hkv, head_dim=d, form="tuple")
    k_pages, v_pages = c.kv_cache  # [P, page, Hkv, D] (NVFP4: uint8, last dim D / 2)
    sf_pages = c.kv_cache_sf  # NVFP4: (K, V) block scales [P, page, Hkv, D / 16]; else None
    layout = "HND" if spec["pool"] == "HND" else "NHD"

    def pool(x):
        if x is None:
            return None
        if spec["pool"] == "flat":
            x = x.contiguous().view(-1, x.shape[-1])
        elif spec["pool"] == "HND":
            x = x.transpose(1, 2).contiguous()
        else:
            x = x.contiguous()
        return widen(x, g) if spec["view"] == "strided" else x

    k_cache, v_cache = pool(k_pages), pool(v_pages)
    k_sf, v_sf = (None, None) if sf_pages is None else (pool(sf_pages[0]), pool(sf_pages[1]))
    # q: [B, 1, Hq, D]; speculative decoding [B, 1, Q, Hq, D]; ragged drafts packed [total_q, Hq, D].
    if drafts is not None:
        q_shape = (sum(drafts), hq, d)
    else:
        q_shape = (bsz, 1, hq, d) if nq == 1 else (bsz, 1, nq, hq, d)
    q = randn(*q_shape, dtype=qdt, device=device, generator=g)
    seq_lens = _seq_lens(c.seq_lens, spec["seq_lens_dtype"]).view(bsz, 1)
    tables = c.block_tables
    out_dtype = FP8_DTYPE if spec["out"] == "fp8" else qdt
    output = torch.empty(q_shape, dtype=out_dtype, device=device)
    q_scale = _scale(spec["q_scale"], device, 1.0)
    kv_scale = None
    if spec["kv_scale"]:
        kv_scale = torch.tensor([random.Random(spec["seed"]).uniform(0.5, 2.0)], dtype=torch.float32, device=device)
    sinks = randn(hkv, group, generator=g, scale=2.0).to(device) if spec["sinks"] else None
    mask = None
    if spec["mask"]:
        mask = _spec_mask(g, (bsz, nq) if drafts is None else (q_shape[0],), nq, device)
    lse = torch.empty(q_shape[:-1], dtype=torch.float32, device=device) if spec["lse_given"] else None
    q, tables, seq_lens, output, lse = _views(spec, q=q, tables=tables, seq_lens=seq_lens, output=output, lse=lse)
    kw = dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=tables, seq_lens=seq_lens, output=output,
              workspace_buffer=_workspace(device), semaphores=torch.zeros(64, dtype=torch.uint32, device=device),
              num_kv_heads=hkv, page_size=page, sinks=sinks, q_scale=q_scale, kv_scale=kv_scale,
              sliding_win_size=spec["sliding_win_size"], sm_count=spec["sm_count"], kv_layout=layout,
              enable_pdl=spec["enable_pdl"], rcp_out_scale=spec["rcp_out_scale"], q_seq_len=nq, mask=mask,
              q_cu_seq_lens=_cu(drafts, device, spec["cu_dtype"]), k_sf_cache=k_sf, v_sf_cache=v_sf,
              return_lse=spec["return_lse"], lse=lse)

    def exact(kw=kw, drafts=drafts):
        if nq == 1 and drafts is None and sf_pages is None:
            return float64(dense.xqa, q=kw["q"], k_cache=kw["k_cache"], v_cache=kw["v_cache"],
                          page_table=kw["page_table"], seq_lens=kw["seq_lens"].to(torch.int32), num_kv_heads=hkv,
                          page_size=page, sinks=kw["sinks"], q_scale=kw["q_scale"], kv_scale=kw["kv_scale"],
                          sliding_win_size=kw["sliding_win_size"], kv_layout=layout, return_lse=True)
        # Drafts and NVFP4 pools: xqa is batch decode in other units (docs/semantics.md, section 2):
        # logits q_scale * kv_scale_eff / sqrt(D), output times kv_scale_eff, window W = window_left
        # W - 1, sinks [Hkv, G] as [Hq]; the pages the pools were made from, read through the table.
        quantised = fmt in ("fp8", "nvfp4")
        kv_eff = _num(kw["kv_scale"]) if quantised and kw["kv_scale"] is not None else 1.0
        win = kw["sliding_win_size"]
        o, lse_ = _decode_exact(kw["q"].reshape(-1, hq, d), drafts, nq, kw["mask"], kw["page_table"],
                                kw["seq_lens"].reshape(-1).to(torch.int32), kv_cache=(k_pages, v_pages),
                                kv_cache_sf=sf_pages, kv_layout="NHD", bmm1_scale=_num(kw["q_scale"]) * kv_eff / d ** 0.5,
                                bmm2_scale=kv_eff, window_left=win - 1 if win > 0 else -1,
                                sinks=None if kw["sinks"] is None else kw["sinks"].reshape(-1))
        return o.reshape(kw["q"].shape), lse_.reshape(kw["q"].shape[:-1])

    def request(b):
        sub = dict(kw)
        if drafts is None:
            r = slice(b, b + 1)
            sub_mask = None if mask is None else mask[b:b + 1]
        else:
            r = slice(sum(drafts[:b]), sum(drafts[:b + 1]))
            sub_mask = None if mask is None else mask[r]
            sub["q_cu_seq_lens"] = _cu([drafts[b]], device, spec["cu_dtype"])
        sub.update(q=own(q[r]), page_table=own(tables[b:b + 1]), seq_lens=own(seq_lens[b:b + 1]), mask=own(sub_mask),
                   output=torch.empty_like(output[r]), lse=None if lse is None else torch.empty_like(lse[r]))
        one = None if drafts is None else [drafts[b]]
        return _call(spec, sub, lambda: exact(sub, one), _kind(out_dtype), [sub["output"], sub["lse"]], stored)

    # An fp8 output stores the result times rcp_out_scale; the others ignore it.
    stored = 1.0 / spec["rcp_out_scale"] if out_dtype == FP8_DTYPE else 1.0
    call = _call(spec, kw, exact, _kind(out_dtype), [output, lse], stored, batch=bsz)
    call.request = request
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens}, spec["lens"],
                                  [nq] * bsz if drafts is None else drafts, drafts is None, [q_scale, kv_scale])
    return call


def _single_decode(spec, device) -> Call:
    g = seeded(spec["seed"] + 1)
    qdt = DTYPES[spec["dtype"]]
    hkv, d, length = spec["kv_heads"], spec["head_dim"], spec["length"]
    hq = hkv * spec["group"]
    q = randn(hq, d, dtype=qdt, device=device, generator=g)
    kv_dt = FP8_DTYPE if spec["kv_format"] == "fp8" else qdt
    shape = (length, hkv, d) if spec["layout"] == "NHD" else (hkv, length, d)
    k = randn(*shape, dtype=kv_dt, device=device, generator=g)
    v = randn(*shape, dtype=kv_dt, device=device, generator=g)
    if spec["view"] == "strided":
        k, v = widen(k, g), widen(v, g)
    out_dtype = {"none": None, "query": qdt, "float32": torch.float32}[spec["out"]]
    out = None if out_dtype is None else torch.empty(hq, d, dtype=out_dtype, device=device)
    lse = torch.empty(hq, dtype=torch.float32, device=device) if spec["lse_given"] else None
    q, out = _views(spec, q=q, out=out)  # (a 1-D lse has only its contiguous last dim)
    kw = dict(q=q, k=k, v=v, kv_layout=spec["layout"], pos_encoding_mode=spec["pos_encoding_mode"],
              use_tensor_cores=spec["use_tensor_cores"], q_scale=spec["q_scale"], k_scale=spec["k_scale"],
              v_scale=spec["v_scale"], window_left=spec["window_left"], logits_soft_cap=spec["logits_soft_cap"],
              sm_scale=spec["sm_scale"], rope_scale=spec["rope_scale"], rope_theta=spec["rope_theta"],
              return_lse=spec["return_lse"], out=out, lse=lse)

    def exact(kw=kw):
        args = {k_: v_ for k_, v_ in kw.items() if k_ not in ("out", "lse", "return_lse")}
        return float64(dense.single_decode, **args, return_lse=True)

    def rewrite(rng):  # no lengths to change: new query values, in place
        q.copy_(torch.randn(q.shape, generator=seeded(rng.randrange(2**31))).to(q.dtype))

    call = _call(spec, kw, exact, _kind(out_dtype or qdt), [out, lse])
    call.rewrite = rewrite
    return call
