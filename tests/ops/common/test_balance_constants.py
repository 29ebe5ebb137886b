"""The balanced split's unit cap is written twice (host and kernel): they must agree."""

import inspect

import pytest

from kvattn.ops.common import balance


def test_the_kernels_unit_cap_is_the_hosts():
    source = inspect.getsource(balance._unit_counts.fn)
    assert f"UNITS_MANY: tl.constexpr = {balance.MAX_UNITS}" in source
    assert f"UNITS_FEW: tl.constexpr = {balance.MIN_UNITS}" in source
    assert f"CAP_ROUNDS: tl.constexpr = {balance.UNIT_CAP_ROUNDS}" in source
    assert "UNITS_MAX: tl.constexpr = UNITS_MANY if MERGE_BLOCK_S * CAP_ROUNDS >= UNITS_MANY else UNITS_FEW" in source


def test_the_lanes_fixed_cost_is_the_hosts():
    """_lane_costs spells LANE_FIXED_KEYS again as a local constexpr (what every Triton's
    interpreter takes): the same number."""
    assert f"max(1, {balance.LANE_FIXED_KEYS} // BLOCK_N)" in inspect.getsource(balance._lane_costs.fn)


@pytest.mark.parametrize("merge_block_s,cap", [(1, 16), (2, 16), (4, 32), (8, 32), (16, 32)],
                         ids=lambda v: str(v))
def test_the_unit_cap_bounds_the_merge_rounds(merge_block_s, cap):
    """The cap is 32 units where the merge loads 4+ partials a round (8 rounds at most), else 16."""
    assert balance.unit_cap(merge_block_s) == cap
    assert -(-cap // merge_block_s) <= 16
