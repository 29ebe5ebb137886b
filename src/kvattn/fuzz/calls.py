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
    query = randn(bsz * nq, hq, d, dtype=qdt, device=device, generator=g)
    seq_lens = _seq_lens(c.seq_lens, spec["seq_lens_dtype"])
    tables = c.block_tables
    bmm1 = _scale(spec["bmm1_scale"], device, d ** -0.5)
    bmm2 = _scale(spec["bmm2_scale"], device, 1.0)
    sinks = randn(hq, generator=g, scale=2.0).to(device) if spec["sinks"] else None
    mask = None
    if spec["mask"]:
        words = 2 * ((nq + 31) // 32)
        mask = torch.randint(0, 2**16, (bsz, nq, words), generator=g, dtype=torch.int32).to(torch.uint16).to(device)
    out_dtype = {"none": None, "query": qdt, "float32": torch.float32, "fp8": FP8_DTYPE}[spec["out"]]
    out = None if out_dtype is None else torch.empty(bsz * nq, hq, d, dtype=out_dtype, device=device)
    lse = torch.empty(bsz * nq, hq, dtype=torch.float32, device=device) if spec["lse_given"] else None
    query, tables, seq_lens, out, lse = _views(spec, query=query, tables=tables, seq_lens=seq_lens, out=out, lse=lse)
    ws = _workspace(device)
    kw = dict(query=query, kv_cache=cache, workspace_buffer=ws, block_tables=tables, seq_lens=seq_lens,
              max_seq_len=_host_bound(spec), bmm1_scale=bmm1, bmm2_scale=bmm2, window_left=spec["window_left"],
              out=out, sinks=sinks, kv_layout=spec["layout"], enable_pdl=spec["enable_pdl"], q_len_per_req=nq,
              o_scale=spec["o_scale"], mask=mask, kv_cache_sf=sf, return_lse=spec["return_lse"], lse=lse)

    def exact(kw=kw):
        return _dense(dense.batch_decode, **{k: v for k, v in kw.items() if k not in ("return_lse",)},
                      return_lse=True)

    def request(b):
        sub = dict(kw)
        rows = slice(b * nq, (b + 1) * nq)
        sub.update(query=query[rows], block_tables=tables[b:b + 1], seq_lens=seq_lens[b:b + 1],
                   mask=None if mask is None else mask[b:b + 1],
                   out=None if out is None else torch.empty_like(out[rows]),
                   lse=None if lse is None else torch.empty_like(lse[rows]))
        return _call(spec, sub, lambda: exact(sub), out_kind, [sub["out"], sub["lse"]], stored, 1)

    out_kind = _kind(out_dtype or qdt)
    stored = spec["o_scale"] if out_dtype == FP8_DTYPE else 1.0
    call = _call(spec, kw, exact, out_kind, [out, lse], stored, bsz)
    call.request = request
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens}, spec["lens"], [nq] * bsz, True,
                                  [bmm1, bmm2])
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
    group = spec["group"]
    hq, bsz = hkv * group, spec["batch"]
    c = _pages(spec, device, fmt, num_kv_heads=hkv, head_dim=d, form="tuple")
    k_pages, v_pages = c.kv_cache  # [P, page, Hkv, D]
    layout = "HND" if spec["pool"] == "HND" else "NHD"
    if spec["pool"] == "flat":
        k_cache, v_cache = (x.contiguous().view(-1, d) for x in (k_pages, v_pages))
    elif spec["pool"] == "HND":
        k_cache, v_cache = (x.transpose(1, 2).contiguous() for x in (k_pages, v_pages))
    else:
        k_cache, v_cache = k_pages.contiguous(), v_pages.contiguous()
    if spec["view"] == "strided":
        k_cache, v_cache = widen(k_cache, g), widen(v_cache, g)
    q = randn(bsz, 1, hq, d, dtype=qdt, device=device, generator=g)
    seq_lens = _seq_lens(c.seq_lens, spec["seq_lens_dtype"]).view(bsz, 1)
    tables = c.block_tables
    out_dtype = FP8_DTYPE if spec["out"] == "fp8" else qdt
    output = torch.empty(bsz, 1, hq, d, dtype=out_dtype, device=device)
    q_scale = _scale(spec["q_scale"], device, 1.0)
    kv_scale = None
    if spec["kv_scale"]:
        kv_scale = torch.tensor([random.Random(spec["seed"]).uniform(0.5, 2.0)], dtype=torch.float32, device=device)
    sinks = randn(hkv, group, generator=g, scale=2.0).to(device) if spec["sinks"] else None
    lse = torch.empty(bsz, 1, hq, dtype=torch.float32, device=device) if spec["lse_given"] else None
    q, tables, seq_lens, output, lse = _views(spec, q=q, tables=tables, seq_lens=seq_lens, output=output, lse=lse)
    kw = dict(q=q, k_cache=k_cache, v_cache=v_cache, page_table=tables, seq_lens=seq_lens, output=output,
              workspace_buffer=_workspace(device), semaphores=torch.zeros(64, dtype=torch.uint32, device=device),
              num_kv_heads=hkv, page_size=page, sinks=sinks, q_scale=q_scale, kv_scale=kv_scale,
              sliding_win_size=spec["sliding_win_size"], sm_count=spec["sm_count"], kv_layout=layout,
              return_lse=spec["return_lse"], lse=lse)

    def exact(kw=kw):
        return _dense(dense.xqa, q=kw["q"], k_cache=kw["k_cache"], v_cache=kw["v_cache"], page_table=kw["page_table"],
                      seq_lens=kw["seq_lens"].to(torch.int32), num_kv_heads=hkv, page_size=page, sinks=kw["sinks"],
                      q_scale=kw["q_scale"], kv_scale=kw["kv_scale"], sliding_win_size=kw["sliding_win_size"],
                      kv_layout=layout, return_lse=True)

    def request(b):
        sub = dict(kw)
        sub.update(q=q[b:b + 1], page_table=tables[b:b + 1], seq_lens=seq_lens[b:b + 1],
                   output=torch.empty_like(output[b:b + 1]), lse=None if lse is None else torch.empty_like(lse[b:b + 1]))
        return _call(spec, sub, lambda: exact(sub), _kind(out_dtype), [sub["output"], sub["lse"]])

    call = _call(spec, kw, exact, _kind(out_dtype), [output, lse], batch=bsz)
    call.request = request
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens}, spec["lens"], [0] * bsz, True,
                                  [q_scale, kv_scale])
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
    hq, bsz = spec["heads"], spec["batch"]
    c = _pages(spec, device, spec["kv_dtype"], num_kv_heads=1, head_dim=576, form="shared")
    cache = c.kv_cache[:, 0, :, 0] if spec["cache_dims"] == 3 else c.kv_cache[:, :, :, 0]
    if spec["view"] == "strided":
        cache = widen(cache, g)
    query = randn(bsz, 1, hq, 576, dtype=dt, device=device, generator=g)
    seq_lens = _seq_lens(c.seq_lens, spec["seq_lens_dtype"])
    tables = c.block_tables
    bmm1 = _scale(spec["bmm1_scale"], device, 192 ** -0.5)
    bmm2 = _scale(spec["bmm2_scale"], device, 1.0)
    out = torch.empty(bsz, hq, 512, dtype=torch.bfloat16, device=device) if spec["out"] == "query" else None
    lse = torch.empty(bsz, hq, dtype=torch.float32, device=device) if spec["lse_given"] else None
    query, tables, seq_lens, out, lse = _views(spec, query=query, tables=tables, seq_lens=seq_lens, out=out, lse=lse)
    kw = dict(query=query, kv_cache=cache, workspace_buffer=_workspace(device), qk_nope_head_dim=128,
              kv_lora_rank=512, qk_rope_head_dim=64, block_tables=tables, seq_lens=seq_lens,
              max_seq_len=_host_bound(spec), out=out, bmm1_scale=bmm1, bmm2_scale=bmm2,
              sinks=None,  # the only legal value: MLA decode takes no sinks (docs/semantics.md)
              enable_pdl=spec["enable_pdl"], return_lse=spec["return_lse"], lse=lse)

    def exact(kw=kw):
        return _dense(dense.mla, query=kw["query"], kv_cache=kw["kv_cache"], block_tables=kw["block_tables"],
                      seq_lens=kw["seq_lens"], bmm1_scale=kw["bmm1_scale"], bmm2_scale=kw["bmm2_scale"],
                      return_lse=True)

    def request(b):
        sub = dict(kw)
        sub.update(query=query[b:b + 1], block_tables=tables[b:b + 1], seq_lens=seq_lens[b:b + 1],
                   out=None if out is None else torch.empty_like(out[b:b + 1]),
                   lse=None if lse is None else torch.empty_like(lse[b:b + 1]))
        return _call(spec, sub, lambda: exact(sub), "half", [sub["out"], sub["lse"]])

    call = _call(spec, kw, exact, "half", [out, lse], batch=bsz)
    call.request = request
    call.rewrite = _rewrite_paged({"tables": tables, "seq_lens": seq_lens}, spec["lens"], [0] * bsz, True, [bmm1, bmm2])
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
              kv_layout=spec["layout"], enable_pdl=spec["enable_pdl"], sinks=sinks, kv_block_scales=sf,
              skip_softmax_threshold_scale_factor=spec["skip_softmax"], uses_shared_paged_kv_idx=not split,
              return_lse=spec["return_lse"], lse=lse)

    def exact(kw=kw):
        return _dense(dense.context, query=kw["query"], kv_cache=kw["kv_cache"], block_tables=kw["block_tables"],
                      seq_lens=kw["seq_lens"], cum_seq_lens_q=kw["cum_seq_lens_q"], bmm1_scale=kw["bmm1_scale"],
                      bmm2_scale=kw["bmm2_scale"], window_left=kw["window_left"], sinks=kw["sinks"],
                      kv_layout=kw["kv_layout"], kv_block_scales=kw["kv_block_scales"],
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
    if call.function == "prefill":
        cum = call.kwargs["cum_seq_lens_q"].tolist()
        return slice(cum[b], cum[b + 1])
    n = spec_rows.get(call.function, 1)
    return slice(b * n, (b + 1) * n)
