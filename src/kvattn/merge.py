"""Exact merges of attention states ``(o, lse)``: partial results over disjoint key sets.

An attention *state* is what a kvattn call returns with ``return_lse=True``: an output row
normalised over its own keys and the base-2 log-sum-exp of its logits over the same keys,

``o = sum_j 2^(t_j - lse) v_j``, ``lse = log2 sum_j 2^(t_j)`` (``t_j``: base-2 logits).

Two states over disjoint key sets merge exactly into the state over their union:
``lse = log2(2^lse_a + 2^lse_b)``, ``o = 2^(lse_a - lse) o_a + 2^(lse_b - lse) o_b``. This is how
split-KV decode combines its splits, and how :mod:`kvattn.distributed` combines the slices of
a sequence held by different GPUs.

Conventions, shared with every kvattn function that returns an LSE:

* **Empty states.** A state over no key has ``lse = -inf`` (and ``o = 0``); it contributes
  nothing, and its ``o`` is never read into the result (it may hold anything, even NaN). A merge
  of empty states only is empty: ``o = 0``, ``lse = -inf``.
* **Sinks.** An attention sink is a term ``exp(sink)`` in the softmax denominator, not a key: it
  belongs to no slice, so it must be counted once, after the merge. kvattn's LSEs never include
  sinks, and an output computed *with* sinks is not a state (its denominator holds the sink).
  Compute the partial states without sinks, then pass ``sinks`` here: the merged output is
  ``sum_s 2^(lse_s) o_s / (sum_s 2^(lse_s) + 2^(sink * log2 e))``, exactly the output of one call
  with sinks over all the keys, and the returned LSE stays sink-free. (An output ``o'`` computed
  with sinks, and its LSE, give the sink-free state ``o' * (1 + 2^(sink * log2 e - lse))``.)
* Outputs are merged in float32 whatever their dtype; give float32 partial outputs (every kvattn
  decode call accepts a float32 ``out``) to keep the merge within float32 rounding of one call
  over all the keys.

Both functions run a Triton kernel on CUDA tensors (no host sync, no allocation when ``out`` and
``out_lse`` are given: CUDA-graph capturable) and :mod:`kvattn.reference` on CPU tensors.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .runtime import backend as _backend
from . import reference
from ._inputs import check_sinks, check_tensor

OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_state(o, lse, o_name: str, lse_name: str, device=None):
    check_tensor(o, o_name, dtypes=OUT_DTYPES, device=device)
    check_tensor(lse, lse_name, dtypes=(torch.float32,), device=o.device)
    if o.dim() < 1 or tuple(lse.shape) != tuple(o.shape[:-1]):
        raise ValueError(f"{lse_name}: expected shape {list(o.shape[:-1])} ({o_name}'s shape without its last "
                         f"dim), got {list(lse.shape)}")


def _outputs(out, out_lse, shape: torch.Size, dtype, device):
    """``(out, out_lse)`` checked, or allocated; and their row views ``[rows, D]`` / ``[rows]``."""
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=device)
    else:
        check_tensor(out, "out", dtypes=OUT_DTYPES, device=device, contiguous_last=True)
        if out.shape != shape:
            raise ValueError(f"out: expected shape {list(shape)}, got {list(out.shape)}")
    if out_lse is None:
        out_lse = torch.empty(shape[:-1], dtype=torch.float32, device=device)
    else:
        check_tensor(out_lse, "out_lse", dtypes=(torch.float32,), device=device)
        if out_lse.shape != shape[:-1]:
            raise ValueError(f"out_lse: expected shape {list(shape[:-1])}, got {list(out_lse.shape)}")
    try:
        rows_out = out.view(-1, shape[-1])
        rows_lse = out_lse.view(-1)
    except RuntimeError:
        raise ValueError("out / out_lse: expected tensors whose leading dims flatten to rows without a copy "
                         f"(strides {tuple(out.stride())} / {tuple(out_lse.stride())})") from None
    return out, out_lse, rows_out, rows_lse


def _rows(x: torch.Tensor, lead: int) -> torch.Tensor:
    """``x`` as ``[*x.shape[:lead], rows, D]`` with the last dim contiguous (a view where possible)."""
    rows = 1
    for n in x.shape[lead:-1]:
        rows *= n
    y = x.reshape(*x.shape[:lead], rows, x.shape[-1])
    return y if y.stride(-1) == 1 or y.shape[-1] == 1 else y.contiguous()


def _sinks(sinks, shape: torch.Size, device):
    if sinks is None:
        return None
    if len(shape) < 2:
        raise ValueError(f"sinks: need outputs with a head dim ([..., H, D]), got shape {list(shape)}")
    return check_sinks(sinks, "sinks", shape[-2], device).contiguous()


def merge_state(
    o_a: torch.Tensor,
    lse_a: torch.Tensor,
    o_b: torch.Tensor,
    lse_b: torch.Tensor,
    *,
    out: Optional[torch.Tensor] = None,
    out_lse: Optional[torch.Tensor] = None,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention states over disjoint key sets into the state over their union.

    Parameters
    ----------
    o_a, o_b : torch.Tensor ``[..., D]``, float16, bfloat16 or float32
        The states' outputs (same shape; the dtypes may differ).
    lse_a, lse_b : torch.Tensor float32 ``[...]``
        Their base-2 log-sum-exps; ``-inf`` marks an empty state (its output is ignored).
    out : torch.Tensor ``[..., D]``, optional
        Float16, bfloat16 or float32; default ``o_a``'s dtype (float32 if ``o_b`` is float32). May
        be ``o_a`` or ``o_b`` itself (in place); its leading dims must flatten without a copy.
    out_lse : torch.Tensor float32 ``[...]``, optional
        May be ``lse_a`` or ``lse_b`` itself.
    sinks : torch.Tensor float32 ``[H]``, optional
        Attention sinks (natural units) of the ``H`` heads of ``[..., H, D]`` outputs, applied once
        to the merged output (see the module notes); the returned LSE excludes them.

    Returns
    -------
    (torch.Tensor ``[..., D]``, torch.Tensor float32 ``[...]``)
        The merged output and its LSE (``out`` and ``out_lse`` when given).

    Examples
    --------
    >>> import torch, kvattn
    >>> v = torch.randn(6, 4)
    >>> t = torch.randn(6)  # base-2 logits of 6 keys
    >>> def state(keys):
    ...     w = torch.softmax(t[keys] * 0.6931471805599453, 0)
    ...     return w @ v[keys], torch.logsumexp(t[keys] * 0.6931471805599453, 0) / 0.6931471805599453
    >>> (o_a, lse_a), (o_b, lse_b), (o, lse) = state([0, 1, 2]), state([3, 4, 5]), state(list(range(6)))
    >>> m, m_lse = kvattn.merge_state(o_a, lse_a, o_b, lse_b)
    >>> bool(torch.allclose(m, o, atol=1e-6)), bool(torch.allclose(m_lse, lse, atol=1e-6))
    (True, True)
    """
    _check_state(o_a, lse_a, "o_a", "lse_a")
    device = o_a.device
    _check_state(o_b, lse_b, "o_b", "lse_b", device)
    if o_b.shape != o_a.shape:
        raise ValueError(f"o_b: expected the shape of o_a {list(o_a.shape)}, got {list(o_b.shape)}")
    sinks = _sinks(sinks, o_a.shape, device)
    dtype = torch.float32 if torch.float32 in (o_a.dtype, o_b.dtype) else o_a.dtype
    out, out_lse, rows_out, rows_lse = _outputs(out, out_lse, o_a.shape, dtype, device)
    a, b = _rows(o_a, 0), _rows(o_b, 0)
    la, lb = lse_a.reshape(-1), lse_b.reshape(-1)
    ops = _backend.triton_entry("merge_states", device)
    if ops is not None:
        ops.merge_states(a, la, b, lb, sinks, rows_out, rows_lse)
    else:
        reference.merge_states(torch.stack((a.float(), b.float())), torch.stack((la, lb)), sinks, rows_out, rows_lse)
    return out, out_lse


def merge_states(
    o: torch.Tensor,
    lse: torch.Tensor,
    *,
    out: Optional[torch.Tensor] = None,
    out_lse: Optional[torch.Tensor] = None,
    sinks: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge a stack of attention states over disjoint key sets into the state over their union.

    Parameters
    ----------
    o : torch.Tensor ``[S, ..., D]``, float16, bfloat16 or float32
        ``S`` states' outputs along dim 0 (any strides; rows whose last dim is not contiguous are
        copied first). ``S`` may be 0 (the result is empty: zeros and ``-inf``).
    lse : torch.Tensor float32 ``[S, ...]``
        Their base-2 log-sum-exps; ``-inf`` marks an empty state (its output is ignored).
    out : torch.Tensor ``[..., D]``, optional
        Float16, bfloat16 or float32 (default ``o``'s dtype); may be ``o[s]`` for one ``s`` (in
        place). Its leading dims must flatten without a copy.
    out_lse : torch.Tensor float32 ``[...]``, optional
        May be ``lse[s]``.
    sinks : torch.Tensor float32 ``[H]``, optional
        Sinks of the ``H`` heads of ``[S, ..., H, D]`` states, applied once to the merged output;
        the returned LSE excludes them.

    Returns
    -------
    (torch.Tensor ``[..., D]``, torch.Tensor float32 ``[...]``)

    Examples
    --------
    >>> import torch, kvattn
    >>> q, k, v = torch.randn(8, 64), torch.randn(300, 8, 64), torch.randn(300, 8, 64)
    >>> parts = [kvattn.reference.attend(q[None], k[i:i + 100], v[i:i + 100],
    ...                                  torch.ones(1, 100, dtype=torch.bool), 0.125) for i in (0, 100, 200)]
    >>> o, lse = kvattn.merge_states(torch.stack([p[0][0] for p in parts]), torch.stack([p[1][0] for p in parts]))
    >>> whole, whole_lse = kvattn.reference.attend(q[None], k, v, torch.ones(1, 300, dtype=torch.bool), 0.125)
    >>> bool(torch.allclose(o, whole[0], atol=1e-5)), bool(torch.allclose(lse, whole_lse[0], atol=1e-5))
    (True, True)
    """
    check_tensor(o, "o", dtypes=OUT_DTYPES)
    device = o.device
    check_tensor(lse, "lse", dtypes=(torch.float32,), device=device)
    if o.dim() < 2 or tuple(lse.shape) != tuple(o.shape[:-1]):
        raise ValueError(f"lse: expected shape {list(o.shape[:-1])} (o's shape [S, ..., D] without its last dim), "
                         f"got {list(lse.shape)}")
    shape = o.shape[1:]
    sinks = _sinks(sinks, shape, device)
    out, out_lse, rows_out, rows_lse = _outputs(out, out_lse, shape, o.dtype, device)
    states = o.shape[0]
    o3 = _rows(o, 1)
    lse2 = lse.reshape(states, o3.shape[1])
    ops = _backend.triton_entry("merge_states", device)
    if ops is not None:
        ops.merge_states(o3, lse2, None, None, sinks, rows_out, rows_lse)
    else:
        reference.merge_states(o3, lse2, sinks, rows_out, rows_lse)
    return out, out_lse


__all__ = ["merge_state", "merge_states"]
