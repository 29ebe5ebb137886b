"""``kvattn.runtime.env``: the switches read at each call, and a block that sets some for its duration."""

from __future__ import annotations

import os

import pytest

from kvattn.runtime import env as _env


def test_switches_set_for_the_block_then_put_back(monkeypatch):
    monkeypatch.setenv("KVATTN_GLUON", "1")
    monkeypatch.delenv("KVATTN_GLUON_WS", raising=False)
    with _env.switches(KVATTN_GLUON="0", KVATTN_GLUON_WS="0"):
        assert _env.gluon() is False and _env.gluon_ws() is False  # (read at the call)
    assert os.environ["KVATTN_GLUON"] == "1" and "KVATTN_GLUON_WS" not in os.environ
    assert _env.gluon() is True and _env.gluon_ws() is True


def test_switches_put_back_after_an_exception(monkeypatch):
    monkeypatch.delenv("KVATTN_GLUON", raising=False)
    with pytest.raises(RuntimeError), _env.switches(KVATTN_GLUON="0"):
        raise RuntimeError
    assert "KVATTN_GLUON" not in os.environ
