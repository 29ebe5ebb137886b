"""``torch.ops.kvattn.append_paged_kv``: the append kernel as a torch operator.

Registered with a fake implementation and its exact ``mutates_args`` (the K/V pages and the NVFP4
block scales), so ``torch.compile`` traces through :func:`kvattn.cache.append_paged_kv_cache`.
Eager calls skip the dispatcher (see :mod:`kvattn._library`).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..._library import entry
from .launch import launch_append


def append_impl(
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


append_paged_kv = torch.library.custom_op(
    "kvattn::append_paged_kv", append_impl, mutates_args=("k", "v", "k_sf", "v_sf")
)


@append_paged_kv.register_fake
def _append_fake(key, value, k, v, k_sf, v_sf, table, batch_indices, positions, k_factor, k_tensor, v_factor,
                 v_tensor) -> None:
    return None


def append(key, value, k, v, k_sf, v_sf, table, batch_indices, positions, k_scale, v_scale) -> None:
    """Unpack the :class:`~kvattn._inputs.Scale` s and run the operator (directly when eager)."""
    entry(append_paged_kv, append_impl)(
        key, value, k, v, k_sf, v_sf, table, batch_indices, positions,
        k_scale.factor, k_scale.tensor, v_scale.factor, v_scale.tensor,
    )
