"""The balanced split's unit cap is written twice (host and kernel): they must agree."""

import inspect

from kvattn.ops.common import balance


def test_the_kernels_unit_cap_is_the_hosts():
    source = inspect.getsource(balance._unit_counts.fn)
    assert f"UNITS_MAX: tl.constexpr = {balance.MAX_UNITS}" in source
