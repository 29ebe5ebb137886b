"""The check the torch.compile tests share: a step traced by ``torch.compile`` gives what it gives eagerly."""

from __future__ import annotations

import torch

from kvattn.testing import relative_error


def compile_backend(on_gpu: bool) -> str:
    """Inductor on a GPU; ``aot_eager`` on the CPU tier (no C++ toolchain needed)."""
    return "inductor" if on_gpu else "aot_eager"


def eager_and_compiled(step, args: tuple, backend: str, fullgraph: bool = True) -> tuple:
    """``(eager, compiled)``: ``step(*args)`` run as it is, then through a fresh ``torch.compile``."""
    eager = step(*args)
    torch._dynamo.reset()
    return eager, torch.compile(step, backend=backend, fullgraph=fullgraph)(*args)


def assert_close_to_eager(got: torch.Tensor, eager: torch.Tensor, tol: float = 1e-3) -> None:
    assert torch.isfinite(got.float()).all()
    assert relative_error(got, eager.float()) <= tol
