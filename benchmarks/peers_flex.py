"""FlexAttention peers (``torch.nn.attention.flex_attention`` under ``torch.compile``).

Paged formulation (``flex-paged``), the one torch's experimental ``PagedAttention`` uses: the pool
itself is the K/V tensor (batch 1, broadcast over the query batch), and a ``BlockMask`` built with
``BlockMask.from_kv_blocks`` whose KV block size is the page size lists, for every query block, the
*physical* pages of its request (the page table). Pages wholly inside the causal window are "full"
blocks (no mask call); the rest get a ``mask_mod`` that maps a physical KV index back to its logical
position through an inverse page table and applies ``key <= query position``.

- NHD pools ``[P, page, Hkv, D]`` are viewed as ``[1, Hkv, P * page, D]`` (strided, no copy).
- HND pools ``[P, Hkv, page, D]`` are one contiguous ``[1, 1, P * Hkv * page, D]`` sequence; each
  (request, KV head) pair becomes one flex batch entry whose block indices are
  ``page * Hkv + head``.
- MLA pools ``[P, page, 576]`` are ``[1, 1, P * page, 576]``, values its first 512 columns.

If the paged form fails to compile or run, flex runs on the gathered K/V instead (``flex-gathered``,
timed with and without the gather). Single decode has no pages: flex runs on the contiguous K/V.
Compilation happens on the first call (kept out of the timing, its duration recorded).

A mixed prefill batch (per-request query lengths, ``AttnSpec.q_lens``) has no flex formulation
here: both block masks above take one query length for the batch. Its record says so.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch

from kvattn.benchmarking.availability import NotAvailable
from kvattn.benchmarking.measure import Variant

from .peers_sdpa import dense_kv, prep_label
from .problems import AttnSpec

Q_BLOCK = 128
_compiled = None


def compiled_flex():
    """One ``torch.compile(flex_attention, dynamic=False)``: a static kernel per shape signature."""
    global _compiled
    if _compiled is None:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        cfg = torch._dynamo.config
        # Every shape is a new signature; without this dynamo stops compiling after 8 and flex
        # silently falls back to its (slow, memory-hungry) eager path.
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(int(getattr(cfg, name)), 4096))
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def _from_kv_blocks(num, idx, full_num, full_idx, block_size, mask_mod, seq_lengths):
    from torch.nn.attention.flex_attention import BlockMask

    args = dict(full_kv_num_blocks=full_num, full_kv_indices=full_idx, BLOCK_SIZE=block_size,
                mask_mod=mask_mod, seq_lengths=seq_lengths)
    try:  # forward only: skip building the transposed (backward) indices when this torch allows it
        return BlockMask.from_kv_blocks(num, idx, compute_q_blocks=False, **args)
    except TypeError:
        return BlockMask.from_kv_blocks(num, idx, **args)


def block_mask(lens: list[int], q_len: int, block: int, tables: torch.Tensor, fold: int, mask_mod, kv_total: int):
    """Per (request x fold) entry and query block: full blocks, then the partial ones needing ``mask_mod``.

    ``tables [B, W]`` lists each request's KV blocks in logical order (physical ids); with ``fold``
    > 1 entry ``b * fold + h`` uses ids ``table * fold + h``.
    """
    dev = tables.device
    b, w = tables.shape
    rows = math.ceil(q_len / Q_BLOCK)
    n = torch.tensor(lens, device=dev, dtype=torch.int64)[:, None]
    m = torch.arange(rows, device=dev, dtype=torch.int64)[None, :]
    pos_min = n - q_len + m * Q_BLOCK
    pos_max = n - q_len + torch.clamp((m + 1) * Q_BLOCK, max=q_len) - 1
    n_full = torch.clamp((pos_min + 1) // block, 0, w)
    n_total = torch.clamp(pos_max // block + 1, 0, w)
    col = torch.arange(w, device=dev, dtype=torch.int64)
    part_cols = torch.clamp(n_full[..., None] + col, max=w - 1)  # [B, rows, W]
    tab = tables.to(torch.int64)
    part = torch.gather(tab, 1, part_cols.view(b, -1)).view(b, rows, w)
    full = tab[:, None, :].expand(b, rows, w)
    n_part = n_total - n_full
    if fold > 1:
        h = torch.arange(fold, device=dev, dtype=torch.int64)[None, :, None, None]
        part = (part[:, None] * fold + h).reshape(b * fold, rows, w)
        full = (full[:, None] * fold + h).reshape(b * fold, rows, w)
        n_part = n_part.repeat_interleave(fold, 0)
        n_full = n_full.repeat_interleave(fold, 0)
    # Index rows as wide as the KV sequence has blocks (flex checks block-mask KV extent >= KV length,
    # as torch's own PagedAttention does); entries past each row's count are never read.
    width = max(kv_total // block, w)
    if width > w:
        pad = (0, width - w)
        part = torch.nn.functional.pad(part, pad)
        full = torch.nn.functional.pad(full, pad)
    i32 = torch.int32
    return _from_kv_blocks(
        n_part[:, None].to(i32).contiguous(), part[:, None].to(i32).contiguous(),
        n_full[:, None].to(i32).contiguous(), full[:, None].to(i32).contiguous(),
        (Q_BLOCK, block), mask_mod, (q_len, kv_total),
    )


def _paged_variant(specs: list[AttnSpec]) -> Variant:
    flex = compiled_flex()
    fns = []
    unfold = None
    for spec in specs:
        p = spec.pools
        ps = p.page_size
        q4 = spec.q4 if spec.q4.dtype == torch.bfloat16 else spec.q4.to(torch.bfloat16)
        b, hq, lq, d = q4.shape
        hkv = spec.num_kv_heads
        g = hq // hkv
        npages = p.k.shape[0]
        if p.v is None:  # MLA: one latent head, values = first v_dim columns
            kf = p.k.view(1, 1, npages * ps, p.k.shape[-1])
            vf = kf[..., : spec.v_dim]
            fold, make_q, gqa = 1, (lambda q4=q4: q4), hq > 1
            unfold = lambda o: o
        elif p.layout == "NHD":
            kf = p.k.view(npages * ps, hkv, d).permute(1, 0, 2).unsqueeze(0)
            vf = p.v.view(npages * ps, hkv, d).permute(1, 0, 2).unsqueeze(0)
            fold, make_q, gqa = 1, (lambda q4=q4: q4), g > 1
            unfold = lambda o: o
        else:
            kf = p.k.view(1, 1, npages * hkv * ps, d)
            vf = p.v.view(1, 1, npages * hkv * ps, d)
            fold, gqa = hkv, g > 1
            make_q = lambda q4=q4, b=b, hkv=hkv, g=g, lq=lq, d=d: q4.reshape(b, hkv, g, lq, d).reshape(b * hkv, g, lq, d)
            unfold = lambda o, b=b, hq=hq, lq=lq: o.reshape(b, hq, lq, o.shape[-1])
        lens_t = torch.tensor(spec.lens, dtype=torch.int32, device=q4.device)
        inv = p.inv_page

        def mask_mod(bi, hi, q_idx, kv_idx, ps=ps, fold=fold, lens_t=lens_t, inv=inv, lq=lq):
            blk = kv_idx // ps
            page = blk // fold if fold > 1 else blk
            req = bi // fold if fold > 1 else bi
            key = inv[page] * ps + kv_idx % ps
            return key <= lens_t[req] - lq + q_idx

        bm = block_mask(spec.lens, lq, ps, p.tables, fold, mask_mod, kf.shape[2])
        # Non-decode flex kernels need BLOCK_N to divide the sparse KV block (the page).
        opts = {"BLOCK_N": ps} if lq >= 128 and ps < 128 else None
        qf = make_q()  # the query in flex's layout once, outside the timed call: attention alone is timed
        fns.append(lambda qf=qf, kf=kf, vf=vf, bm=bm, gqa=gqa, opts=opts, scale=spec.scale:
                   flex(qf, kf, vf, block_mask=bm, scale=scale, enable_gqa=gqa, kernel_options=opts))
    kv_dtype = specs[0].pools.k.dtype
    note = "page table as BlockMask kv_indices"
    if kv_dtype != torch.bfloat16:
        note += f", {kv_dtype} K/V read directly"
    return Variant("flex-paged", "flex", fns, note=note, unfold=unfold)


def _dense_variant(specs: list[AttnSpec], with_prep: bool) -> Variant:
    """flex on contiguous K/V: gathered from the pages (paged suites) or as given (single decode)."""
    flex = compiled_flex()
    fns = []
    for spec in specs:
        q, k, v = dense_kv(spec)
        b, hq, lq, _ = q.shape
        kv_len = k.shape[2]
        gqa = hq != k.shape[1]
        bm = None
        if lq > 1 or any(n != kv_len for n in spec.lens):
            block = Q_BLOCK if kv_len % Q_BLOCK == 0 else spec.pools.page_size
            w = kv_len // block
            tables = torch.arange(w, device=q.device, dtype=torch.int32)[None].expand(b, w).contiguous()
            lens_t = torch.tensor(spec.lens, dtype=torch.int32, device=q.device)

            def mask_mod(bi, hi, q_idx, kv_idx, lens_t=lens_t, lq=lq):
                return kv_idx <= lens_t[bi] - lq + q_idx

            bm = block_mask(spec.lens, lq, block, tables, 1, mask_mod, kv_len)
        if with_prep:
            fns.append(lambda spec=spec, bm=bm, gqa=gqa: flex(*dense_kv(spec), block_mask=bm, scale=spec.scale,
                                                              enable_gqa=gqa))
        else:
            fns.append(lambda q=q, k=k, v=v, bm=bm, gqa=gqa, scale=spec.scale:
                       flex(q, k, v, block_mask=bm, scale=scale, enable_gqa=gqa))
    label = prep_label(specs[0])
    paged = specs[0].pools is not None
    base = "flex-gathered" if paged else "flex"
    name = f"{base}+{label}" if with_prep and label else base
    note = "on K/V gathered from the pages (paged flex unavailable)" if paged else ""
    return Variant(name, "flex", fns, includes=label if with_prep else "", note=note, eager=not with_prep)


# Formulations that failed to compile on an earlier shape (e.g. MLA's 576-wide heads): later shapes
# of the same kind skip them instead of spending another compile on the same failure.
_failed: dict[tuple, str] = {}


def signature(spec: AttnSpec, form: str) -> tuple:
    p = spec.pools
    src = p.k if p is not None else spec.k4
    layout = p.layout if p is not None else "dense"
    return (form, layout, spec.q4.shape[-1], spec.v_dim, str(src.dtype), spec.q4.shape[2] >= 128)


def remember_failure(spec: AttnSpec, form: str, error: str) -> None:
    _failed[signature(spec, form)] = error


def earlier_failure(spec: AttnSpec, form: str) -> str | None:
    return _failed.get(signature(spec, form))


def _no_mixed_batch() -> Variant:
    raise NotAvailable("mixed batch (per-request query lengths): the flex block masks here take one query length")


def variants(specs: list[AttnSpec], paged_failed: bool = False, always_gathered: bool = False
             ) -> Iterator[tuple[str, object]]:
    """``(name, build)`` pairs; the gathered form only where no paged one exists or it failed."""
    spec = specs[0]
    if spec.q_lens is not None:
        if not paged_failed:
            yield "flex-paged", _no_mixed_batch
        return
    paged = spec.pools is not None
    # flex wants one dtype for q, K and V: an fp8 pool cannot be read in place next to a bf16 query.
    same_dtype = paged and spec.pools.k.dtype == spec.q4.dtype
    if paged and same_dtype and not paged_failed:
        yield "flex-paged", (lambda: _paged_variant(specs))
        if not always_gathered:
            return
    base = "flex-gathered" if paged else "flex"
    yield base, (lambda: _dense_variant(specs, with_prep=False))
    label = prep_label(specs[0])
    if label:
        yield f"{base}+{label}", (lambda: _dense_variant(specs, with_prep=True))
