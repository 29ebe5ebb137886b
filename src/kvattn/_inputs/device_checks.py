"""The checks that read device values (page ids in range, lengths within the table, offsets that
never decrease, finite scales): they synchronise, so they run for CPU tensors by default and for
CUDA tensors only with ``KVATTN_DEBUG=1`` (docs/semantics.md, "Index tensors")."""

from __future__ import annotations

import torch

from ..runtime import env as _env
from .paged import PagedKV


def _lengths_as_read(seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(as_read, given)`` int64 CPU ``[B]``: the lengths as the kernels read them (int32; a uint32
    length of 2^31 or more is negative) and as given."""
    flat = seq_lens.reshape(-1)
    given = flat.to(torch.int64).cpu()
    as_read = (flat.view(torch.int32) if flat.dtype == torch.uint32 else flat).to(torch.int64).cpu()
    return as_read, given


def _first(bad: torch.Tensor) -> int:
    return int(bad.nonzero()[0, 0])


def _debug_check_cum(cum: torch.Tensor, name: str, want_last: int | None, what: str) -> torch.Tensor:
    """``cum`` (int64 CPU ``[B + 1]``) starts at 0, never decreases and ends at ``want_last``."""
    if cum.numel() and int(cum[0]) != 0:
        raise ValueError(f"{name}: expected a first entry of 0, got {int(cum[0])}")
    steps = cum[1:] - cum[:-1]
    if bool((steps < 0).any()):
        b = _first(steps < 0)
        raise ValueError(f"{name}: expected non-decreasing offsets, got {int(cum[b])} then {int(cum[b + 1])} "
                         f"(entries {b}, {b + 1})")
    if want_last is not None and cum.numel() and int(cum[-1]) != want_last:
        raise ValueError(f"{name}: expected a last entry of {want_last} ({what}), got {int(cum[-1])}")
    return steps


def debug_check_pages(
    kv: PagedKV,
    seq_lens: torch.Tensor,
    name: str = "block_tables",
    *,
    max_len: int | None = None,
    max_len_name: str = "max_seq_len",
    q_len: int = 1,
    cum_q: torch.Tensor | None = None,
    num_rows: int | None = None,
    max_q_len: int | None = None,
    cum_kv: torch.Tensor | None = None,
    scales=(),
    pool_name: str | None = None,
) -> None:
    """Device-value checks: by default for CPU tensors only, where reading a value costs no wait;
    ``KVATTN_DEBUG=1`` runs them for CUDA tensors too (they then synchronise), ``KVATTN_DEBUG=0``
    nowhere. Skipped while ``torch.compile`` traces, unless ``KVATTN_DEBUG=1`` asks for them
    (data-dependent checks break the graph).

    Lengths: none below 0 (as the kernels read them: int32), none past the table's capacity or the
    host bound ``max_len`` (named ``max_len_name``), none shorter than the request's query rows
    (``q_len`` rows each, or prefill's ``cum_q``, whose offsets must start at 0, never decrease and
    end at ``num_rows``; their longest run at most ``max_q_len``); ``cum_kv``: the prefix sums of
    the lengths. Every page a request uses must be a valid page id (``pool_name``: the argument
    whose size bounds them, for the message). ``scales``: ``(name, tensor or None)`` pairs, finite.
    """
    forced = _env.debug_checks()
    if not forced and (forced is False or seq_lens.device.type != "cpu" or torch.compiler.is_compiling()):
        return
    lens, given = _lengths_as_read(seq_lens)
    if bool((lens < 0).any()):
        b = _first(lens < 0)
        read = "" if int(given[b]) == int(lens[b]) else f" (uint32 {int(given[b])}, read as int32)"
        raise ValueError(f"seq_lens: expected lengths >= 0, got {int(lens[b])}{read} for request {b}")
    cap = kv.capacity
    if bool((lens > cap).any()):
        raise ValueError(f"seq_lens: a length exceeds the page table's capacity {cap} (max given {int(lens.max())})")
    if max_len is not None and bool((lens > max_len).any()):
        b = int(lens.argmax())
        raise ValueError(f"{max_len_name}: expected at least the longest of seq_lens, {int(lens[b])} (request {b}), "
                         f"got {max_len}")
    if cum_q is not None:
        rows = _debug_check_cum(cum_q.to(torch.int64).cpu().reshape(-1), "cum_seq_lens_q", num_rows,
                                "the query's rows")
        if max_q_len is not None and bool((rows > max_q_len).any()):
            b = int(rows.argmax())
            raise ValueError(f"max_q_len: expected at least the longest run of cum_seq_lens_q, {int(rows[b])} "
                             f"(request {b}), got {max_q_len}")
        short = lens < rows
        if bool(short.any()):
            b = _first(short)
            raise ValueError(f"seq_lens: request {b} has length {int(lens[b])}, fewer than its {int(rows[b])} query "
                             f"rows (a length counts the request's new tokens)")
    elif q_len > 1:
        short = (lens > 0) & (lens < q_len)
        if bool(short.any()):
            b = _first(short)
            raise ValueError(f"seq_lens: request {b} has length {int(lens[b])}, fewer than its q_len_per_req={q_len} "
                             f"query tokens (a length counts them; 0 marks an empty request)")
    if cum_kv is not None:
        ckv = cum_kv.to(torch.int64).cpu().reshape(-1)
        _debug_check_cum(ckv, "cum_seq_lens_kv", None, "")
        want = torch.cat((lens.new_zeros(1), lens.cumsum(0)))
        if ckv.shape != want.shape or bool((ckv != want).any()):
            b = _first(ckv != want)
            raise ValueError(f"cum_seq_lens_kv: expected the prefix sums of seq_lens, {want.tolist()}, got "
                             f"{ckv.tolist()} (first difference at entry {b})")
    pages_needed = (lens + kv.page_size - 1) // kv.page_size
    cols = torch.arange(kv.pages_per_seq)
    pool = f" ({pool_name} holds {kv.num_pages} pages)" if pool_name else ""
    for table in {id(kv.k_table): kv.k_table, id(kv.v_table): kv.v_table}.values():
        t = table.to(torch.int64).cpu()
        used = cols.unsqueeze(0) < pages_needed.unsqueeze(1)
        bad = used & ((t < 0) | (t >= kv.num_pages))
        if bool(bad.any()):
            b, p = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name}: request {b} page slot {p} holds page id {int(t[b, p])}, outside [0, {kv.num_pages}){pool}"
            )
    for scale_name, tensor in scales:
        if tensor is not None and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{scale_name}: expected a finite value, got {tensor.reshape(-1).tolist()}")
