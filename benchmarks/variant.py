"""A timed implementation of one shape: kvattn or a peer formulation, one callable per input set."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from kvattn.bench import NotAvailable  # noqa: F401  (one class for the package's bench and the harness)

Fn = Callable[[], object]


@dataclass
class Variant:
    """``fns[i]`` runs the whole timed call on input set ``i``.

    ``includes`` names what the timed call does besides attention (``"gather"``: copying the pages
    into contiguous K/V; ``"rope"``; ``"cast"``: fp8 to bf16), empty for attention alone.
    ``unfold(out)`` maps the callable's raw output to ``[B, Hq, Lq, Dv]`` (used by the check, never
    inside the timed call). ``context`` wraps every call (e.g. an SDPA backend selection).
    """

    name: str
    family: str
    fns: list[Fn]
    includes: str = ""
    note: str = ""
    unfold: Callable[[torch.Tensor], torch.Tensor] = lambda o: o
    context: Callable[[], ContextManager] = nullcontext
    graph: bool = True
    eager: bool = True  # time eager calls too (the +prep peer variants only replay graphs, to save time)
    extra: dict = field(default_factory=dict)


