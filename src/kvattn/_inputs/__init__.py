"""Validation at the API boundary, and the normalised descriptions every backend consumes.

Every input form the public functions accept (NHD or HND pages, a ``(K, V)`` tuple or one tensor
with a size-2 / size-1 plane, xqa's flat pool of head vectors, split K/V page tables, MLA's latent
cache) becomes one :class:`PagedKV` of strided *views* (never copies): K and V as
``[num_pages, page_size, num_kv_heads, stored_dim]`` plus one page table each. Scale arguments
become :class:`Scale` (a host float times an optional one-element device tensor), so every
backend applies exactly two scales: a logit multiplier and an output multiplier.

All checks here read shapes, dtypes, strides and devices only: nothing synchronises with the
device. Checks that need device values live in :func:`debug_check_pages` (on for CPU tensors,
``KVATTN_DEBUG=1`` for CUDA tensors).

The package's modules, one topic each: ``checks`` (one argument at a time), ``swaps`` (swapped
arguments' hints), ``aliases`` (views of long-lived tensors), ``scales``, ``paged`` (the
:class:`PagedKV` model and its normalisation) and ``device_checks``; their names used across
kvattn are gathered here.
"""

from .aliases import alias, cached_aliases
from .checks import (
    DECODE_HEAD_DIMS, HALF_DTYPES, INT64_RULE, LAYOUTS, MIN_WORKSPACE_BYTES, check_half_match, check_head_dim,
    check_int, check_interpretable, check_last_dim_contiguous, check_layout, check_lse_out, check_out,
    check_query_heads, check_seq_lens, check_shape, check_sinks, check_tensor, check_window, check_workspace,
)
from .device_checks import debug_check_pages
from .paged import PagedKV, check_max_seq_len, check_paged_heads, paged_kv_from_cache
from .scales import Scale, to_scale
from .swaps import SwapHints, looks

__all__ = [
    "DECODE_HEAD_DIMS", "HALF_DTYPES", "INT64_RULE", "LAYOUTS", "MIN_WORKSPACE_BYTES", "PagedKV", "Scale", "alias",
    "cached_aliases", "check_half_match", "check_head_dim", "check_int", "check_interpretable",
    "check_last_dim_contiguous", "check_layout", "check_lse_out", "check_max_seq_len", "check_out",
    "check_paged_heads", "check_query_heads", "check_seq_lens", "check_shape", "check_sinks", "check_tensor",
    "check_window", "check_workspace", "debug_check_pages", "SwapHints", "looks", "paged_kv_from_cache", "to_scale",
]
