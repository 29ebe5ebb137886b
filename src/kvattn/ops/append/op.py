"""The KV-cache append's entry point and torch operator.

:func:`kvattn.cache.append_paged_kv_cache` validates and normalises its arguments, then calls
:func:`append_paged_kv`, which unpacks :class:`~kvattn._inputs.PagedKV` and
:class:`~kvattn._inputs.Scale` into the flat operator ``torch.ops.kvattn.append_paged_kv`` (a
``torch.library.custom_op`` with a fake implementation and exact ``mutates_args``: the K/V pages
and the NVFP4 block scales, so ``torch.compile`` traces through the append; eager calls skip the
dispatcher, :func:`kvattn.runtime.common.entry`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._inputs import PagedKV, Scale
from ...runtime.common import entry
from .plan import launch_append


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
    entry(append_paged_kv_op, append_paged_kv_impl)(
        key, value, kv.k, kv.v if has_v else None, kv.k_sf, kv.v_sf if has_v else None, kv.k_table, batch_indices,
        positions, k_scale.factor, k_scale.tensor, v_scale.factor, v_scale.tensor,
    )


# ---------------------------------------------------------------------------------------------
# the torch.library op (traced by torch.compile) and the plain call (eager) it wraps
# ---------------------------------------------------------------------------------------------
def append_paged_kv_impl(
    key: torch.Tensor,
    value: Optional[torch.Tensor],
    k: torch.Tensor,
    v: Optional[torch.Tensor],
    k_sf: Optional[torch.Tensor],
    v_sf: Optional[torch.Tensor],
    table: torch.Tensor,
    batch_indices: torch.Tensor,
    positions: torch.Tensor,
    k_factor: float,
    k_tensor: Optional[torch.Tensor],
    v_factor: float,
    v_tensor: Optional[torch.Tensor],
) -> None:
    """Write ``key``/``value [N, H, D]`` into the NHD page views ``k``/``v`` (see ops.append.launch)."""
    launch_append(key, value, k, v, k_sf, v_sf, table, batch_indices, positions,
                  k_factor=k_factor, k_tensor=k_tensor, v_factor=v_factor, v_tensor=v_tensor)


append_paged_kv_op = torch.library.custom_op(
    "kvattn::append_paged_kv", append_paged_kv_impl, mutates_args=("k", "v", "k_sf", "v_sf")
)


@append_paged_kv_op.register_fake
def _append_paged_kv_fake(key, value, k, v, k_sf, v_sf, table, batch_indices, positions, k_factor, k_tensor,
                          v_factor, v_tensor) -> None:
    return None
