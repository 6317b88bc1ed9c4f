"""`--policies wdrf:KEY=VALUE[:KEY=VALUE...]` and the other policy keys of the evaluation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from controller.config import Settings
from evaluation.experiment import (
    FS_NAME,
    WDRF_FS_NAME,
    Options,
    make_policy,
    parse_variant,
    run_all,
    split_key,
    weights_tag,
)
from evaluation.kueue import ANY, COHORT, LOWER_PRIORITY, NEVER, SINGLE_CQ
from evaluation.policies import DrfClasses
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


@pytest.mark.parametrize(("key", "on"), [
    ("wdrf", False), ("wdrf:USAGE_HALF_LIFE=7d", False), ("wdrf-fs", True),
    ("wdrf-fs@4/2/1", True), ("wdrf-fs:USAGE_HALF_LIFE=7d", True),
    ("wdrf-fs:KUEUE_FAIR_SHARING=false", False),
])
def test_the_controller_is_told_where_kueue_runs_fair_sharing(key: str, on: bool) -> None:
    weights = {"a": 4.0, "b": 2.0, "c": 1.0} if "@" in key else {}
    p, k = make_policy(key, Options(), ZERO, Settings(), weights)
    assert isinstance(p, WdrfKueue)
    assert p.settings.kueue_fair_sharing is on
    assert k.fair_sharing is key.startswith("wdrf-fs")


def test_team_weights_reach_kueue_and_the_controller() -> None:
    p, k = make_policy("wdrf", Options(), ZERO, Settings(), {"a": 4.0, "b": 2.0})
    assert isinstance(p, WdrfKueue)
    assert dict(p.settings.team_weights) == {"a": 4.0, "b": 2.0}
    assert k.weight("a") == 4.0 and k.weight("c") == 1.0


def test_a_row_with_its_own_team_weights() -> None:
    w = {"a": 4.0, "b": 2.0}
    p, k = make_policy("wdrf-fs@4/2/1", Options(), ZERO, Settings(), w)
    assert isinstance(p, WdrfKueue) and p.name == f"{WDRF_FS_NAME}, weights 4/2/1"
    assert k.topology == COHORT and k.weight("a") == 4.0
    assert dict(p.settings.team_weights) == w
    assert split_key("fs@4/2/1") == ("fs", "4,2,1") and split_key("wdrf") == ("wdrf", "")
    assert weights_tag(p.name) == ", weights 4/2/1" and weights_tag(FS_NAME) == ""
    d, _ = make_policy("drf-classes@2/1", Options(), ZERO, Settings(), {"a": 2.0})
    assert isinstance(d, DrfClasses) and d.weights == {"a": 2.0}


def test_rows_with_and_without_their_own_weights_in_one_run() -> None:
    opts = Options(trace=None, generated_jobs=200, days=1, held_out=1, seeds=1,
                   policies=("fs", "fs@4/2/1"))
    _, records, _ = run_all(opts)
    held = {r.key: r for r in records if r.window.role == "held-out"}
    assert set(held["fs"].weights) == {1.0}
    assert sorted(held["fs@4/2/1"].weights, reverse=True)[:3] == [4.0, 2.0, 1.0]
    assert held["fs@4/2/1"].policy == f"{FS_NAME}, weights 4/2/1"


def test_quick_runs_the_tuning_seeds_on_the_tuning_window_only() -> None:
    opts = Options(trace=None, generated_jobs=200, days=1, quick=True, tuning_seeds=2,
                   policies=("fifo",))
    windows, records, _ = run_all(opts)
    assert [w.role for w in windows] == ["tuning"]
    assert sorted(r.seed for r in records) == [1, 2]
    none_held = Options(trace=None, generated_jobs=200, days=1, held_out=0, tuning_seeds=3,
                        policies=("fifo",))
    windows, records, _ = run_all(none_held)
    assert [w.role for w in windows] == ["tuning"] and len(records) == 3


def test_reclaim_and_approval_scope_settings_reach_the_controller() -> None:
    key = ("wdrf:RECLAIM_ENABLED=true:RECLAIM_MARGIN=0.3:MIN_RUNTIME=45m"
           ":RECLAIM_BUDGET_PER_HOUR=5:APPROVED_SCOPE=team")
    p, k = make_policy(key, Options(), ZERO, Settings(), {})
    assert isinstance(p, WdrfKueue)
    s = p.settings
    assert (s.reclaim_enabled, s.reclaim_margin, s.min_runtime, s.reclaim_budget_per_hour) == (
        True, 0.3, 2700.0, 5)
    assert s.team_scoped_approval() and not p.aggregate_admitted
    # one shared ClusterQueue that preempts within itself by priority: what reclaim needs
    assert k.topology == SINGLE_CQ and k.within_cluster_queue == LOWER_PRIORITY
    q, _ = make_policy("wdrf-fs:APPROVED_SCOPE=team@4/2/1", Options(), ZERO, Settings(), {})
    assert q.name == f"{WDRF_FS_NAME}, APPROVED_SCOPE team, weights 4/2/1"
