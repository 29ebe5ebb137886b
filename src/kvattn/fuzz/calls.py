"""From a spec (:mod:`kvattn.fuzz.draws`) to tensors and a call of the public function.

:func:`build` makes every tensor from the spec's seed (random values, never zeros; pages scattered
over a random permutation of the pool; NaN in every cache slot no request uses; NaN-poisoned output
buffers), and returns a :class:`Call`: ``run()`` calls the public function, ``expected()`` the
float64 formulation (:mod:`kvattn.dense`) on the tensors as they are now (so a graph replay after
lengths and tables were rewritten in place is checked against the new values), ``request(b)`` the
same call for request ``b`` alone (batch-invariant mode) and ``rewrite(rng)`` new lengths, tables
and scale values written into the call's own tensors (CUDA-graph mode).

The public functions are looked up by module attribute at each call, so a test can monkeypatch one.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .. import dense
from ..formats import FP8_DTYPE, FP4Tensor, dequantize_nvfp4_output
from ..testing import make_paged_kv, poison_, randn, seeded

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8": FP8_DTYPE, "float32": torch.float32}
PUBLIC = {
    "batch_decode": ("kvattn.decode", "xqa_batch_decode_with_kv_cache"),
    "xqa": ("kvattn.xqa", "xqa"),
    "single_decode": ("kvattn.decode", "single_decode_with_kv_cache"),
    "mla": ("kvattn.mla", "xqa_batch_decode_with_kv_cache_mla"),
    "prefill": ("kvattn.prefill", "trtllm_batch_context_with_kv_cache"),
}


def public(function: str) -> Callable:
    module, name = PUBLIC[function]
    return getattr(importlib.import_module(module), name)


@dataclass
class Call:
    """One materialised call. ``out_kind`` picks the tolerance ("half", "float32", "fp8",
    "nvfp4"); ``stored_scale`` divides the exact output where the function stores it divided
    (an fp8 batch-decode output, by ``o_scale``)."""

    function: str
    kwargs: dict
    exact: Callable[[], tuple]  # () -> (float64 output, float64 LSE or None), on the CPU
    out_kind: str
    buffers: list = field(default_factory=list)  # output / LSE buffers the call writes, poisoned before each run
    stored_scale: float = 1.0
    o_sf_scale: float = 1.0
    return_lse: bool = False
    request: Optional[Callable[[int], "Call"]] = None
    rewrite: Optional[Callable[[random.Random], None]] = None
    batch: int = 1

    def poison(self) -> None:
        for t in self.buffers:
            poison_(t)

    def run(self):
        """Poison the output buffers, call the public function, return ``(out, lse or None)`` as
        float32 tensors on the call's device (an NVFP4 output dequantised)."""
        self.poison()
        return self.outputs(public(self.function)(**self.kwargs))

    def outputs(self, result):
        if self.function == "xqa":
            out = self.kwargs["output"]
            lse = result if self.return_lse else None
        elif self.return_lse:
            out, lse = result
        else:
            out, lse = result, None
        if isinstance(out, FP4Tensor):
            out = dequantize_nvfp4_output(out, self.o_sf_scale)
        return out, lse

    def expected(self):
        return self.exact()


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _scale(value, device, default: float):
    """A drawn scale: ``{"value", "tensor"}`` -> float or one-element float32 device tensor;
    ``"plain"`` (the shrinker's "off") -> the default float."""
    if value == "plain" or value is None:
        return default
    if value["tensor"]:
        return torch.tensor([value["value"]], dtype=torch.float32, device=device)
    return float(value["value"])


def _num(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def _garbage_like(buf: torch.Tensor, g) -> None:
    """What a wider buffer holds outside the view: NaN (floats), NaN bit patterns (fp8), random
    codes (NVFP4 bytes)."""
    if buf.dtype in (torch.float16, torch.bfloat16, torch.float32):
        buf.fill_(float("nan"))
    elif buf.dtype == FP8_DTYPE:
        buf.view(torch.uint8).fill_(0x7F)
    else:
        buf.copy_(torch.randint(0, 256, buf.shape, generator=g, dtype=torch.uint8).to(buf.device))


def widen(t, g):
    """The same values as a slice of a wider buffer (dim -2 one longer): only the last dim is
    contiguous, which every function accepts. Tuples are widened element-wise."""
    if t is None:
        return None
    if isinstance(t, (tuple, list)):
        return type(t)(widen(x, g) for x in t)
    shape = list(t.shape)
    shape[-2] += 1
    buf = torch.empty(shape, dtype=t.dtype, device=t.device)
    _garbage_like(buf, g)
    view = buf[..., : t.shape[-2], :]
    view.copy_(t)
    return view


def pad_last(t):
    """``t`` as a view of a buffer with a longer last dim: its last dim stays contiguous, every
    other stride grows (what the query, ``out`` and ``lse`` allow)."""
    if t is None or not isinstance(t, torch.Tensor):
        return t
    buf = torch.empty(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype, device=t.device)
    view = buf[..., : t.shape[-1]]
    view.copy_(t)
    return view


def pad_batch(t):
    """``t`` as a view of a buffer with a longer row a leading index: only dim 0's stride grows,
    so the other dims still fold into one (what a 4-D MLA ``out`` / ``lse`` allows)."""
    if t is None:
        return t
    n = t[0].numel() if t.shape[0] else 0
    buf = torch.empty(t.shape[0], n + 8, dtype=t.dtype, device=t.device)
    view = buf[:, :n].view(t.shape)
    view.copy_(t)
    return view


def spread(t):
    """``t`` as every other element of a buffer twice as long in its last dim (page tables and
    lengths take any strides)."""
    buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=torch.int64, device=t.device)
    buf[..., ::2] = t.to(torch.int64)
    return buf.to(t.dtype)[..., ::2]


def _views(spec, **tensors):
    """The tensors as views (``arg_views``): int tensors spread, float ones padded."""
    if not spec.get("arg_views"):
        return tensors.values()
    return [None if t is None else spread(t) if not t.is_floating_point() else pad_last(t)
            for t in tensors.values()]


def _pages(spec, device, kv_format, *, num_kv_heads, head_dim, layout="NHD", form="stacked", split_tables=False,
           dtype=torch.float16):
    lens, page = spec["lens"], spec["page"]
    need = [(n + page - 1) // page for n in lens]
    width = max(max(need + [0]) + spec["extra_pages"], 1)
    return make_paged_kv(lens, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page, dtype=dtype,
                         kv_format=kv_format, layout=layout, form=form, device=device, seed=spec["seed"],
                         pages_per_seq=width, split_tables=split_tables, extra_pages=1 + spec["extra_pages"],
                         tokens=False)


def _seq_lens(lens: torch.Tensor, name: str) -> torch.Tensor:
    return lens.to(torch.uint32) if name == "uint32" else lens.to(torch.int32)


def _host_bound(spec) -> int:
    """A host bound at or above every length, inside the table's capacity."""
    return max(spec["lens"] + [0]) + spec["extra_pages"] * spec["page"] // 2


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (tuple, list)):
        return type(x)(_cpu(y) for y in x)
    return x


def _dense(fn, **kwargs):
    return fn(**{k: _cpu(v) for k, v in kwargs.items()})


def _new_lengths(rng, lens: list, minimum: list) -> list:
    return [rng.randint(min(lo, n), n) for n, lo in zip(lens, minimum)]


def _rewrite_paged(call_tensors: dict, lens: list, minimum: list, perm_ok: bool, scales: list):
    """The CUDA-graph mode's step: a permutation of the requests' table rows (with their
    lengths), each length cut to a random shorter one, and new values in the device scales, all
    written in place."""

    def rewrite(rng: random.Random) -> None:
        n = len(lens)
        order = list(range(n))
        if perm_ok:
            rng.shuffle(order)
        tables = call_tensors["tables"]
        tables.copy_(tables[order].clone())
        new = _new_lengths(rng, [lens[i] for i in order], [minimum[i] for i in order])
        seq = call_tensors["seq_lens"]
        seq.copy_(torch.tensor(new, dtype=torch.int64).view(seq.shape).to(seq.dtype))
        if "cum_kv" in call_tensors:
            cum = torch.tensor([0] + new, dtype=torch.int64).cumsum(0)
            call_tensors["cum_kv"].copy_(cum.to(torch.int32))
        for s in scales:
            if isinstance(s, torch.Tensor):
                s.mul_(rng.choice([0.5, 0.75, 1.5]))

    return rewrite


def _cu(drafts, device, dtype="int32"):
    """``q_cu_seq_lens``: int32 or uint32 ``[B + 1]`` offsets of the packed draft rows (None: not
    ragged)."""
    if drafts is None:
        return None
    cu = torch.tensor([0] + drafts, dtype=torch.int64).cumsum(0)
    return _seq_lens(cu, dtype).to(device)


def _spec_mask(g, rows: tuple, nq: int, device):
    """Random uint16 draft bits ``[*rows, 2 * ceil(Q / 32)]``, any pattern (docs/semantics.md)."""
    words = 2 * ((nq + 31) // 32)
    return torch.randint(0, 2**16, (*rows, words), generator=g, dtype=torch.int32).to(torch.uint16).to(device)


def _decode_exact(query, drafts, nq, mask, block_tables, seq_lens, **common):
    """Float64 ``(out [rows, Hq, D], lse [rows, Hq])`` of batch decode by :func:`kvattn.dense.batch_decode`
    (ragged drafts: ``drafts`` a list, passed as the offsets ``q_cu_seq_lens``)."""
    cu = None if drafts is None else torch.tensor([0] + drafts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return _dense(dense.batch_decode, query=query, block_tables=block_tables, seq_lens=seq_lens,
                  q_len_per_req=nq, mask=mask, q_cu_seq_lens=cu, return_lse=True, **common)


# ---------------------------------------------------------------------------------------------
# 1. batch decode
# ---------------------------------------------------------------------------------------------
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
        sub.update(query=query[r], block_tables=tables[b:b + 1], seq_lens=seq_lens[b:b + 1], mask=sub_mask,
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


def _kind(dtype) -> str:
    return {torch.float32: "float32", FP8_DTYPE: "fp8"}.get(dtype, "half")


def _call(spec, kw, exact, out_kind, buffers, stored=1.0, batch=1, o_sf_scale=1.0) -> Call:
    return Call(spec["function"], kw, exact, out_kind, [b for b in buffers if b is not None], stored, o_sf_scale,
                bool(spec.get("return_lse")), batch=batch)


_WORKSPACES: dict = {}


def _workspace(device) -> torch.Tensor:
    """One zeroed workspace a device, shared by the calls (each call leaves its counters at zero),
    large enough for the batch-invariant mode's partials."""
    key = str(device)
    if key not in _WORKSPACES:
        size = (256 << 20) if torch.device(device).type == "cuda" else (16 << 20)
        _WORKSPACES[key] = torch.zeros(size, dtype=torch.uint8, device=device)
    return _WORKSPACES[key]


# ---------------------------------------------------------------------------------------------
# 2. xqa
# ---------------------------------------------------------------------------------------------
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
            return _dense(dense.xqa, q=kw["q"], k_cache=kw["k_cache"], v_cache=kw["v_cache"],
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
        sub.update(q=q[r], page_table=tables[b:b + 1], seq_lens=seq_lens[b:b + 1], mask=sub_mask,
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


# ---------------------------------------------------------------------------------------------
# 3. single decode
# ---------------------------------------------------------------------------------------------
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
        return _dense(dense.single_decode, **args, return_lse=True)

    def rewrite(rng):  # no lengths to change: new query values, in place
        q.copy_(torch.randn(q.shape, generator=seeded(rng.randrange(2**31))).to(q.dtype))

    call = _call(spec, kw, exact, _kind(out_dtype or qdt), [out, lse])
    call.rewrite = rewrite
    return call


# ---------------------------------------------------------------------------------------------
# 4. MLA decode
# ---------------------------------------------------------------------------------------------
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
            return _dense(dense.mla, query=kw["query"], kv_cache=kw["kv_cache"], block_tables=kw["block_tables"],
                          seq_lens=kw["seq_lens"], bmm1_scale=kw["bmm1_scale"], bmm2_scale=kw["bmm2_scale"],
                          return_lse=True)
        # Multi-token prediction: token r sits at L - Q + r and sees keys 0 .. L - Q + r, the
        # one-token formulation over that many keys (docs/semantics.md, section 4).
        lens = kw["seq_lens"].cpu().to(torch.int64)
        outs, lses = [], []
        for r in range(nq):
            seen = torch.where(lens > 0, (lens - nq + 1 + r).clamp_min(0), lens).to(torch.int32)
            o, l_ = _dense(dense.mla, query=kw["query"][:, r:r + 1], kv_cache=kw["kv_cache"],
                           block_tables=kw["block_tables"], seq_lens=seen, bmm1_scale=kw["bmm1_scale"],
                           bmm2_scale=kw["bmm2_scale"], return_lse=True)
            outs.append(o)
            lses.append(l_)
        return torch.stack(outs, 1), torch.stack(lses, 1)

    def request(b):
        sub = dict(kw)
        sub.update(query=query[b:b + 1], block_tables=tables[b:b + 1], seq_lens=seq_lens[b:b + 1],
                   out=None if out is None else torch.empty_like(out[b:b + 1]),
                   lse=None if lse is None else torch.empty_like(lse[b:b + 1]))
        return _call(spec, sub, lambda: exact(sub), "half", [sub["out"], sub["lse"]])

    call = _call(spec, kw, exact, "half", [out, lse], batch=bsz)
    call.request = request
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens}, spec["lens"], [nq] * bsz, True, [bmm1, bmm2])
    return call


# ---------------------------------------------------------------------------------------------
# 5. prefill
# ---------------------------------------------------------------------------------------------
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
        if not kw["causal"]:
            # Bidirectional: every row sees all L keys, as the last row of a causal request does;
            # each row runs as a one-row request over its request's keys (no window, no
            # skip-softmax: draws.normalise).
            cum_cpu = cum_.cpu().to(torch.int64)
            owner = torch.repeat_interleave(torch.arange(cum_cpu.numel() - 1), cum_cpu[1:] - cum_cpu[:-1])
            tables_, seq_ = tables_.cpu()[owner], seq_.cpu().to(torch.int64)[owner]
            cum_ = torch.arange(owner.numel() + 1, dtype=torch.int32)
        blocks = kw["kv_cache_sf"] if kw["kv_cache_sf"] is not None else kw["kv_block_scales"]
        return _dense(dense.context, query=kw["query"], kv_cache=kw["kv_cache"], block_tables=tables_,
                      seq_lens=seq_, cum_seq_lens_q=cum_, bmm1_scale=kw["bmm1_scale"],
                      bmm2_scale=kw["bmm2_scale"], window_left=kw["window_left"], sinks=kw["sinks"],
                      kv_layout=kw["kv_layout"], kv_block_scales=blocks,
                      uses_shared_paged_kv_idx=kw["uses_shared_paged_kv_idx"],
                      skip_softmax_threshold_scale_factor=kw["skip_softmax_threshold_scale_factor"], return_lse=True)

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
        sub.update(query=query[r0:r1], block_tables=tables[b:b + 1], seq_lens=seq_lens[b:b + 1], batch_size=1,
                   cum_seq_lens_q=torch.tensor([0, r1 - r0], dtype=torch.int32, device=device),
                   cum_seq_lens_kv=torch.tensor([0, spec["lens"][b]], dtype=torch.int32, device=device),
                   out=sub_out, lse=None if lse is None else torch.empty_like(lse[r0:r1]))
        return _call(spec, sub, lambda: exact(sub), out_kind, bufs + [sub["lse"]], o_sf_scale=sf_scale)

    call = _call(spec, kw, exact, out_kind, buffers + [lse], batch=bsz, o_sf_scale=sf_scale)
    call.request = request
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens, "cum_kv": cum_kv}, spec["lens"], q_lens,
                                  False, [bmm1, bmm2])
    return call


BUILDERS = {"batch_decode": _batch_decode, "xqa": _xqa, "single_decode": _single_decode, "mla": _mla,
            "prefill": _prefill}


def build(spec: dict, device="cpu") -> Call:
    """The call a spec describes, its tensors on ``device``. Options the spec lacks take their
    "off" values, so a reproducer written before an argument was registered still runs."""
    from .draws import OPTIONS

    spec = {**OPTIONS[spec["function"]], **spec}
    return BUILDERS[spec["function"]](spec, torch.device(device))


def request_rows(call: Call, b: int) -> slice:
    """The rows of ``call``'s output (and LSE) that belong to request ``b``."""
    spec_rows = {"batch_decode": call.kwargs.get("q_len_per_req") or 1}
    packed = call.kwargs.get("cum_seq_lens_q") if call.function == "prefill" else call.kwargs.get("q_cu_seq_lens")
    if packed is not None:
        cum = packed.tolist()
        return slice(cum[b], cum[b + 1])
    n = spec_rows.get(call.function, 1)
    return slice(b * n, (b + 1) * n)
