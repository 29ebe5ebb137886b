"""How many workspace bytes a call can use: :func:`workspace_size` (``kvattn.workspace_size``).

The workspace is carved in :mod:`kvattn.runtime.workspace` (decode, ``xqa``, MLA: a fixed head
of alignment and merge counters, then the split-KV partials) and :mod:`kvattn.ops.prefill.staging`
(prefill: after the same head, a quantised cache's pages dequantised once a call). The size
returned here is what that carving takes at most for a call of the given shapes and bounds, on any
GPU: with it the workspace never limits the split count nor keeps pages from being staged. A
smaller workspace (of at least :data:`MIN_WORKSPACE_BYTES`) gives the same results with fewer
splits or no staging, except in batch-invariant mode, which needs its splits (a ValueError).
"""

from __future__ import annotations

import torch

from ._inputs import MIN_WORKSPACE_BYTES, check_int

_FAMILIES = {
    "xqa_batch_decode_with_kv_cache": "decode",
    "xqa": "decode",
    "xqa_batch_decode_with_kv_cache_mla": "mla",
    "trtllm_batch_context_with_kv_cache": "prefill",
}
_NO_WORKSPACE = ("single_decode_with_kv_cache", "append_paged_kv_cache", "merge_state", "merge_states")
MLA_V_DIM = 512  # the latent (value) width of MLA's partials


def _family(function) -> str:
    name = function if isinstance(function, str) else getattr(function, "__name__", None)
    if isinstance(name, str):
        name = name.rsplit(".", 1)[-1]  # (the callable module kvattn.xqa is named "kvattn.xqa")
    if name in _FAMILIES:
        return _FAMILIES[name]
    if name in _NO_WORKSPACE:
        raise ValueError(f"function: {name} takes no workspace")
    raise ValueError(f"function: expected one of the functions taking a workspace_buffer ({', '.join(_FAMILIES)}), "
                     f"as the function or its name, got {function!r}")


def _most_splits(config_cls, max_seq_len: int) -> int:
    """The most splits a launch can take: its config's ``max_splits`` (the tables never raise
    it), or in batch-invariant mode one per ``invariant_span`` keys (the tables round the span up
    to whole tiles, which only lowers the count), at least two."""
    fields = config_cls.__dataclass_fields__
    span = fields["invariant_span"].default
    return max(fields["max_splits"].default, 2, -(-max_seq_len // span))


def workspace_size(
    function,
    *,
    batch_size: int,
    num_qo_heads: int,
    head_dim: int = 128,
    max_seq_len: int,
    q_len_per_req: int = 1,
    query_dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
    num_kv_heads: int | None = None,
    page_size: int = 16,
    max_q_len: int | None = None,
) -> int:
    """Bytes of ``workspace_buffer`` a call can use: with this many the workspace never limits it.

    Parameters
    ----------
    function : callable or str
        The function called: ``kvattn.decode.xqa_batch_decode_with_kv_cache``, ``kvattn.xqa``
        (``kvattn.xqa.xqa``), ``kvattn.mla.xqa_batch_decode_with_kv_cache_mla`` or
        ``kvattn.prefill.trtllm_batch_context_with_kv_cache``, or its name.
    batch_size : int
        Requests of the call (``B``).
    num_qo_heads : int
        Query heads (``Hq``).
    head_dim : int
        ``D`` (decode, ``xqa``, prefill; MLA's partials are always 512 wide).
    max_seq_len : int
        Host bound of the KV lengths (``max_seq_len``; prefill's ``max_kv_len``).
    q_len_per_req : int
        Query rows a request (decode's ``q_len_per_req``, ``xqa``'s ``q.shape[1]``).
    query_dtype, kv_dtype : torch.dtype
        Prefill only: the query's and the cache's dtypes (``kv_dtype`` None: the query's).
    num_kv_heads : int
        Prefill only: ``Hkv`` (None: ``num_qo_heads``).
    page_size : int
        Prefill only: tokens a page.
    max_q_len : int
        Prefill only: the bound of the query rows a request (None: ``max_seq_len``).

    Returns
    -------
    int
        At least :data:`kvattn._inputs.MIN_WORKSPACE_BYTES` (16400: the workspace's fixed head,
        the least any call accepts). Decode, ``xqa`` and MLA: the head and the float32 partials of
        the most splits a launch can take, ``max(64, ceil(max_seq_len / 1024))`` splits of
        ``B * q_len_per_req * Hq * (D + 1)`` values (MLA: ``B * Hq * 513``). Prefill: the head and,
        where the call stages a quantised cache's pages on Hopper, the staged pages and their table.
        A smaller workspace gives the same results, more slowly (fewer splits, no staging), except
        in batch-invariant mode, whose splits must fit (ValueError naming ``workspace_buffer``).

    Examples
    --------
    >>> import kvattn, torch
    >>> kvattn.workspace_size(kvattn.xqa_batch_decode_with_kv_cache, batch_size=8, num_qo_heads=32,
    ...                       head_dim=128, max_seq_len=8192)
    8470544
    >>> kvattn.workspace_size("trtllm_batch_context_with_kv_cache", batch_size=1, num_qo_heads=32,
    ...                       num_kv_heads=8, head_dim=128, max_seq_len=8192, page_size=64,
    ...                       query_dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn)
    33572368
    """
    family = _family(function)
    batch = check_int(batch_size, "batch_size", minimum=0)
    heads = check_int(num_qo_heads, "num_qo_heads", minimum=1)
    d = check_int(head_dim, "head_dim", minimum=1)
    span = check_int(max_seq_len, "max_seq_len", minimum=0)
    q_len = check_int(q_len_per_req, "q_len_per_req", minimum=1)
    if family == "decode":
        from .ops.decode.configs import DecodeConfig

        per_split = batch * q_len * heads * (d + 1)
        return MIN_WORKSPACE_BYTES + 4 * _most_splits(DecodeConfig, span) * per_split
    if family == "mla":
        from .ops.mla.configs import MLAConfig

        per_split = batch * heads * (MLA_V_DIM + 1)
        return MIN_WORKSPACE_BYTES + 4 * _most_splits(MLAConfig, span) * per_split
    return MIN_WORKSPACE_BYTES + _prefill_staging_bytes(batch, heads, d, span, query_dtype, kv_dtype, num_kv_heads,
                                                        page_size, max_q_len)


def _prefill_staging_bytes(batch, heads, d, max_kv_len, query_dtype, kv_dtype, num_kv_heads, page_size,
                           max_q_len) -> int:
    """Bytes past the head that ``ops.prefill.staging.plan`` needs to stage the call's pages (0
    where it does not stage)."""
    from .ops.prefill import staging
    from .formats import FP8_DTYPE

    hkv = heads if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if heads % hkv:
        raise ValueError(f"num_kv_heads: expected a divisor of num_qo_heads={heads}, got {hkv}")
    page = check_int(page_size, "page_size", minimum=1)
    q_rows = max_kv_len if max_q_len is None else check_int(max_q_len, "max_q_len", minimum=0)
    kv_dtype = query_dtype if kv_dtype is None else kv_dtype
    for name, dtype in (("query_dtype", query_dtype), ("kv_dtype", kv_dtype)):
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{name}: expected a torch.dtype, got {type(dtype).__name__}")
    if not staging.stages(query_dtype, kv_dtype, page) or not staging.pays(query_dtype, kv_dtype, q_rows, heads // hkv):
        return 0
    both = query_dtype != FP8_DTYPE
    dst_page = staging.staged_page(page, both)
    dst_pages = -(-max_kv_len // dst_page)
    if batch * dst_pages == 0:
        return 0
    return staging.staged_bytes(batch, dst_pages, dst_page, hkv, d, both)
