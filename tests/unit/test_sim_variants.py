"""`--policies wdrf:KEY=VALUE[:KEY=VALUE...]`: WDRF variants with config keys changed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controller.config import ConfigError, Settings
from controller.sim.experiment import PREVIOUS_DEFAULTS, Options, make_policies, parse_variant
from controller.sim.policies import Wdrf

ZERO = datetime(2017, 9, 4, tzinfo=UTC)


def test_variant_values_are_parsed_like_config_values() -> None:
    got = parse_variant("wdrf:AGING_COEFFICIENT=0.25:MAX_AGING_TIME=14d:FAIRNESS_POINTS=50000")
    assert got == {"aging_coefficient": 0.25, "max_aging_time": 14 * 86400.0,
                   "fairness_points": 50000}


def test_variant_policy_uses_the_changed_settings() -> None:
    (p,) = make_policies(Options(policies=("wdrf:AGING_COEFFICIENT=0.5",)), ZERO, Settings())
    assert isinstance(p, Wdrf)
    assert p.settings.aging_coefficient == 0.5 and p.name == "WDRF, AGING_COEFFICIENT 0.5"


def test_previous_defaults_variant() -> None:
    (p,) = make_policies(Options(policies=("wdrf-previous",)), ZERO, Settings())
    assert isinstance(p, Wdrf)
    assert p.settings.fairness_points == PREVIOUS_DEFAULTS["fairness_points"]
    assert p.settings.overtake_window() == 269750 + 300


@pytest.mark.parametrize("bad", ["wdrf:NOPE=1", "wdrf:AGING_COEFFICIENT", "wdrf:AGING_STEP=x"])
def test_bad_variants_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_variant(bad)


def test_variant_that_breaks_a_guard_is_rejected() -> None:
    with pytest.raises(ConfigError):
        make_policies(Options(policies=("wdrf:FAIRNESS_POINTS=500000",)), ZERO, Settings())
