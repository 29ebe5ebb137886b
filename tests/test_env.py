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


_FLAGS = [("KVATTN_DEBUG", _env.debug_checks), ("KVATTN_CALL_CACHE", _env.call_cache),
          ("KVATTN_FAST_LAUNCH", _env.fast_launch), ("KVATTN_FUSED_MERGE", _env.fused_merge),
          ("KVATTN_GLUON", _env.gluon), ("KVATTN_GLUON_WS", _env.gluon_ws),
          ("KVATTN_BATCH_INVARIANT", _env.batch_invariant_env)]


@pytest.mark.parametrize("name, read", _FLAGS, ids=[n for n, _ in _FLAGS])
def test_every_flag_reads_on_and_off_words(monkeypatch, name, read):
    for raw, want in (("1", True), (" On ", True), ("yes", True), ("TRUE", True), ("0", False), ("off", False),
                      ("No", False), ("false", False)):
        monkeypatch.setenv(name, raw)
        assert read() is want, raw


@pytest.mark.parametrize("name, read", _FLAGS, ids=[n for n, _ in _FLAGS])
@pytest.mark.parametrize("raw", ["2", "-1", "debug", "enabled"])
def test_every_flag_rejects_other_values_like_the_backend_switch(monkeypatch, name, read, raw):
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=f"^{name}: expected 1 or 0 .*got '{raw}'"):
        read()
    monkeypatch.setenv("KVATTN_BACKEND", "foo")
    with pytest.raises(ValueError, match="^KVATTN_BACKEND: expected one of"):
        _env.backend_override()


def test_debug_unset_is_none_so_the_device_decides(monkeypatch):
    monkeypatch.delenv("KVATTN_DEBUG", raising=False)
    assert _env.debug_checks() is None
    monkeypatch.setenv("KVATTN_DEBUG", "  ")
    assert _env.debug_checks() is None


def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch):
    """Triton's own switch: an unknown value is off, never kvattn's error."""
    monkeypatch.setenv("TRITON_INTERPRET", "2")
    assert _env.triton_interpret() is False
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _env.triton_interpret() is True
