"""Random inputs for tests, the ``kvattn check`` command and the benchmarks.

Every builder draws fresh random values (never zeros), scatters each request's pages over a random
permutation of the pool, and can fill every cache slot no request uses with NaN, so that a kernel
whose masked loads leak shows it at once.

Example
-------
>>> import torch
>>> from kvattn.testing import make_paged_kv
>>> case = make_paged_kv([5, 40], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16)
>>> case.block_tables.shape, case.kv_cache.shape
(torch.Size([2, 4]), torch.Size([5, 2, 16, 2, 64]))
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._formats_table import BY_NAME, NAMES
from .formats import FP8_DTYPE


def seeded(seed: int, device="cpu") -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def randn(*shape, dtype=torch.float32, device="cpu", generator=None, scale: float = 1.0) -> torch.Tensor:
    """Normal values drawn on the CPU (reproducible across devices), then moved."""
    x = torch.randn(*shape, generator=generator, dtype=torch.float32, device="cpu") * scale
    return x.to(device=device, dtype=dtype)


@dataclass
class PagedCase:
    """A paged cache and its tables, plus the float32 values each request should see.

    ``kv_cache`` is in the form asked for: a 5-D tensor (``"stacked"``: a size-2 plane, ``"shared"``:
    a size-1 plane, K = V) or a ``(K, V)`` tuple (``"tuple"``), in ``layout``. ``k_tokens[b]`` /
    ``v_tokens[b]`` are float32 ``[L_b, Hkv, D]`` of the dequantised values (raw fp8 values).
    """

    kv_cache: object
    kv_cache_sf: object
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    k_tokens: list = field(default_factory=list)
    v_tokens: list = field(default_factory=list)
    page_size: int = 16
    layout: str = "NHD"

    @property
    def max_seq_len(self) -> int:
        return max([int(t.shape[0]) for t in self.k_tokens] + [0])


def make_paged_kv(
    seq_lens,
    *,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype = torch.bfloat16,
    kv_format: str | None = None,
    layout: str = "NHD",
    form: str = "stacked",
    device="cpu",
    seed: int = 0,
    nan_fill: bool = True,
    extra_pages: int = 1,
    pages_per_seq: int | None = None,
    split_tables: bool = False,
    scale: float = 1.0,
    tokens: bool = True,
    spare_pages: int = 0,
) -> PagedCase:
    """Build a random paged cache holding ``seq_lens[b]`` tokens for request ``b``.

    Parameters
    ----------
    seq_lens : list of int
    dtype : float16 / bfloat16, the element type when ``kv_format`` is None
    kv_format : None or one of ``"float16"``, ``"bfloat16"``, ``"fp8"``, ``"nvfp4"``
    layout : ``"NHD"`` or ``"HND"``
    form : ``"stacked"`` (``[P, 2, ...]``), ``"shared"`` (``[P, 1, ...]``, K = V) or ``"tuple"``
    nan_fill : fill every slot no request uses with NaN (NVFP4: codes stay finite; its scales get NaN)
    extra_pages : unused pages added to the pool
    pages_per_seq : table width (default: enough for the longest request, plus one)
    split_tables : ``block_tables`` ``[B, 2, P]`` with different K and V page ids
    scale : standard deviation of the values
    tokens : also gather each request's values into ``k_tokens`` / ``v_tokens`` (False: empty
        lists, for callers with an oracle of their own, such as ``kvattn fuzz``)
    spare_pages : pages after the pool's own that no table entry names, poisoned as unused slots
        are (NaN; NVFP4: NaN block scales) and drawn from nothing: a pool of one size for calls
        whose lengths differ (``kvattn fuzz``'s classes), at no cost in random values
    """
    kv_format = kv_format or {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    if kv_format not in NAMES:
        raise ValueError(f"kv_format: expected one of {NAMES}, got {kv_format!r}")
    g = seeded(seed)
    lens = [int(x) for x in seq_lens]
    batch = len(lens)
    need = [(n + page_size - 1) // page_size for n in lens]
    width = pages_per_seq if pages_per_seq is not None else max(need + [0]) + 1
    planes = 1 if form == "shared" else 2
    num_tables = 2 if split_tables else 1
    total = sum(need) * num_tables + extra_pages
    # (the draws and the tables' bookkeeping on the CPU even under a default-device context: the
    # generator is a CPU one, and the values are the same on every device)
    perm = torch.randperm(total, generator=g, device="cpu")
    # Tables: each request's pages are a slice of the permutation; unused entries get wild ids that
    # must never be read.
    tables = torch.randint(-(2**30), 2**30, (batch, num_tables, width), generator=g, dtype=torch.int64, device="cpu")
    pos = 0
    for t in range(num_tables):
        for b in range(batch):
            tables[b, t, : need[b]] = perm[pos : pos + need[b]]
            pos += need[b]
    tables = tables.to(torch.int32)

    # Dense float32 values in NHD page order [P, planes, page, H, D]; NaN where unused. Drawn on
    # the CPU (the same values on every device), quantised and filled on ``device``: the pool of a
    # large batch of short requests in large pages is mostly unused slots, and their quantisation
    # on the CPU took seconds a call.
    vals = randn(total, planes, page_size, num_kv_heads, head_dim, device=device, generator=g, scale=scale)
    used = torch.zeros(total, planes, page_size, dtype=torch.bool, device="cpu")
    for b in range(batch):
        for which, plane in ((0, 0), (num_tables - 1, planes - 1)):  # K's and V's (table, plane)
            t = torch.arange(lens[b], device="cpu")
            used[tables[b, which].to(torch.int64)[t // page_size], plane, t % page_size] = True
    used = used.to(device)
    fmt = BY_NAME[kv_format]
    try:
        data, sf = fmt.quantize(vals)
    except torch.OutOfMemoryError:  # (NVFP4's encoding holds eight float32 copies of the pool)
        torch.cuda.empty_cache()
        data, sf = (None if x is None else x.to(device) for x in fmt.quantize(vals.cpu()))
    vals = fmt.dequantize(data, sf) if tokens else None
    if sf is not None:  # block scales (e4m3): a NaN scale poisons its whole block
        if nan_fill:
            sf = sf.view(torch.uint8).clone()
            sf.masked_fill_(~used[..., None, None], 0x7F)  # e4m3fn NaN
            sf = sf.view(FP8_DTYPE)
    else:
        if nan_fill:
            bits = data.view(torch.uint8 if data.element_size() == 1 else torch.int16).clone()
            nan = data.new_full((), float("nan")).view(bits.dtype)
            bits.masked_fill_(~used[..., None, None], nan)
            data = bits.view(data.dtype)

    k_tokens, v_tokens = [], []
    for b in range(batch if tokens else 0):
        for which, plane, dst in ((0, 0, k_tokens), (num_tables - 1, planes - 1, v_tokens)):
            tab = tables[b, which].to(torch.int64)
            t = torch.arange(lens[b], device="cpu")
            dst.append(vals[tab[t // page_size], plane, t % page_size].to(device))

    def to_layout(x):  # [P, planes, page, H, D] -> the asked layout, moved to device
        if layout == "HND":
            x = x.transpose(2, 3).contiguous()
        return x.to(device)

    if spare_pages:
        data, sf = _spare(data, sf, spare_pages)
    data = to_layout(data)
    sf = to_layout(sf) if sf is not None else None
    if form == "tuple":
        kv_cache = (data[:, 0], data[:, 1])
        kv_sf = (sf[:, 0], sf[:, 1]) if sf is not None else None
    else:
        kv_cache, kv_sf = data, sf
    block_tables = (tables if split_tables else tables[:, 0]).contiguous().to(device)
    return PagedCase(
        kv_cache, kv_sf, block_tables, torch.tensor(lens, dtype=torch.int32, device=device),
        k_tokens, v_tokens, page_size, layout,
    )


def _spare(data: torch.Tensor, sf, pages: int) -> tuple:
    """``data`` (and block scales ``sf``) ``[P, ...]`` with ``pages`` more pages at the end, every
    slot poisoned as make_paged_kv poisons an unused one."""
    more = data.new_empty((pages, *data.shape[1:]))
    if sf is not None:  # NVFP4: finite codes (6.0), NaN scales
        more.view(torch.uint8).fill_(0x77)
        more_sf = sf.new_empty((pages, *sf.shape[1:]))
        more_sf.view(torch.uint8).fill_(0x7F)
        return torch.cat([data, more]), torch.cat([sf, more_sf])
    bits = torch.uint8 if data.element_size() == 1 else torch.int16
    more.view(bits).fill_(int(data.new_full((), float("nan")).view(bits)))
    return torch.cat([data, more]), sf


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN (or 0xFF bytes for integer/fp8 storage) before a call."""
    if t.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return t.fill_(float("nan"))
    if t.element_size() == 1:
        t.view(torch.uint8).fill_(0xFF)  # fill through a byte view, but return the buffer itself
        return t
    return t.fill_(-1)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere in ``out`` gives inf."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    den = r.norm().item()
    return (o - r).norm().item() / max(den, 1e-30)
