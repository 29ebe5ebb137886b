"""Batch-invariant mode: a request's output bitwise independent of its batch-mates.

By default the decode kernels split a request's keys into as many parts as fill the GPU, so the
number of parts -- and with it the rounding of the merge -- follows the batch size, the other
requests' lengths and the SM count: request 0 of a 64-request batch differs from the same request
decoded alone by a few units in the last place. Reinforcement learning and evaluation need the
same bits whatever the batch (vLLM's batch-invariant mode rejects backends that cannot give them).

Under this mode decode, ``xqa``, single decode and MLA cut every request's keys into splits of a
fixed number of tokens (``ceil(length / span)`` splits), always merge them with one merge kernel in
split order, and choose their launch configs without looking at the batch; prefill never splits
the keys and picks its configs by shape only, so it is batch-invariant in either mode. The cost is
speed where a batch is small or its lengths uneven (lab/notes/robustness.md "Batch-invariant mode").

>>> import kvattn
>>> with kvattn.batch_invariant():
...     kvattn.is_batch_invariant()
True
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from .runtime import env as _env


def set_batch_invariant(enabled: Optional[bool]) -> None:
    """Turn the batch-invariant mode on (True) or off (False) for every later call, whatever
    ``KVATTN_BATCH_INVARIANT`` says; None goes back to following the variable.

    Parameters
    ----------
    enabled : bool or None

    Examples
    --------
    >>> import kvattn
    >>> kvattn.set_batch_invariant(True)
    >>> kvattn.is_batch_invariant()
    True
    >>> kvattn.set_batch_invariant(None)  # follow KVATTN_BATCH_INVARIANT again
    """
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected a bool or None, got {type(enabled).__name__}")
    _env.force_batch_invariant(enabled)


def is_batch_invariant() -> bool:
    """Whether calls run in batch-invariant mode now (:func:`set_batch_invariant`, else the
    ``KVATTN_BATCH_INVARIANT`` variable, default off).

    Examples
    --------
    >>> import kvattn
    >>> isinstance(kvattn.is_batch_invariant(), bool)
    True
    """
    return _env.batch_invariant()


@contextlib.contextmanager
def batch_invariant(enabled: bool = True) -> Iterator[None]:
    """A ``with`` block in (or, with ``enabled=False``, out of) batch-invariant mode; the mode of
    before comes back at its end.

    Parameters
    ----------
    enabled : bool

    Examples
    --------
    >>> import kvattn
    >>> with kvattn.batch_invariant():
    ...     assert kvattn.is_batch_invariant()
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected a bool, got {type(enabled).__name__}")
    old = _env.force_batch_invariant(enabled)
    try:
        yield
    finally:
        _env.force_batch_invariant(old)


__all__ = ["set_batch_invariant", "is_batch_invariant", "batch_invariant"]
