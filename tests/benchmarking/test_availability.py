"""A peer that cannot run here (``kvattn.benchmarking.availability``): torch's "no available kernel"
becomes NotAvailable with the reasons torch warned, other errors go through."""

from __future__ import annotations

import warnings
from contextlib import nullcontext

import pytest

from kvattn.benchmarking.availability import NotAvailable, clip, try_backend


def test_refusal_becomes_not_available_with_torch_reasons():
    def refuse():
        warnings.warn("Flash attention kernel not used because:")
        warnings.warn("Flash attention requires q,k,v to have the same last dimension (Triggered internally at x)")
        raise RuntimeError("No available kernel. Aborting execution.")

    with pytest.raises(NotAvailable) as info:
        try_backend(refuse, nullcontext)
    assert str(info.value) == "Flash attention requires q,k,v to have the same last dimension"


def test_refusal_without_reasons_says_so():
    def refuse():
        raise RuntimeError("No viable backend for scaled_dot_product_attention")

    with pytest.raises(NotAvailable, match="no kernel of this backend here"):
        try_backend(refuse, nullcontext)


def test_other_errors_are_not_a_refusal():
    def broken():
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        try_backend(broken, nullcontext)
    try_backend(lambda: None, nullcontext)  # a call that runs: nothing raised


def test_clip():
    assert clip("abc") == "abc" and clip("x" * 150) == "x" * 97 + "..."
