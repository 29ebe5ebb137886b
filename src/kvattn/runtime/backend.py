"""Which implementation runs a call: the Triton kernels or the plain-PyTorch reference.

Default: Triton for CUDA tensors, the reference for CPU tensors. ``KVATTN_BACKEND`` overrides
(see :mod:`kvattn.runtime.env`). An op whose Triton kernel does not exist yet runs the reference and says
so once, so the API is complete on every device.

Which ops have Triton kernels is the static table :data:`TRITON_OPS` (op name -> the module of
its entry point); a module is imported the first time a call needs it (it imports Triton), never
as a side effect of importing another.
"""

from __future__ import annotations

import importlib
import warnings

import torch

from . import env as _env

# op -> the module holding its Triton entry point (a function of the op's name). A new kernel
# family adds its ops here.
TRITON_OPS: dict[str, str] = {
    "batch_decode": "kvattn.ops.decode.op",
    "single_decode": "kvattn.ops.decode.op",
    "context": "kvattn.ops.prefill.op",
    "mla_decode": "kvattn.ops.mla.op",
    "append_paged_kv": "kvattn.ops.append.op",
    "merge_states": "kvattn.ops.merge.op",
    "local_lengths": "kvattn.ops.merge.op",
}
_MISSING = object()
_ENTRIES: dict[str, object] = {}  # op -> its imported entry module, or None (Triton unavailable)
_warned: set[tuple[str, str]] = set()
_ON_CUDA: dict = {}  # device -> device.type == "cuda" (reading a device's type costs 0.2 us)


def _import_entry(op: str):
    """The entry module of ``op`` (None without a Triton kernel, or when Triton fails to import)."""
    path = TRITON_OPS.get(op)
    module = None
    if path is not None:
        try:
            module = importlib.import_module(path)
        except ImportError as exc:  # pragma: no cover - triton missing: reference only
            warnings.warn(f"kvattn: Triton kernels unavailable ({exc}); using the reference backend", stacklevel=4)
    _ENTRIES[op] = module
    return module


def triton_entry(op: str, device: torch.device):
    """The module whose function ``op`` runs ``op``'s Triton kernel on ``device``, or None when the
    reference should run (CPU tensors without ``KVATTN_BACKEND=triton``, the override
    ``reference``, or no Triton kernel for ``op``)."""
    forced = _env.backend_override()
    on_cuda = _ON_CUDA.get(device)
    if on_cuda is None:
        on_cuda = _ON_CUDA[device] = device.type == "cuda"
    if forced is None:
        if not on_cuda:
            return None
    elif forced == "reference":
        return None
    elif not on_cuda and not _env.triton_interpret():
        raise RuntimeError(
            "KVATTN_BACKEND=triton with CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
        )
    module = _ENTRIES.get(op, _MISSING)
    if module is _MISSING:
        module = _import_entry(op)
    if module is not None:
        return module
    key = (op, device.type)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"kvattn: no Triton kernel for {op} yet; running the reference backend on {device}", stacklevel=3)
    return None



def use_triton(op: str, device: torch.device) -> bool:
    """True when ``op`` on ``device`` should run its Triton kernel."""
    return triton_entry(op, device) is not None
