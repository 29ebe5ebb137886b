"""What the call builders share: drawn scales, padded / widened / spread views of a tensor, paged
caches and lengths from a spec, the float64 formulation (on the call's GPU where it has one),
lengths and tables rewritten in place (CUDA-graph mode), the drafts' offsets and masks, the
:class:`~kvattn.fuzz.call.Call` and the shared workspace."""

from __future__ import annotations

import random

import torch

from .. import dense
from ..formats import FP8_DTYPE
from ..testing import make_paged_kv
from .call import Call


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8": FP8_DTYPE, "float32": torch.float32}


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
    most = (_longest(spec) + page - 1) // page
    width = max(most + spec["extra_pages"], 1)
    spare = 0
    if spec.get("max_len") is not None:
        # A pool of one size for the whole class, whatever the lengths: its page count is a
        # kernel argument (and a plan fact), so it must not follow the lengths.
        spare = (len(lens) * most - sum(need)) * (2 if split_tables else 1)
    return make_paged_kv(lens, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page, dtype=dtype,
                         kv_format=kv_format, layout=layout, form=form, device=device, seed=spec["seed"],
                         pages_per_seq=width, split_tables=split_tables, extra_pages=1 + spec["extra_pages"],
                         tokens=False, spare_pages=spare)


def _seq_lens(lens: torch.Tensor, name: str) -> torch.Tensor:
    return lens.to(torch.uint32) if name == "uint32" else lens.to(torch.int32)


def _longest(spec) -> int:
    """The class's bound on the lengths (``max_len``; a spec edited by hand may exceed it), or the
    longest length in a spec without one."""
    bound = spec.get("max_len")
    return max(spec["lens"] + [0 if bound is None else bound])


def _host_bound(spec) -> int:
    """A host bound at or above every length, inside the table's capacity."""
    return _longest(spec) + spec["extra_pages"] * spec["page"] // 2


def own(t):
    """A copy of ``t`` (a request's slice of a batch's tensor) in storage of its own, with the
    same strides: its base 16-byte aligned whichever request it is. Triton specialises a kernel
    on each pointer's 16-byte alignment, so slices at other offsets would compile other kernels
    from one call to the next (docs/fuzzing.md, "Classes and mutation")."""
    if t is None:
        return None
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    copy.copy_(t)
    return copy


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
    return float64(dense.batch_decode, query=query, block_tables=block_tables, seq_lens=seq_lens,
                  q_len_per_req=nq, mask=mask, q_cu_seq_lens=cu, return_lse=True, **common)


def _tensors_to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_tensors_to(y, device) for y in x)
    return x


def _device_of(kwargs: dict):
    for x in kwargs.values():
        for t in x if isinstance(x, (tuple, list)) else (x,):
            if isinstance(t, torch.Tensor):
                return t.device
    return None


def float64(fn, **kwargs):
    """``fn`` (a :mod:`kvattn.dense` formulation, float64) on the call's tensors, its results on the
    CPU. On a GPU it runs there, every tensor argument moved to the call's device and the tensors
    it makes on it (cuBLAS's float64 products are IEEE double arithmetic, as the CPU's): on the
    host, a large batch's oracle took most of a warm call's time, with a dozen workers sharing the
    cores. One too large for the GPU's free memory runs on the CPU."""
    device = _device_of(kwargs)
    if device is None or device.type != "cuda":
        return dense.on_cpu(fn, **kwargs)
    try:
        with torch.device(device):
            return dense._to_cpu(fn(**{k: _tensors_to(v, device) for k, v in kwargs.items()}))
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return dense.on_cpu(fn, **kwargs)


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
