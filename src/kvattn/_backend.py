"""Which implementation runs a call: the Triton kernels or the plain-PyTorch reference.

Default: Triton for CUDA tensors, the reference for CPU tensors. ``KVATTN_BACKEND`` overrides
(see :mod:`kvattn._env`). An op whose Triton kernel does not exist yet runs the reference and says
so once, so the API is complete on every device.
"""

from __future__ import annotations

import warnings

import torch

from . import _env

# Ops whose Triton kernels exist; each kernel family adds its names when imported (kvattn.ops).
TRITON_OPS: set[str] = set()
_warned: set[tuple[str, str]] = set()


_loaded = False  # whether _load_ops has run (an import statement costs a microsecond a call)
_ON_CUDA: dict = {}  # device -> device.type == "cuda" (reading a device's type costs 0.2 us)


def _load_ops() -> None:
    global _loaded
    try:
        from . import ops  # noqa: F401  (registers TRITON_OPS)
    except ImportError as exc:  # pragma: no cover - triton missing: reference only
        warnings.warn(f"kvattn: Triton kernels unavailable ({exc}); using the reference backend", stacklevel=3)
    _loaded = True


def use_triton(op: str, device: torch.device) -> bool:
    """True when ``op`` on ``device`` should run its Triton kernel."""
    forced = _env.backend_override()
    on_cuda = _ON_CUDA.get(device)
    if on_cuda is None:
        on_cuda = _ON_CUDA[device] = device.type == "cuda"
    if forced is None:
        if not on_cuda:
            return False
    elif forced == "reference":
        return False
    elif not on_cuda and not _env.triton_interpret():
        raise RuntimeError(
            "KVATTN_BACKEND=triton with CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
        )
    if not _loaded:
        _load_ops()
    if op in TRITON_OPS:
        return True
    key = (op, device.type)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"kvattn: no Triton kernel for {op} yet; running the reference backend on {device}", stacklevel=3)
    return False
