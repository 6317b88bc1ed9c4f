"""Metric definitions (fairness-anchors.md): Jain's index, water-filling, quantiles."""

from __future__ import annotations

import math

import pytest

from controller.sim.metrics import demand_capped_jain, jain, quantile, quantiles, water_fill


def test_jain_equal_shares_is_one() -> None:
    assert jain([0.25, 0.25, 0.25, 0.25]) == pytest.approx(1.0)


def test_jain_one_team_has_everything_is_one_over_n() -> None:
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_jain_textbook_example() -> None:
    # (1 + 2)^2 / (2 * (1 + 4)) = 0.9
    assert jain([1.0, 2.0]) == pytest.approx(0.9)
    assert jain([1.0, 1.0, 2.0]) == pytest.approx(16 / 18)


def test_jain_empty_and_zero() -> None:
    assert jain([]) == 1.0
    assert jain([0.0, 0.0]) == 1.0


def test_water_fill_caps_by_demand_and_weight() -> None:
    assert water_fill(10, [2, 10, 10], [1, 1, 1]) == pytest.approx([2, 4, 4])
    assert water_fill(9, [10, 10], [2, 1]) == pytest.approx([6, 3])
    assert water_fill(100, [1, 2], [1, 1]) == pytest.approx([1, 2])  # everyone satisfied
    assert water_fill(5, [0, 10], [1, 1]) == pytest.approx([0, 5])


def test_demand_capped_jain() -> None:
    # A team that asked for little and got it is not "under-served".
    assert demand_capped_jain([1, 4.5, 4.5], [1, 10, 10], [1, 1, 1]) == pytest.approx(1.0)
    # Same total, split unfairly between two equally hungry teams.
    j = demand_capped_jain([1, 8, 1], [1, 10, 10], [1, 1, 1])
    fair = [1, 4.5, 4.5]
    xs = [a / f for a, f in zip([1, 8, 1], fair, strict=True)]
    assert j == pytest.approx(jain(xs))
    assert j < 0.9
    # Weights: a team of weight 2 getting twice as much is fair.
    assert demand_capped_jain([6, 3], [10, 10], [2, 1]) == pytest.approx(1.0)
    # Teams without demand are ignored; one team alone is trivially fair.
    assert demand_capped_jain([5, 0], [10, 0], [1, 1]) == 1.0


def test_quantiles_linear_interpolation() -> None:
    v = [0.0, 10.0, 20.0, 30.0, 40.0]
    assert quantile(v, 0.5) == 20.0
    assert quantile(v, 0.95) == pytest.approx(38.0)
    assert quantile([], 0.5) != quantile([], 0.5)  # NaN
    q = quantiles([5.0, 1.0, 3.0])
    assert (q.n, q.p50, q.max, q.mean) == (3, 3.0, 5.0, 3.0)
    assert math.isnan(quantiles([]).p99)
