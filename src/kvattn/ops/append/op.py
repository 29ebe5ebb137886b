"""The KV-cache append's entry point and torch operator.

:func:`kvattn.cache.append_paged_kv_cache` validates and normalises its arguments, then calls
:func:`append_paged_kv`, which unpacks :class:`~kvattn._inputs.PagedKV` and
:class:`~kvattn._inputs.Scale` into the flat operator ``torch.ops.kvattn.append_paged_kv`` (a
``torch.library.custom_op`` declared once below, :func:`kvattn.runtime.opdecl.declare_op`, with
its fake and exact ``mutates_args``: the K/V pages and the NVFP4 block scales, so
``torch.compile`` traces through the append; eager calls skip the dispatcher).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._inputs import PagedKV, Scale
from ...runtime.opdecl import Arg, OptTensor, Tensor, declare_op
from .plan import launch_append

# Write ``key``/``value [N, H, D]`` into the NHD page views ``k``/``v`` (see ops.append.launch).
# The names are launch_append's keywords.
APPEND_PAGED_KV = declare_op(
    "kvattn::append_paged_kv", launch_append,
    Arg("key", Tensor),  # [N, H, D]
    Arg("value", OptTensor),  # [N, H, D], or None (a K-only cache)
    Arg("k", Tensor, mutated=True),  # [P, page, H, Ds] NHD view of the K pages
    Arg("v", OptTensor, mutated=True),  # [P, page, H, Ds] NHD view of the V pages, None with value None
    Arg("k_sf", OptTensor, mutated=True),  # [P, page, H, D/16] e4m3 (NVFP4), or None
    Arg("v_sf", OptTensor, mutated=True),
    Arg("table", Tensor),  # [B, pages_per_seq] int32
    Arg("batch_indices", Tensor),  # [N] int32 / int64
    Arg("positions", Tensor),  # [N] int32 / int64
    Arg("k_factor", float),
    Arg("k_tensor", OptTensor),
    Arg("v_factor", float),
    Arg("v_tensor", OptTensor),
)


def append_paged_kv(
    key: torch.Tensor,
    value: Optional[torch.Tensor],
    kv: PagedKV,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    *,
    k_scale: Scale,
    v_scale: Scale,
) -> None:
    """Write ``key``/``value [N, Hkv, D]`` into the pages of ``kv`` (``value`` None: a cache of one
    plane, K only), token ``i`` at position ``positions[i]`` of request ``batch_indices[i]``.
    Nothing waits for the device."""
    has_v = value is not None
    APPEND_PAGED_KV.entry(  # (positionally, in the declaration's order: binding keywords costs microseconds)
        key, value, kv.k, kv.v if has_v else None, kv.k_sf, kv.v_sf if has_v else None, kv.k_table, batch_indices,
        positions, k_scale.factor, k_scale.tensor, v_scale.factor, v_scale.tensor,
    )
