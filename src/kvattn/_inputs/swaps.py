"""Swapped arguments: when a call's tensors fail a check, :func:`hint_swaps` names the positional
arguments that look as if two were given in each other's place."""

from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.uint8:
        return "byte"
    if dtype in (torch.uint16, torch.uint32, torch.uint64):
        return "uint"
    return "float" if dtype.is_floating_point else "int"


def looks(kinds: str, ndims: tuple, pair_ndims: tuple = ()) -> Callable[[object], bool]:
    """What an argument looks like, for :func:`hint_swaps`: a tensor of a dtype kind in ``kinds``
    (space-separated: ``"float"``, ``"int"`` signed, ``"uint"`` unsigned but uint8, ``"byte"``
    uint8) with a rank in ``ndims``, or a pair of such tensors of a rank in ``pair_ndims``."""
    allowed = kinds.split()

    def match(x) -> bool:
        if isinstance(x, (tuple, list)):
            return len(x) == 2 and all(isinstance(t, torch.Tensor) and t.dim() in pair_ndims and
                                       _kind(t.dtype) in allowed for t in x)
        return isinstance(x, torch.Tensor) and x.dim() in ndims and _kind(x.dtype) in allowed

    return match


def _swap_hint(message: str, bound: dict, shapes: dict) -> str | None:
    name = message.split(":", 1)[0]
    if name not in shapes or name not in bound:
        return None
    given, like = bound[name], shapes[name]
    if like(given):
        return None  # (what was given looks right: the error is about something else)
    others = [o for o, o_like in shapes.items()
              if o != name and o in bound and o_like(given) and like(bound[o])]
    if len(others) != 1:
        return None
    return f" ({name} got what looks like {others[0]}, and {others[0]} what looks like {name}: are they swapped?)"


def hint_swaps(**shapes: Callable[[object], bool]):
    """Decorate a function whose errors name its arguments (``"name: ..."``): an error about an
    argument that does not look as it should (``shapes[name]``, see :func:`looks`) while exactly
    one other argument looks like it, and it like that one, gets a hint that the two are swapped.
    Costs nothing until an error: the hint is worked out then."""

    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (TypeError, ValueError) as error:
                if len(error.args) == 1 and isinstance(error.args[0], str):
                    try:
                        hint = _swap_hint(error.args[0], signature.bind(*args, **kwargs).arguments, shapes)
                    except TypeError:  # (arguments that do not bind: the error is about that)
                        hint = None
                    if hint is not None:
                        error.args = (error.args[0] + hint,)
                raise

        return call

    return wrap
