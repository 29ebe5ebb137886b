"""Every environment switch kvattn reads, in one place.

``KVATTN_BACKEND``
    ``reference`` runs the plain-PyTorch implementation everywhere; ``triton`` runs the Triton
    kernels (on CPU tensors this needs ``TRITON_INTERPRET=1``, which runs them in Triton's
    interpreter). Unset: Triton for CUDA tensors, the reference for CPU tensors.
``KVATTN_BATCH_INVARIANT``
    ``1`` makes every request's output bitwise independent of its batch-mates (and of the GPU's SM
    count): decode, ``xqa``, single decode and MLA cut a request's keys into splits of a fixed
    number of tokens (so its split count is ``ceil(length / span)``) and merge them in a fixed
    order with one fixed merge, and the launch configs no longer follow the batch. Off by default
    (it costs speed where the batch is small or uneven: lab/notes/robustness.md "Batch-invariant
    mode"). :func:`kvattn.set_batch_invariant` and :func:`kvattn.batch_invariant` override it
    from Python.
``KVATTN_DEBUG``
    The checks that need device values (page ids inside the cache, ``seq_lens`` within the page
    table's capacity and ``max_seq_len``, prefill's offsets). Unset: on for CPU tensors, where
    reading a value costs no wait, and off for CUDA tensors, where it would synchronise with the
    GPU. ``1`` turns them on everywhere, ``0`` off everywhere.
``KVATTN_CALL_CACHE``
    ``0`` runs every eager call the ordinary way (validation, planning, launch binding) instead of
    replaying a recorded call of the same metadata (:mod:`kvattn.runtime.callcache`); on by default.
``KVATTN_FAST_LAUNCH``
    ``0`` launches every kernel through ``kernel[grid](...)`` instead of the compiled kernel's
    launcher (see :mod:`kvattn.runtime.fast_launch`); on by default.
``KVATTN_FUSED_MERGE``
    ``0`` merges decode's split-KV partials in a second launch (the combine kernel) instead of in
    the split kernel, whose last program of each item merges them; on by default.
``KVATTN_GLUON``
    ``0`` keeps the Triton kernel where a Gluon kernel exists for the launch (MLA decode with 16-bit
    caches on Hopper, :mod:`kvattn.ops.mla.kernels_gluon`, and paged prefill, :mod:`kvattn.ops.prefill.kernels_gluon_ws`);
    unset, on with the Triton releases those kernels were verified with on a GPU (3.6, 3.7) and off
    with others, where the Triton kernels serve; ``1`` turns them on with any release.
``KVATTN_GLUON_WS``
    ``0`` keeps the Gluon MLA kernel of :mod:`kvattn.ops.mla.kernels_gluon` where the warp-specialised one
    (:mod:`kvattn.ops.mla.kernels_gluon_ws`) would run; on by default (``KVATTN_GLUON=0`` turns both off).
``TRITON_INTERPRET``
    Triton's own switch; kvattn only reads it to know that kernels run on the CPU.

Every on/off switch takes ``1``/``0`` (or ``true``/``false``, ``yes``/``no``, ``on``/``off``, in any
case); any other value raises a ValueError naming the variable, as ``KVATTN_BACKEND=foo`` does.

The switches are read on every call (tests and users change them at run time), but cheaply: the
raw value is looked up in ``os.environ``'s own dict and its parsed meaning is memoised per raw
value, where ``os.environ.get`` of an unset name costs a microsecond (it raises and catches a
KeyError).
"""

from __future__ import annotations

import contextlib
import os

import torch

_BACKENDS = ("reference", "triton")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

# CPython keeps os.environ's content in ``_data`` under ``encodekey(name)``; os.environ[...] = ...
# and monkeypatch.setenv update it. Elsewhere, fall back to os.environ.get.
_DATA = getattr(os.environ, "_data", None)
_ENCODE = getattr(os.environ, "encodekey", None)
_MISSING = object()
_MAX_MEMO = 64  # raw values remembered per switch
_is_compiling = torch.compiler.is_compiling


def _text(raw) -> str:
    if raw is None:
        return ""
    return (os.fsdecode(raw) if isinstance(raw, bytes) else raw).strip().lower()


# Every variable a switch reads, in registration order: kvattn.runtime.callcache keys replayed calls on
# their raw values (with the Python overrides below), so no switch can be missed there.
SWITCH_NAMES: list[str] = []


def _switch(name: str, parse, func_name: str, doc: str):
    """The function ``func_name`` returning ``parse(raw value of name)`` (a str, bytes or None),
    memoised per raw value: a call costs one environment lookup and one dict lookup. A value
    ``parse`` rejects raises on every call (nothing is memoised for it)."""
    SWITCH_NAMES.append(name)
    if isinstance(_DATA, dict) and _ENCODE is not None:
        get, key = _DATA.get, _ENCODE(name)
    else:
        get, key = os.environ.get, name
    memo: dict = {}

    def value():
        # torch.compile traces the public functions, and Dynamo cannot trace os.environ's private
        # dict: it reads os.environ the ordinary way and parses afresh.
        if _is_compiling():
            return parse(os.environ.get(name))
        raw = get(key)
        hit = memo.get(raw, _MISSING)
        if hit is _MISSING:
            hit = parse(raw)
            if len(memo) >= _MAX_MEMO:
                memo.clear()
            memo[raw] = hit
        return hit

    value.__name__ = value.__qualname__ = func_name
    value.__doc__ = doc
    return value


def _parse_backend(raw) -> str | None:
    value = _text(raw)
    if not value:
        return None
    if value not in _BACKENDS:
        raise ValueError(f"KVATTN_BACKEND: expected one of {_BACKENDS}, got {value!r}")
    return value


def _parse_flag(raw, default, name: str):
    """``default`` when unset or blank, else True / False; any other value raises."""
    value = _text(raw)
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}: expected 1 or 0 (or one of {_TRUE[1:] + _FALSE[1:]}), got {_text(raw)!r}")


def _flag(name: str, default):
    return lambda raw: _parse_flag(raw, default, name)


backend_override = _switch("KVATTN_BACKEND", _parse_backend, "backend_override",
                           "The backend forced by ``KVATTN_BACKEND``, or None when unset.")
debug_checks = _switch("KVATTN_DEBUG", _flag("KVATTN_DEBUG", None), "debug_checks",
                       "``KVATTN_DEBUG`` as True / False, or None when unset (then the device-value checks run "
                       "for CPU tensors only: :func:`kvattn._inputs.debug_check_pages`).")
call_cache = _switch("KVATTN_CALL_CACHE", _flag("KVATTN_CALL_CACHE", True), "call_cache",
                     "Whether eager calls may be replayed from their metadata (``KVATTN_CALL_CACHE``, default on).")
fast_launch = _switch("KVATTN_FAST_LAUNCH", _flag("KVATTN_FAST_LAUNCH", True), "fast_launch",
                      "Whether kernels may launch through their compiled launcher (``KVATTN_FAST_LAUNCH``, default on).")
fused_merge = _switch("KVATTN_FUSED_MERGE", _flag("KVATTN_FUSED_MERGE", True), "fused_merge",
                      "Whether decode's last split program merges the partials (``KVATTN_FUSED_MERGE``, default on).")


gluon = _switch("KVATTN_GLUON", _flag("KVATTN_GLUON", None), "gluon",
                "``KVATTN_GLUON`` as True / False, or None when unset (then :func:`kvattn.runtime.versions.gluon_on` "
                "decides by the Triton release).")
gluon_ws = _switch("KVATTN_GLUON_WS", _flag("KVATTN_GLUON_WS", True), "gluon_ws",
                   "Whether MLA may take the warp-specialised Gluon kernel (``KVATTN_GLUON_WS``, default on).")
batch_invariant_env = _switch(
    "KVATTN_BATCH_INVARIANT", _flag("KVATTN_BATCH_INVARIANT", False), "batch_invariant_env",
    "Whether ``KVATTN_BATCH_INVARIANT`` asks for batch-invariant kernels (default off).")
# The Python override of KVATTN_BATCH_INVARIANT (kvattn.set_batch_invariant): None follows the
# variable. A one-item list, so that readers see a set made after their import.
_BATCH_INVARIANT = [None]


def batch_invariant() -> bool:
    """Whether the kernels run batch-invariant (:func:`kvattn.set_batch_invariant`, else
    ``KVATTN_BATCH_INVARIANT``)."""
    forced = _BATCH_INVARIANT[0]
    return batch_invariant_env() if forced is None else forced


def force_batch_invariant(enabled: bool | None) -> bool | None:
    """Set the Python override of ``KVATTN_BATCH_INVARIANT`` (None: follow the variable) and
    return the override it replaces (:mod:`kvattn.invariance`)."""
    old = _BATCH_INVARIANT[0]
    _BATCH_INVARIANT[0] = enabled
    return old


def _parse_interpret(raw) -> bool:
    # Triton's own switch, read as Triton reads it (only an "on" word is on): not kvattn's to reject.
    return _text(raw) in _TRUE


triton_interpret = _switch("TRITON_INTERPRET", _parse_interpret, "triton_interpret",
                           "Whether Triton runs its interpreter (``TRITON_INTERPRET=1``).")


@contextlib.contextmanager
def switches(**values: str):
    """Environment variables set for a ``with`` block (every switch reads its variable at each
    call), then put back as they were, unset ones unset."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
