"""Pending Workloads whose fairness level moves keep the values they carry wherever the order
of their pool stays exactly the one fresh values give (`controller.policy.keep_order`): the
plan's order is the fresh one, with fewer writes - the most the order allows
(`controller.policy._most_kept`). On the real `compute_plan`."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations, pairwise

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.domain import (
    ClusterSnapshot,
    Workload,
)
from controller.plan import Plan
from controller.policy import OrderKey, PlanMemo, _most_kept, compute_plan
from tests.support.builders import (
    NOW,
    kueue_order,
    pending_writes,
    plan_without_keep_order,
    snapshot,
    wl,
    written,
)
from tests.support.builders import settings as make_settings

TEAMS = ("team-a", "team-b", "team-c")
S = make_settings()


def fresh(snap: ClusterSnapshot) -> Plan:
    return plan_without_keep_order(snap, S)


def running(team: str, n: int, tag: str) -> list[Workload]:
    return [wl(f"{tag}{i}", team, admitted=True) for i in range(n)]


usage_st = st.fixed_dictionaries({t: st.integers(0, 6) for t in TEAMS})
pending_st = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3), st.floats(0, 86400)),
                      min_size=2, max_size=14)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(usage_st, usage_st, pending_st)
def test_kept_values_leave_the_fresh_order_and_cost_no_write(
    before: dict[str, int], after: dict[str, int], spec: list[tuple[int, int, float]],
) -> None:
    """After a plan was written, usage changes (Jobs finish, others start): the new plan orders
    the pending Workloads exactly as the plan that rewrites every moved level, and each value
    that differs from that plan's is the one the Workload carries (no write)."""
    pend = [wl(f"p{i}", TEAMS[t], gpu=str(g), wait=age) for i, (t, g, age) in enumerate(spec)]
    run1 = [w for t, n in before.items() for w in running(t, n, "r")]
    snap1 = snapshot([*run1, *pend], gpus=32, teams=TEAMS)
    carried = written(snap1, compute_plan(snap1, S, NOW), boost=True)
    pend_now = [w for w in carried.workloads if not w.quota_reserved]
    run2 = [w for t, n in after.items() for w in running(t, n, "s")]
    snap2 = replace(carried, workloads=(*run2, *pend_now))
    plan, ref = compute_plan(snap2, S, NOW), fresh(snap2)
    assert kueue_order(plan) == kueue_order(ref)
    mine = {d.key: d for d in plan.pending}
    for d in ref.pending:
        if mine[d.key].target_priority != d.target_priority:
            assert d.key not in pending_writes(snap2, plan)
    assert set(pending_writes(snap2, plan)) <= set(pending_writes(snap2, ref))


def test_a_head_that_rises_further_is_not_rewritten() -> None:
    """Team A's pending Workload leads the queue; two of A's Jobs finish, so its level rises by
    more than the hysteresis: it passes nobody, so nothing is written. Team B's, which the
    finished Jobs do not move, keeps its value either way."""
    pend = [wl("a", "team-a", wait=7200), wl("b", "team-b", wait=60)]
    snap1 = snapshot([*running("team-a", 6, "r"), *running("team-b", 10, "r"), *pend],
                     gpus=16, teams=("team-a", "team-b"))
    carried = written(snap1, compute_plan(snap1, S, NOW), boost=True)
    assert kueue_order(compute_plan(carried, S, NOW))[0] == "team-a/a"
    gone = {"team-a/r0", "team-a/r1"}
    snap2 = replace(carried, workloads=tuple(w for w in carried.workloads if w.key not in gone))
    ref = fresh(snap2)
    assert pending_writes(snap2, ref) == ["team-a/a"]  # its level moved: the old rule writes it
    plan = compute_plan(snap2, S, NOW)
    assert pending_writes(snap2, plan) == []
    assert kueue_order(plan) == kueue_order(ref) == ["team-a/a", "team-b/b"]


def test_a_level_that_passes_another_workload_is_written() -> None:
    """Team B's Jobs finish and its Workload, below A's, rises past it: the order changes, so
    B's new value is written."""
    pend = [wl("a", "team-a", wait=7200), wl("b", "team-b", wait=3600)]
    snap1 = snapshot([*running("team-a", 4, "r"), *running("team-b", 10, "r"), *pend],
                     gpus=16, teams=("team-a", "team-b"))
    carried = written(snap1, compute_plan(snap1, S, NOW), boost=True)
    assert kueue_order(compute_plan(carried, S, NOW)) == ["team-a/a", "team-b/b"]
    gone = {f"team-b/r{i}" for i in range(8)}
    snap2 = replace(carried, workloads=tuple(w for w in carried.workloads if w.key not in gone))
    plan = compute_plan(snap2, S, NOW)
    assert kueue_order(plan) == ["team-b/b", "team-a/a"]
    assert pending_writes(snap2, plan) == ["team-b/b"]


def test_a_teams_workloads_that_rise_together_past_no_one_are_not_rewritten() -> None:
    """Team A's two pending Workloads lead the queue a few seconds of aging apart; A's Jobs
    finish and both rise by the same levels, each past the other's old value but together past
    no one: keeping both values keeps the order, so neither is written."""
    pend = [wl("a1", "team-a", wait=7200), wl("a2", "team-a", wait=7190),
            wl("b", "team-b", wait=60)]
    snap1 = snapshot([*running("team-a", 6, "r"), *running("team-b", 10, "r"), *pend],
                     gpus=16, teams=("team-a", "team-b"))
    carried = written(snap1, compute_plan(snap1, S, NOW), boost=True)
    gone = {"team-a/r0", "team-a/r1"}
    snap2 = replace(carried, workloads=tuple(w for w in carried.workloads if w.key not in gone))
    ref = fresh(snap2)
    assert sorted(pending_writes(snap2, ref)) == ["team-a/a1", "team-a/a2"]
    plan = compute_plan(snap2, S, NOW)
    assert pending_writes(snap2, plan) == []
    assert kueue_order(plan) == kueue_order(ref) == ["team-a/a1", "team-a/a2", "team-b/b"]


def _keys(values: list[int]) -> list[OrderKey]:
    return [(v, 0.0, "") for v in values]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=8, unique=True), st.data())
def test_most_kept_is_the_largest_set_that_keeps_the_order(
    values: list[int], data: st.DataObject,
) -> None:
    """Against every subset: the kept set leaves the keys ascending, and no larger set does."""
    fresh = sorted(values)
    n = len(fresh)
    picked = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n))
    carried = data.draw(st.lists(st.integers(-5, 70).filter(lambda v: v not in values),
                                 min_size=len(picked), max_size=len(picked), unique=True))
    now = dict(zip(picked, carried, strict=True))

    def ascending(kept: set[int]) -> bool:
        f = [now[i] if i in kept else fresh[i] for i in range(n)]
        return all(a < b for a, b in pairwise(f))

    kept = _most_kept(_keys(fresh), {i: (v, 0.0, "") for i, v in now.items()})
    assert kept <= set(now) and ascending(kept)
    most = max(len(c) for r in range(len(now) + 1) for c in combinations(sorted(now), r)
               if ascending(set(c)))
    assert len(kept) == most


def test_a_memoised_team_keeps_no_level_the_order_no_longer_allows() -> None:
    """Team A's head keeps its value (its team's Jobs finished, it passes nobody); then a
    Workload of another team arrives between that value and the fresh one: A's head is written
    after all, though its team's scoring comes from the memo (a kept value is a copy: the
    memo's scoring stays the fresh one)."""
    pend = [wl("a", "team-a", wait=7200), wl("b", "team-b", wait=60)]
    teams = ("team-a", "team-b", "team-c")
    snap1 = snapshot([*running("team-a", 6, "r"), *running("team-b", 10, "r"), *pend],
                     gpus=16, teams=teams)
    carried = written(snap1, compute_plan(snap1, S, NOW), boost=True)
    gone = {"team-a/r0", "team-a/r1"}
    snap2 = replace(carried, workloads=tuple(w for w in carried.workloads if w.key not in gone))
    rewritten = []
    for team in ("team-b", "team-c"):
        for wait in range(0, 86400, 1800):
            memo = PlanMemo()
            assert pending_writes(snap2, compute_plan(snap2, S, NOW, memo=memo)) == []
            snap3 = replace(snap2, workloads=(*snap2.workloads, wl("c", team, wait=wait)))
            plan = compute_plan(snap3, S, NOW, memo=memo)
            assert plan == compute_plan(snap3, S, NOW), (team, wait)
            rewritten.append("team-a/a" in pending_writes(snap3, plan))
    assert any(rewritten)  # some newcomers land between A's kept and fresh values
