"""Every environment switch kvattn reads, in one place.

``KVATTN_BACKEND``
    ``reference`` runs the plain-PyTorch implementation everywhere; ``triton`` runs the Triton
    kernels (on CPU tensors this needs ``TRITON_INTERPRET=1``, which runs them in Triton's
    interpreter). Unset: Triton for CUDA tensors, the reference for CPU tensors.
``KVATTN_DEBUG``
    ``1`` turns on the checks that need device values (page ids inside the cache, ``seq_lens``
    within the page table's capacity). They synchronise with the host, so they are off by default.
``KVATTN_FAST_LAUNCH``
    ``0`` launches every kernel through ``kernel[grid](...)`` instead of the compiled kernel's
    launcher (see :mod:`kvattn.ops.fast_launch`); on by default.
``TRITON_INTERPRET``
    Triton's own switch; kvattn only reads it to know that kernels run on the CPU.

The switches are read on every call (tests and users change them at run time), but cheaply: the
raw value is looked up in ``os.environ``'s own dict and its parsed meaning is memoised, where
``os.environ.get`` of an unset name costs a microsecond (it raises and catches a KeyError).
"""

from __future__ import annotations

import functools
import os

import torch

_BACKENDS = ("reference", "triton")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

# CPython keeps os.environ's content in ``_data`` under ``encodekey(name)``; os.environ[...] = ...
# and monkeypatch.setenv update it. Elsewhere, fall back to os.environ.get.
_DATA = getattr(os.environ, "_data", None)
_ENCODE = getattr(os.environ, "encodekey", None)


def _reader(name: str):
    """A function returning the raw value of ``name`` (str, bytes or None when unset)."""
    if isinstance(_DATA, dict) and _ENCODE is not None:
        fast = functools.partial(_DATA.get, _ENCODE(name))

        def read():
            # torch.compile traces the public functions, and Dynamo cannot trace a bound dict.get
            # held in a partial: it reads os.environ the ordinary way.
            if torch.compiler.is_compiling():
                return os.environ.get(name)
            return fast()

        return read
    return functools.partial(os.environ.get, name)


_raw_backend = _reader("KVATTN_BACKEND")
_raw_debug = _reader("KVATTN_DEBUG")
_raw_fast = _reader("KVATTN_FAST_LAUNCH")
_raw_interpret = _reader("TRITON_INTERPRET")


def _text(raw) -> str:
    if raw is None:
        return ""
    return (os.fsdecode(raw) if isinstance(raw, bytes) else raw).strip().lower()


@functools.lru_cache(maxsize=64)
def _parse_backend(raw) -> str | None:
    value = _text(raw)
    if not value:
        return None
    if value not in _BACKENDS:
        raise ValueError(f"KVATTN_BACKEND: expected one of {_BACKENDS}, got {value!r}")
    return value


@functools.lru_cache(maxsize=64)
def _parse_flag(raw, default: bool) -> bool:
    value = _text(raw)
    if not value:
        return default
    return value in _TRUE if default is False else value not in _FALSE


def _flag(raw, default: bool) -> bool:
    if torch.compiler.is_compiling():  # Dynamo warns about traced lru_caches: parse directly
        return _parse_flag.__wrapped__(raw, default)
    return _parse_flag(raw, default)


def backend_override() -> str | None:
    """The backend forced by ``KVATTN_BACKEND``, or None when unset."""
    if torch.compiler.is_compiling():
        return _parse_backend.__wrapped__(_raw_backend())
    return _parse_backend(_raw_backend())


def debug_checks() -> bool:
    """Whether the device-value checks (``KVATTN_DEBUG=1``) are on."""
    return _flag(_raw_debug(), False)


def fast_launch() -> bool:
    """Whether kernels may launch through their compiled launcher (``KVATTN_FAST_LAUNCH``, default on)."""
    return _flag(_raw_fast(), True)


def triton_interpret() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1``)."""
    return _flag(_raw_interpret(), False)
