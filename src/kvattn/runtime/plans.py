"""Launch plans cached per host facts, and the ``with``-block overrides of config tables (tuning,
tests) that bypass the cache."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

MAX_PLANS = 1024  # distinct call shapes a launcher keeps plans for; past this its cache starts over


def cached_plan(plans: dict, facts: tuple, build: Callable[[tuple], object], overridden: bool):
    """``plans[facts]``, built by ``build(facts)`` on a miss; plans made while a tuning override
    is active (``overridden``) are not kept, since they depend on more than the facts."""
    if overridden:
        return build(facts)
    plan = plans.get(facts)
    if plan is None:
        if len(plans) >= MAX_PLANS:
            plans.clear()
        plan = plans[facts] = build(facts)
    return plan


def config_override(state: dict, cache_clear: Callable[[], None]):
    """A ``with``-block override of a config table's fields: ``override(**fields)`` updates
    ``state`` (the family's module-level override dict) for the block, clearing the family's
    config cache on entry and exit."""

    @contextlib.contextmanager
    def override(**fields) -> Iterator[None]:
        from .callcache import suspend  # recorded calls hold the plans of the table as it was

        old = dict(state)
        state.update(fields)
        cache_clear()
        suspend(1)
        try:
            yield
        finally:
            state.clear()
            state.update(old)
            cache_clear()
            suspend(-1)

    return override
