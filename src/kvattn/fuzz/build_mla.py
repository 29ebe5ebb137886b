"""The call builder of MLA decode (:func:`kvattn.xqa_batch_decode_with_kv_cache_mla`)."""

from __future__ import annotations

import torch

from .. import dense
from ..testing import randn, seeded
from .call import Call
from .build_common import (
    DTYPES, _scale, widen, pad_batch, _views, _pages, _seq_lens, _host_bound, _rewrite_paged, _call,
    _workspace, own, float64,
)


def _mla(spec, device) -> Call:
    g = seeded(spec["seed"] + 1)
    dt = DTYPES[spec["dtype"]]
    hq, bsz, nq = spec["heads"], spec["batch"], spec["q_len"]
    c = _pages(spec, device, spec["kv_dtype"], num_kv_heads=1, head_dim=576, form="shared")
    cache = c.kv_cache[:, 0, :, 0] if spec["cache_dims"] == 3 else c.kv_cache[:, :, :, 0]
    if spec["view"] == "strided":
        cache = widen(cache, g)
    query = randn(bsz, nq, hq, 576, dtype=dt, device=device, generator=g)
    seq_lens = _seq_lens(c.seq_lens, spec["seq_lens_dtype"])
    tables = c.block_tables
    bmm1 = _scale(spec["bmm1_scale"], device, 192 ** -0.5)
    bmm2 = _scale(spec["bmm2_scale"], device, 1.0)
    tokens = (bsz, hq) if nq == 1 else (bsz, nq, hq)  # the output's shape without its last dim
    out = torch.empty(*tokens, 512, dtype=torch.bfloat16, device=device) if spec["out"] == "query" else None
    lse = torch.empty(tokens, dtype=torch.float32, device=device) if spec["lse_given"] else None
    if nq == 1:
        query, tables, seq_lens, out, lse = _views(spec, query=query, tables=tables, seq_lens=seq_lens, out=out,
                                                   lse=lse)
    else:
        # Several tokens: out and lse must keep their token and head dims foldable into one.
        query, tables, seq_lens = _views(spec, query=query, tables=tables, seq_lens=seq_lens)
        if spec["arg_views"]:
            out, lse = pad_batch(out), pad_batch(lse)
    kw = dict(query=query, kv_cache=cache, workspace_buffer=_workspace(device), qk_nope_head_dim=128,
              kv_lora_rank=512, qk_rope_head_dim=64, block_tables=tables, seq_lens=seq_lens,
              max_seq_len=_host_bound(spec), out=out, bmm1_scale=bmm1, bmm2_scale=bmm2,
              sinks=None,  # the only legal value: MLA decode takes no sinks (docs/semantics.md)
              enable_pdl=spec["enable_pdl"], return_lse=spec["return_lse"], lse=lse)

    def exact(kw=kw):
        if nq == 1:
            return float64(dense.mla, query=kw["query"], kv_cache=kw["kv_cache"], block_tables=kw["block_tables"],
                          seq_lens=kw["seq_lens"], bmm1_scale=kw["bmm1_scale"], bmm2_scale=kw["bmm2_scale"],
                          return_lse=True)
        # Multi-token prediction: token r sits at L - Q + r and sees keys 0 .. L - Q + r, the
        # one-token formulation over that many keys (docs/semantics.md, section 4).
        lens = kw["seq_lens"].cpu().to(torch.int64)
        outs, lses = [], []
        for r in range(nq):
            seen = torch.where(lens > 0, (lens - nq + 1 + r).clamp_min(0), lens).to(torch.int32)
            o, l_ = float64(dense.mla, query=kw["query"][:, r:r + 1], kv_cache=kw["kv_cache"],
                           block_tables=kw["block_tables"], seq_lens=seen, bmm1_scale=kw["bmm1_scale"],
                           bmm2_scale=kw["bmm2_scale"], return_lse=True)
            outs.append(o)
            lses.append(l_)
        return torch.stack(outs, 1), torch.stack(lses, 1)

    def request(b):
        sub = dict(kw)
        sub.update(query=own(query[b:b + 1]), block_tables=own(tables[b:b + 1]), seq_lens=own(seq_lens[b:b + 1]),
                   out=None if out is None else torch.empty_like(out[b:b + 1]),
                   lse=None if lse is None else torch.empty_like(lse[b:b + 1]))
        return _call(spec, sub, lambda: exact(sub), "half", [sub["out"], sub["lse"]])

    call = _call(spec, kw, exact, "half", [out, lse], batch=bsz)
    call.request = request
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens}, spec["lens"], [nq] * bsz, True, [bmm1, bmm2])
    return call
