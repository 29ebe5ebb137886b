"""Peers that cannot run a shape here: reported "not available" (``n/a``) with the reason, never as
an error, and the run goes on. torch's "no available kernel" (an SDPA backend that refuses the
inputs) is turned into :class:`NotAvailable` with the reasons torch gives in its warnings."""

from __future__ import annotations

import warnings
from typing import Callable, ContextManager

# How torch words a backend's refusal (RuntimeError texts of scaled_dot_product_attention).
REFUSALS = ("No available kernel", "No viable backend", "not supported")


class NotAvailable(Exception):
    """A peer that cannot run this shape here (reported as "not available", not as an error)."""


def clip(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def try_backend(fn: Callable[[], object], context: Callable[[], ContextManager]) -> None:
    """One call of ``fn`` under ``context``; torch's "no available kernel" becomes NotAvailable, with
    the reasons torch gives in its warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with context():
                fn()
        except RuntimeError as exc:
            if any(m in str(exc) for m in REFUSALS):
                # torch says why in warnings: "<backend> kernel not used because:" then the reasons.
                reasons = [str(w.message).split("(Triggered internally")[0].strip() for w in caught]
                reasons = [r for r in reasons if r and not r.endswith("because:")]
                raise NotAvailable(clip("; ".join(reasons) if reasons else "no kernel of this backend here")) from None
            raise
