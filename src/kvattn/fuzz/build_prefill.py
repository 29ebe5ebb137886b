"""The call builder of paged causal prefill (:func:`kvattn.trtllm_batch_context_with_kv_cache`)."""

from __future__ import annotations

import torch

from .. import dense
from ..formats import FP8_DTYPE, FP4Tensor
from ..testing import randn, seeded
from .call import Call
from .build_common import (
    DTYPES, _scale, widen, _views, _pages, _seq_lens, _host_bound, _rewrite_paged, _kind, _call, _workspace, own,
    float64,
)


def _prefill(spec, device) -> Call:
    g = seeded(spec["seed"] + 1)
    half = DTYPES[spec["dtype"]]
    qdt = FP8_DTYPE if spec["fp8_query"] else half
    fmt = spec["dtype"] if spec["kv_format"] == "half" else spec["kv_format"]
    hkv, d = spec["kv_heads"], spec["head_dim"]
    hq, bsz = hkv * spec["group"], spec["batch"]
    split = spec["split_tables"]
    c = _pages(spec, device, fmt, num_kv_heads=hkv, head_dim=d, layout=spec["layout"], form=spec["form"],
               split_tables=split)
    cache, sf = c.kv_cache, c.kv_cache_sf
    if spec["view"] == "strided":
        cache, sf = widen(cache, g), widen(sf, g)
    q_lens = spec["q_lens"]
    sum_q = sum(q_lens)
    query = randn(sum_q, hq, d, dtype=qdt, device=device, generator=g)
    seq_lens = _seq_lens(c.seq_lens, spec["seq_lens_dtype"])
    tables = c.block_tables
    cum_q = torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    cum_kv = torch.tensor([0] + spec["lens"], dtype=torch.int64).cumsum(0).to(torch.int32).to(device)
    bmm1 = _scale(spec["bmm1_scale"], device, d ** -0.5)
    bmm2 = _scale(spec["bmm2_scale"], device, 1.0)
    sinks = None
    if spec["sinks"]:
        s = randn(hq, generator=g, scale=2.0).to(device)
        sinks = [s] if spec["sinks"] == "list" else s
    out_dtype = {"none": None, "query": qdt, "fp8": FP8_DTYPE, "nvfp4": "nvfp4"}[spec["out_dtype"]]
    out = None
    buffers = []
    if spec["out"]:
        if out_dtype == "nvfp4":
            out = FP4Tensor.empty(sum_q, hq, d, device)
            buffers += [out.data, out.scale]
        else:
            out = torch.empty(sum_q, hq, d, dtype=out_dtype or qdt, device=device)
            buffers.append(out)
    lse = torch.empty(sum_q, hq, dtype=torch.float32, device=device) if spec["lse_given"] else None
    plain_out = out if isinstance(out, torch.Tensor) else None
    query, tables, seq_lens, plain_out, lse = _views(spec, query=query, tables=tables, seq_lens=seq_lens,
                                                     out=plain_out, lse=lse)
    if isinstance(out, torch.Tensor):
        out = plain_out
        buffers = [out]
    max_kv = _host_bound(spec)
    kw = dict(query=query, kv_cache=cache, workspace_buffer=_workspace(device), block_tables=tables,
              seq_lens=seq_lens, max_q_len=max(q_lens + [0]), max_kv_len=max_kv, bmm1_scale=bmm1,
              bmm2_scale=bmm2, batch_size=bsz, cum_seq_lens_q=cum_q, cum_seq_lens_kv=cum_kv,
              window_left=spec["window_left"], out=out, out_dtype=out_dtype, o_sf_scale=spec["o_sf_scale"],
              o_sf_vec_size=spec["o_sf_vec_size"],
              kv_layout=spec["layout"], enable_pdl=spec["enable_pdl"], sinks=sinks,
              kv_cache_sf=sf if spec["sf_name"] == "kv_cache_sf" else None,
              kv_block_scales=sf if spec["sf_name"] == "kv_block_scales" else None,
              skip_softmax_threshold_scale_factor=spec["skip_softmax"], uses_shared_paged_kv_idx=not split,
              causal=spec["causal"], return_lse=spec["return_lse"], lse=lse,
              multi_ctas_kv_counter_buffer=(torch.zeros(256, dtype=torch.int32, device=device)
                                            if spec["counter_buffer"] else None),
              use_fp16_softmax=spec["use_fp16_softmax"], uses_spcompress=spec["uses_spcompress"],
              backend=spec["backend"])

    def exact(kw=kw):
        tables_, seq_, cum_ = kw["block_tables"], kw["seq_lens"], kw["cum_seq_lens_q"]
        blocks = kw["kv_cache_sf"] if kw["kv_cache_sf"] is not None else kw["kv_block_scales"]
        return float64(dense.context, query=kw["query"], kv_cache=kw["kv_cache"], block_tables=tables_,
                      seq_lens=seq_, cum_seq_lens_q=cum_, bmm1_scale=kw["bmm1_scale"],
                      bmm2_scale=kw["bmm2_scale"], window_left=kw["window_left"], sinks=kw["sinks"],
                      kv_layout=kw["kv_layout"], kv_block_scales=blocks,
                      uses_shared_paged_kv_idx=kw["uses_shared_paged_kv_idx"],
                      skip_softmax_threshold_scale_factor=kw["skip_softmax_threshold_scale_factor"], return_lse=True,
                      causal=kw["causal"])

    out_kind = "nvfp4" if out_dtype == "nvfp4" else _kind(out_dtype or qdt)
    sf_scale = spec["o_sf_scale"] or 1.0

    def request(b):
        sub = dict(kw)
        r0, r1 = sum(q_lens[:b]), sum(q_lens[:b + 1])
        sub_out = None
        bufs = []
        if out is not None:
            sub_out = FP4Tensor.empty(r1 - r0, hq, d, device) if out_dtype == "nvfp4" else torch.empty_like(out[r0:r1])
            bufs += [sub_out.data, sub_out.scale] if out_dtype == "nvfp4" else [sub_out]
        sub.update(query=own(query[r0:r1]), block_tables=own(tables[b:b + 1]), seq_lens=own(seq_lens[b:b + 1]),
                   batch_size=1,
                   cum_seq_lens_q=torch.tensor([0, r1 - r0], dtype=torch.int32, device=device),
                   cum_seq_lens_kv=torch.tensor([0, spec["lens"][b]], dtype=torch.int32, device=device),
                   out=sub_out, lse=None if lse is None else torch.empty_like(lse[r0:r1]))
        return _call(spec, sub, lambda: exact(sub), out_kind, bufs + [sub["lse"]], o_sf_scale=sf_scale)

    call = _call(spec, kw, exact, out_kind, buffers + [lse], batch=bsz, o_sf_scale=sf_scale)
    call.request = request
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens, "cum_kv": cum_kv}, spec["lens"], q_lens,
                                  False, [bmm1, bmm2])
    return call
