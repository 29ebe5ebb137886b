"""PyTorch's own C++ checks that the call cache's hit path uses, each verified when first asked for.

* :func:`tensor_guard`: a check, in one C++ call, that tensors have the shapes, strides, dtypes,
  devices (type and index), dispatch keys (conjugate and negative bits, inference tensors),
  Python type and ``requires_grad`` of the tensors it was made from (``torch._C._dynamo.guards.
  TensorGuards``, TorchDynamo's tensor guard). Reading those facts attribute by attribute costs
  ~80-150 ns each and tensor (lab/notes/host-path.md "Host path: a replayed call's host time").
* :func:`dict_version`: a number that changes whenever a dict is modified (CPython's version tag,
  as ``torch._C._dynamo.guards.dict_version`` reads it), so that a value computed from a dict's
  content (the environment switches, a kernel's globals) is read again only after a change.

Both are private PyTorch interfaces: each is tried on small cases on first use, and where it is
missing, raises or answers wrongly, the caller falls back to reading the facts itself (None).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

_UNSET = object()
_guard_class: Any = _UNSET
_dict_version: Any = _UNSET


def tensor_guard(tensors) -> Callable[..., bool] | None:
    """``check(*tensors)`` -> whether the tensors have the metadata of ``tensors`` (see the module
    docstring; one check, as many tensors, in the same order), made under the current thread-local
    dispatch state (a guard made inside ``torch.inference_mode`` fails outside it: a stricter
    check, never a looser one). None where PyTorch has no working guard."""
    global _guard_class
    if _guard_class is _UNSET:
        _guard_class = _verified_guard_class()
    if _guard_class is None:
        return None
    guard = _guard_class(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                         dynamic_dims_strides=[list(t.stride()) for t in tensors])
    return guard.check


def _verified_guard_class():
    """TensorGuards, if it accepts tensors of the same metadata and rejects each kind of change."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        a = torch.zeros(2, 3)
        b = torch.zeros(4, dtype=torch.int32)

        def made(*ts):
            return TensorGuards(*ts, dynamic_dims_sizes=[list(t.shape) for t in ts],
                                dynamic_dims_strides=[list(t.stride()) for t in ts]).check

        check = made(a, b)
        ok = (check(torch.ones(2, 3), torch.ones(4, dtype=torch.int32))
              and check(torch.zeros(3, 3)[1:], b)  # (another storage offset: same metadata)
              and not check(torch.zeros(3, 2).t(), b)  # strides
              and not check(torch.zeros(3, 2), b)  # shape
              and not check(torch.zeros(6), b)  # rank
              and not check(a.double(), b)  # dtype
              and not check(a, b.to(torch.uint32))
              and not check(torch.zeros(2, 3, device="meta"), b)  # device
              and not check(torch.nn.Parameter(a), b)  # Python type
              and not made(torch.zeros(2, dtype=torch.complex64))(torch.zeros(2, dtype=torch.complex64).conj()))
    except Exception:  # (a PyTorch without it, or with another signature)
        return None
    return TensorGuards if ok else None


def dict_version() -> Callable[[dict], int] | None:
    """``version(d)``: a number that changes whenever ``d`` is modified; None where PyTorch or
    CPython has none that passes a check here."""
    global _dict_version
    if _dict_version is _UNSET:
        _dict_version = _verified_dict_version()
    return _dict_version


def _verified_dict_version():
    try:
        from torch._C._dynamo.guards import dict_version as version

        d = {"a": 1}
        seen = {version(d)}
        d["a"] = 2
        seen.add(version(d))
        d["b"] = 3
        seen.add(version(d))
        del d["a"]
        seen.add(version(d))
        d.update(c=4)
        seen.add(version(d))
        d.pop("b")
        seen.add(version(d))
        ok = len(seen) == 6 and version(d) == version(d)
    except Exception:  # (no such function, or a CPython without version tags)
        return None
    return version if ok else None
