"""Usage over entitlement per (pool, team) (`TeamShare.usage_over_entitlement`, set by the policy
with the W it uses for fairness levels; the metric wdrf_team_usage_over_entitlement):
hand-computed values for unequal TEAM_WEIGHTS, who counts in W, and agreement with the fairness
levels the policy itself computed."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from controller.accounting import active_weights, fairness_level
from controller.config import Settings
from controller.domain import GPU, ClusterSnapshot, TeamSource, frozen_resources
from controller.live.metrics import OTHER_TEAM, Metrics
from controller.plan import TeamShare
from controller.policy import compute_plan
from controller.usage import UsageHistory
from tests.support.builders import NOW, job, snapshot, wl
from tests.support.builders import settings as make_settings

POOL = "cq/cq"  # the builders' ClusterQueue has no cohort


def check_against_levels(snap: ClusterSnapshot, s: Settings,
                         history: UsageHistory | None = None) -> dict[tuple[str, str], float]:
    """U/S of the plan, after checking that it reproduces every fairness level the policy set
    (a fresh plan: no previous levels, so no hysteresis): level = floor(2^(-U/S) x levels)."""
    plan = compute_plan(snap, s, NOW, history)
    for (pool, team), ts in plan.pool_shares.items():
        assert ts.level == fairness_level(ts.usage_over_entitlement, 1.0, s), (pool, team)
    return {pt: ts.usage_over_entitlement for pt, ts in plan.pool_shares.items()}


def test_unequal_weights_by_hand() -> None:
    """8 GPUs; team-a (weight 3) holds 2, team-b (weight 1) holds 1, team-c (weight 1) only
    waits. W = 5. team-a: 2/8 of the pool over an entitlement of 3/5 = 0.4167; team-b: 1/8 over
    1/5 = 0.625; team-c: 0."""
    s = make_settings(team_weights=MappingProxyType({"team-a": 3.0}))
    snap = snapshot([wl("a1", admitted=True), wl("a2", admitted=True),
                     wl("b1", "team-b", admitted=True), wl("c1", "team-c"),
                     wl("a3"), wl("b2", "team-b")])
    got = check_against_levels(snap, s)
    assert got == {(POOL, "team-a"): pytest.approx(2 / 8 / (3 / 5)),
                   (POOL, "team-b"): pytest.approx(1 / 8 / (1 / 5)),
                   (POOL, "team-c"): 0.0}
    # what the dashboard computed before (weighted share x number of teams) is wrong here
    plan = compute_plan(snap, s, NOW)
    assert plan.pool_shares[(POOL, "team-a")].dominant_share * 3 == pytest.approx(0.25)


def test_a_team_present_with_no_weighted_usage_counts_in_w() -> None:
    """team-b's admitted Workload uses only memory, which RESOURCE_WEIGHTS does not weigh: its
    share is 0 but it is present, so W = 2 and team-a's 4 of 8 GPUs are exactly its 1/2."""
    s = make_settings(resource_weights=MappingProxyType({GPU: 1.0}))
    snap = snapshot([wl("a1", admitted=True, gpu="4"),
                     wl("b1", "team-b", admitted=True, gpu=None, resources={"memory": "1"})])
    got = check_against_levels(snap, s)
    assert got == {(POOL, "team-a"): pytest.approx(1.0), (POOL, "team-b"): 0.0}


def test_history_only_team_counts_while_its_share_is_above_the_cutoff() -> None:
    """With usage history, a team with no Workload left counts in W while its decayed share is
    above ACTIVE_USAGE_CUTOFF."""
    s = make_settings(usage_half_life=3600.0)
    snap = snapshot([wl("a1", admitted=True, gpu="2")])
    for decayed, counted in ((1.0, True), (0.001, False)):
        history = UsageHistory(MappingProxyType({f"{POOL}|team-b": MappingProxyType(
            {GPU: decayed})}), NOW)
        got = check_against_levels(snap, s, history)
        w = 2 if counted else 1
        assert got[(POOL, "team-a")] == pytest.approx(2 / 8 * w), decayed
        assert got[(POOL, "team-b")] == pytest.approx(decayed / 8 * w), decayed


def test_active_weights_rule() -> None:
    s = make_settings(team_weights=MappingProxyType({"x": 2.0, "y": 5.0, "z": 7.0}),
                      active_usage_cutoff=0.01)

    def share(team: str, ds: float) -> TeamShare:
        return TeamShare(team, frozen_resources({}), frozen_resources({}), MappingProxyType({}),
                         None, ds, POOL)

    shares = {(POOL, "x"): share("x", 0.0), (POOL, "y"): share("y", 0.02),
              (POOL, "z"): share("z", 0.005)}
    assert active_weights(shares, {(POOL, "x")}, s) == {POOL: 2.0 + 5.0}


def test_label_teams_are_read_from_the_owner_job() -> None:
    s = make_settings(team_source=TeamSource.LABEL)
    snap = replace(snapshot([wl("a1", admitted=True, owner="j1"), wl("a2", owner="j2")]),
                   jobs=(replace(job("j1"), labels={"wdrf.x-k8s.io/team": "vision"}),
                         replace(job("j2"), labels={"wdrf.x-k8s.io/team": "speech"})))
    assert set(compute_plan(snap, s, NOW).pool_shares) == {(POOL, "vision"), (POOL, "speech")}
    got = check_against_levels(snap, s)
    assert got == {(POOL, "vision"): pytest.approx(1 / 8 * 2), (POOL, "speech"): 0.0}


def test_metric_series_are_bounded_per_team() -> None:
    m = Metrics()
    m.team_series_limit = 3
    m.known_teams = frozenset({"small"})
    values = {("cq/a", "small"): 0.1, ("cq/a", "big"): 3.0, ("cq/b", "big"): 1.0,
              ("cq/a", "mid"): 2.0, ("cq/b", "tiny"): 0.5, ("cq/a", "tiny2"): 0.2}
    m.set_pool_teams(m.usage_over_entitlement, values)
    got = {(s.labels["team"], s.labels["pool"]): s.value
           for fam in m.registry.collect() if fam.name == "wdrf_team_usage_over_entitlement"
           for s in fam.samples}
    assert got == {("small", "cq/a"): 0.1, ("big", "cq/a"): 3.0, ("big", "cq/b"): 1.0,
                   (OTHER_TEAM, "cq/a"): 2.0, (OTHER_TEAM, "cq/b"): 0.5}
    m.set_pool_teams(m.usage_over_entitlement, {("cq/a", "small"): 0.3})  # stale series go
    assert [s.labels for fam in m.registry.collect()
            if fam.name == "wdrf_team_usage_over_entitlement" for s in fam.samples] == [
        {"team": "small", "pool": "cq/a"}]
