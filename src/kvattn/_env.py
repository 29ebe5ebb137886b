"""Every environment switch kvattn reads, in one place.

``KVATTN_BACKEND``
    ``reference`` runs the plain-PyTorch implementation everywhere; ``triton`` runs the Triton
    kernels (on CPU tensors this needs ``TRITON_INTERPRET=1``, which runs them in Triton's
    interpreter). Unset: Triton for CUDA tensors, the reference for CPU tensors.
``KVATTN_DEBUG``
    ``1`` turns on the checks that need device values (page ids inside the cache, ``seq_lens``
    within the page table's capacity). They synchronise with the host, so they are off by default.
``TRITON_INTERPRET``
    Triton's own switch; kvattn only reads it to know that kernels run on the CPU.
"""

from __future__ import annotations

import os

_BACKENDS = ("reference", "triton")


def backend_override() -> str | None:
    """The backend forced by ``KVATTN_BACKEND``, or None when unset."""
    value = os.environ.get("KVATTN_BACKEND", "").strip().lower()
    if not value:
        return None
    if value not in _BACKENDS:
        raise ValueError(f"KVATTN_BACKEND: expected one of {_BACKENDS}, got {value!r}")
    return value


def debug_checks() -> bool:
    """Whether the device-value checks (``KVATTN_DEBUG=1``) are on."""
    return os.environ.get("KVATTN_DEBUG", "0").strip().lower() in ("1", "true", "yes", "on")


def triton_interpret() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")
