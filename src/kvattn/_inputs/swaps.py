"""Swapped arguments: when a call's tensors fail a check, :class:`SwapHints` names the positional
arguments that look as if two were given in each other's place."""

from __future__ import annotations

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
    """What an argument looks like, for :class:`SwapHints`: a tensor of a dtype kind in ``kinds``
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


class SwapHints:
    """The swap hints of a function whose errors name its arguments (``"name: ..."``): an error
    about an argument that does not look as it should (``shapes[name]``, see :func:`looks`) while
    exactly one other argument looks like it, and it like that one, gets a hint that the two are
    swapped. The public function adds them where it catches the error (``except (TypeError,
    ValueError)``, around its call of ``function``: no call of its own on the way to the kernels);
    nothing is worked out until an error."""

    def __init__(self, function: Callable, **shapes: Callable[[object], bool]):
        self.signature = inspect.signature(function)
        self.shapes = shapes

    def add(self, error: Exception, args: tuple, kwargs: dict | None = None) -> None:
        """Append the hint, if any, to ``error``'s message; ``args``, ``kwargs``: what ``function``
        was called with."""
        if len(error.args) != 1 or not isinstance(error.args[0], str):
            return
        try:
            bound = self.signature.bind_partial(*args, **(kwargs or {})).arguments
        except TypeError:  # (arguments that do not bind: the error is about that)
            return
        hint = _swap_hint(error.args[0], bound, self.shapes)
        if hint is not None:
            error.args = (error.args[0] + hint,)
