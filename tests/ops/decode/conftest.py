"""Fixtures of the decode tests."""

from __future__ import annotations

import pytest

from kvattn.ops.decode import plan as decode_launch


@pytest.fixture
def split_launches(monkeypatch) -> list:
    """The split launches the decode plans build during the test, in order (the plan cache starts
    empty, so every call's plan is built and seen)."""
    built = []
    real = decode_launch._split_launch
    monkeypatch.setattr(decode_launch, "_split_launch", lambda *a: built.append(real(*a)) or built[-1])
    monkeypatch.setattr(decode_launch, "_PLANS", {})
    return built
