"""Views of long-lived tensors (a KV cache, a workspace) kept per tensor: :func:`cached_aliases`
builds them once and reuses them while the tensor's metadata holds (building views costs host
time on every call)."""

from __future__ import annotations

import functools
import weakref
from typing import Callable, TypeVar

import torch


T = TypeVar("T")

# (id(base), tag) -> (weakref to base, base metadata, tensors). A KV cache or a workspace is one
# tensor for the life of a serving engine, and each view of it costs a microsecond or two a call.
_ALIASES: dict[tuple, tuple] = {}
_MAX_ALIASES = 64


def _drop_aliases(key: tuple, ref: weakref.ref) -> None:
    entry = _ALIASES.get(key)
    if entry is not None and entry[0] is ref:
        del _ALIASES[key]


def alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory that is not a view: it holds the storage but not ``t``'s base
    tensor (a view keeps its base object alive, so a weak reference to the base would never die)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.shape,
                                                               t.stride())


def cached_aliases(base: torch.Tensor, tag: tuple, make: Callable[..., T], *args) -> T:
    """``make(base, *args)`` -- views of ``base`` (one tensor or a tuple), a function of ``base``'s
    metadata and ``args`` only, ``tag`` naming ``make`` -- kept for ``base`` as :func:`alias` es.

    An entry is reused while ``base`` is the same object with the same data pointer, shape,
    strides and dtype, in the same inference mode, and is dropped with ``base``. Nothing is kept
    for a tensor subclass, for a base that requires grad (aliases are not autograd views of it),
    or while ``torch.compile`` traces.
    """
    if torch.compiler.is_compiling():
        return make(base, *args)
    key = (id(base), tag, args)
    entry = _ALIASES.get(key)
    if entry is not None:  # then ``base`` was a plain tensor with a data pointer and strides
        ref, meta, kept = entry
        if ref() is base and not base.requires_grad and meta == (
            base.data_ptr(), base.shape, base.stride(), base.dtype, torch.is_inference_mode_enabled()
        ):
            return kept
    if type(base) is not torch.Tensor or base.requires_grad:
        return make(base, *args)
    try:
        meta = (base.data_ptr(), base.shape, base.stride(), base.dtype, torch.is_inference_mode_enabled())
    except RuntimeError:  # no data pointer or strides (sparse, ...): nothing to key on
        return make(base, *args)
    made = make(base, *args)
    try:
        kept = alias(made) if isinstance(made, torch.Tensor) else tuple(map(alias, made))
    except RuntimeError:  # a tensor set_ cannot alias: use the views uncached
        return made
    if len(_ALIASES) >= _MAX_ALIASES:
        _ALIASES.clear()
    _ALIASES[key] = (weakref.ref(base, functools.partial(_drop_aliases, key)), meta, kept)
    return kept
