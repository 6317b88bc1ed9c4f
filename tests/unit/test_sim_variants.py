"""`--policies wdrf:KEY=VALUE[:KEY=VALUE...]` and the other policy keys of the evaluation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controller.config import Settings
from evaluation.experiment import FS_NAME, Options, make_policy, parse_variant
from evaluation.kueue import ANY, COHORT, LOWER_PRIORITY, NEVER, SINGLE_CQ
from evaluation.wdrf import WdrfKueue

ZERO = datetime(2017, 9, 4, tzinfo=UTC)


def test_variant_values_are_parsed_like_config_values() -> None:
    got = parse_variant("wdrf:MAX_AGING_TIME=14d:FAIRNESS_POINTS=50000")
    assert got == {"max_aging_time": 14 * 86400.0, "fairness_points": 50000}


def test_variant_policy_uses_the_changed_settings() -> None:
    p, k = make_policy("wdrf:USAGE_HALF_LIFE=7d", Options(), ZERO, Settings(), {})
    assert isinstance(p, WdrfKueue)
    assert p.settings.usage_half_life == 7 * 86400.0 and p.name == "WDRF, USAGE_HALF_LIFE 7d"
    assert k.topology == SINGLE_CQ and k.within_cluster_queue == LOWER_PRIORITY


@pytest.mark.parametrize("bad", ["wdrf:NOPE=1", "wdrf:MAX_AGING_TIME", "nope"])
def test_bad_policies_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        make_policy(bad, Options(), ZERO, Settings(), {})


def test_every_policy_runs_under_the_same_kueue_settings_but_fair_sharing() -> None:
    opts = Options(preemption="lower", topology=SINGLE_CQ)
    ks = {key: make_policy(key, opts, ZERO, Settings(), {})[1]
          for key in ("fifo", "static", "afs", "drf", "wdrf")}
    first = ks["fifo"]
    assert all(k == first for k in ks.values())
    p, fs = make_policy("fs", opts, ZERO, Settings(), {})
    assert p.name == FS_NAME and fs.topology == COHORT and fs.fair_sharing
    assert fs.within_cluster_queue == LOWER_PRIORITY and fs.reclaim_within_cohort == ANY
    never = make_policy("fs", Options(preemption="never"), ZERO, Settings(), {})[1]
    assert never.within_cluster_queue == NEVER and never.reclaim_within_cohort == NEVER


def test_team_weights_reach_kueue_and_the_controller() -> None:
    p, k = make_policy("wdrf", Options(), ZERO, Settings(), {"a": 4.0, "b": 2.0})
    assert isinstance(p, WdrfKueue)
    assert dict(p.settings.team_weights) == {"a": 4.0, "b": 2.0}
    assert k.weight("a") == 4.0 and k.weight("c") == 1.0
