"""With KUEUE_FAIR_SHARING, pending Workloads whose fairness level moves keep the values they
carry wherever each ClusterQueue's own order stays exactly the one fresh values give
(`controller.policy.keep_order`): across the per-team ClusterQueues of a cohort Kueue orders by
share, so a team's level change in its own ClusterQueue costs no write. On the real
`compute_plan`, with per-team ClusterQueues in one cohort."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.config import Settings
from controller.domain import (
    GPU,
    Admission,
    ClusterQueue,
    ClusterSnapshot,
    KueueApiVersion,
    LocalQueue,
    ResourceQuota,
    Workload,
)
from controller.plan import Plan
from controller.policy import compute_plan
from tests.support.builders import (
    NOW,
    kueue_key,
    kueue_order,
    pending_writes,
    plan_without_keep_order,
    snapshot,
    wl,
    written,
)
from tests.support.builders import settings as make_settings

TEAMS = ("team-a", "team-b", "team-c")
ON = make_settings(kueue_fair_sharing=True)
OFF = make_settings()


def cq_of(team: str) -> str:
    return f"cq-{team}"


def per_team(workloads: list[Workload], teams: tuple[str, ...] = TEAMS) -> ClusterSnapshot:
    """One ClusterQueue per team (8 GPUs each), all in one cohort: one pool."""
    queues = tuple(ClusterQueue(cq_of(t), KueueApiVersion.V1BETA2,
                                quotas=(ResourceQuota("default", GPU, Decimal(8)),),
                                cohort="all", fair_sharing_weight=Decimal(1)) for t in teams)
    return ClusterSnapshot(
        workloads=tuple(workloads), cluster_queues=queues,
        local_queues=tuple(LocalQueue(t, "default", cq_of(t)) for t in teams))


def fresh(snap: ClusterSnapshot, s: Settings) -> Plan:
    return plan_without_keep_order(snap, s)


def orders(plan: Plan) -> dict[str | None, list[str]]:
    """Kueue's order (priority, queue time, UID) of each ClusterQueue's pending Workloads."""
    out: dict[str | None, list[str]] = {}
    for d in sorted(plan.pending, key=kueue_key):
        out.setdefault(d.cluster_queue, []).append(d.key)
    return out


def running(team: str, n: int, tag: str) -> list[Workload]:
    out = []
    for i in range(n):
        w = wl(f"{tag}{i}", team, admitted=True)
        out.append(replace(w, admission=Admission(cq_of(team), w.pod_sets[0].per_pod())))
    return out


usage_st = st.fixed_dictionaries({t: st.integers(0, 8) for t in TEAMS})
pending_st = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3), st.floats(0, 86400)),
                      min_size=2, max_size=14)


def pending(spec: list[tuple[int, int, float]]) -> list[Workload]:
    return [wl(f"p{i}", TEAMS[t], gpu=str(g), wait=age) for i, (t, g, age) in enumerate(spec)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(usage_st, usage_st, pending_st)
def test_each_cluster_queues_order_is_the_fresh_one_and_kept_values_cost_no_write(
    before: dict[str, int], after: dict[str, int], spec: list[tuple[int, int, float]],
) -> None:
    """After a plan was written, usage changes: each ClusterQueue's pending order is exactly
    the one of the plan that rewrites every moved level, each value that differs from that
    plan's is the one the Workload carries (no write), and nothing is written that the
    fresh plan would not write."""
    run1 = [w for t, n in before.items() for w in running(t, n, "r")]
    snap1 = per_team([*run1, *pending(spec)])
    carried = written(snap1, compute_plan(snap1, ON, NOW), boost=True)
    pend_now = [w for w in carried.workloads if not w.quota_reserved]
    run2 = [w for t, n in after.items() for w in running(t, n, "s")]
    snap2 = replace(carried, workloads=(*run2, *pend_now))
    plan, ref = compute_plan(snap2, ON, NOW), fresh(snap2, ON)
    assert orders(plan) == orders(ref)
    mine = {d.key: d for d in plan.pending}
    wrote = pending_writes(snap2, plan)
    for d in ref.pending:
        if mine[d.key].target_priority != d.target_priority:
            assert d.key not in wrote
    assert set(wrote) <= set(pending_writes(snap2, ref))


def two_teams() -> tuple[ClusterSnapshot, ClusterSnapshot]:
    """Team A's Workload leads the pool, team B's follows; then most of B's Jobs finish, so
    B's level rises past A's value: the pool's order changes, B's ClusterQueue's does not."""
    teams = ("team-a", "team-b")
    pend = [wl("a", "team-a", wait=7200), wl("b", "team-b", wait=3600)]
    snap1 = per_team([*running("team-a", 4, "r"), *running("team-b", 8, "r"), *pend], teams)
    carried = written(snap1, compute_plan(snap1, ON, NOW), boost=True)
    gone = {f"team-b/r{i}" for i in range(7)}
    return carried, replace(carried, workloads=tuple(
        w for w in carried.workloads if w.key not in gone))


def test_a_level_change_in_its_own_cluster_queue_writes_nothing() -> None:
    """B's rise passes A's value in the pool but no one in B's ClusterQueue: with the setting
    on nothing is written; off (the pool's order kept exact), B's new value is."""
    carried, snap2 = two_teams()
    assert kueue_order(compute_plan(carried, ON, NOW)) == ["team-a/a", "team-b/b"]
    ref = fresh(snap2, ON)
    assert kueue_order(ref) == ["team-b/b", "team-a/a"]  # its level moved past A's value
    assert pending_writes(snap2, ref) == ["team-b/b"]
    plan = compute_plan(snap2, ON, NOW)
    assert pending_writes(snap2, plan) == []
    assert orders(plan) == orders(ref) == {"cq-team-a": ["team-a/a"],
                                           "cq-team-b": ["team-b/b"]}
    assert pending_writes(snap2, compute_plan(snap2, OFF, NOW)) == ["team-b/b"]


def test_in_one_shared_cluster_queue_a_level_that_passes_another_team_is_written() -> None:
    """Teams sharing one ClusterQueue are ordered by priority whatever the setting: B's rise
    past A's Workload is written with it on too."""
    pend = [wl("a", "team-a", wait=7200), wl("b", "team-b", wait=3600)]
    shared = [*(wl(f"r{i}", "team-a", admitted=True) for i in range(4)),
              *(wl(f"r{i}", "team-b", admitted=True) for i in range(10))]
    snap1 = snapshot([*shared, *pend], gpus=16, teams=("team-a", "team-b"))
    carried = written(snap1, compute_plan(snap1, ON, NOW), boost=True)
    assert kueue_order(compute_plan(carried, ON, NOW)) == ["team-a/a", "team-b/b"]
    gone = {f"team-b/r{i}" for i in range(8)}
    snap2 = replace(carried, workloads=tuple(w for w in carried.workloads if w.key not in gone))
    plan = compute_plan(snap2, ON, NOW)
    assert kueue_order(plan) == ["team-b/b", "team-a/a"]
    assert pending_writes(snap2, plan) == ["team-b/b"]
