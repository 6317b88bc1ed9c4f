"""A pending Workload that Kueue has evicted another for is its ClusterQueue's sticky head
(BestEffortFIFO): Kueue admits it as soon as its victim's quota frees, with the value it
carries then. No other pending Workload of its team and class (nor, behind a normal head,
approved work of its team) in that ClusterQueue is written above that value: raised past it,
it would preempt the head the moment it is admitted
(`withinClusterQueue: LowerPriority`) - a swap inside one team. The case found on the real
plane: two Workloads of one team created in the same second, both still at Kueue's default
value, Kueue preempting for the one whose UID sorts later (it arrived first); the plan put the
other first in the team's order and gave it the higher fairness level. On the real
`compute_plan`."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.domain import (
    APPROVED_ANNOTATION,
    GPU,
    URGENT_ANNOTATION,
    ClusterQueue,
    ClusterSnapshot,
    KueueApiVersion,
    Preemption,
    ResourceQuota,
    Workload,
)
from controller.plan import Plan, WorkloadDecision
from controller.policy import compute_plan
from tests.support.builders import NOW, carried, snapshot, wl, written
from tests.support.builders import settings as make_settings

S = make_settings()


def queue(within: str = "LowerPriority", strategy: str = "BestEffortFIFO") -> ClusterQueue:
    return ClusterQueue("cq", KueueApiVersion.V1BETA2,
                        quotas=(ResourceQuota("default", GPU, Decimal(4)),),
                        queueing_strategy=strategy,
                        preemption=Preemption(within_cluster_queue=within))


def victim_of(preemptor: Workload | None) -> Workload:
    """Team b's admitted Workload that Kueue evicted for `preemptor` 5 s ago (its pods are
    stopping)."""
    w = wl("h-victim", "team-b", wait=600, admitted=True)
    return replace(w, evicted=True, preempted_for=preemptor.uid if preemptor else "",
                   preempted_at=NOW - timedelta(seconds=5),
                   last_eviction=NOW - timedelta(seconds=5))


def pending(plan: Plan) -> dict[str, WorkloadDecision]:
    return {d.key: d for d in plan.pending}


def value(d: WorkloadDecision) -> tuple[object, ...]:
    """What is written (the rank, Kueue's order of the values, may move)."""
    return d.target_priority, d.target_boost, d.terms, d.breakdown


def the_case(head: str, others: list[str], head_written: bool,
             cq: ClusterQueue) -> tuple[ClusterSnapshot, ClusterSnapshot, Workload]:
    """(the snapshot with Kueue preempting for `head`, the same without, the head as it is)."""
    x = wl(head, wait=30.0)
    if head_written:  # the head already carries a value of its own (written when alone)
        alone = snapshot([wl("l-run", wait=600, admitted=True), x], cq=cq)
        [x] = [w for w in written(alone, compute_plan(alone, S, NOW), boost=True).workloads
               if w.name == head]
    items = [wl("l-run", wait=600, admitted=True), wl("h-run", "team-b", wait=600,
                                                      admitted=True),
             x, *(wl(n, wait=30.0) for n in others), wl("b-wait", "team-b", wait=30.0)]
    return (snapshot([*items, victim_of(x)], cq=cq), snapshot([*items, victim_of(None)], cq=cq),
            x)


@settings(max_examples=40, deadline=None)
@given(head=st.sampled_from(["a-head", "m-head", "z-head"]),
       others=st.lists(st.sampled_from(["0-new", "b-new", "n-new", "y-new"]), min_size=1,
                       max_size=3, unique=True),
       head_written=st.booleans())
def test_no_workload_of_the_heads_team_and_class_is_written_above_it(
    head: str, others: list[str], head_written: bool,
) -> None:
    snap, unnamed, x = the_case(head, others, head_written, queue())
    got, before = pending(compute_plan(snap, S, NOW)), pending(compute_plan(unnamed, S, NOW))
    mine = got[x.key]
    cap = min(carried(x), mine.target_priority)
    for n in others:
        d = got[f"team-a/{n}"]
        assert d.target_priority <= cap, (n, d.terms, cap)
        was = before[f"team-a/{n}"]
        if was.target_priority > cap:  # held: exactly at the head's value, and says why
            assert d.target_priority == cap and d.terms.endswith(f" behind={head}"), d.terms
            assert d.breakdown is not None and d.breakdown.priority == cap
        else:  # nothing to hold: as without the preemption
            assert value(d) == value(was)
    # The head itself, and another team, keep their values.
    assert value(mine) == value(before[x.key])
    assert value(got["team-b/b-wait"]) == value(before["team-b/b-wait"])


def test_the_plane_case_holds_the_newcomer_at_the_heads_value() -> None:
    # Both at Kueue's default value, created in the same second; "a-new" sorts first by UID,
    # so without the hold it gets the team's higher fairness level and a value above the head.
    snap, unnamed, x = the_case("z-head", ["a-new"], False, queue())
    before = pending(compute_plan(unnamed, S, NOW))
    assert before["team-a/a-new"].target_priority > before[x.key].target_priority > 0
    got = pending(compute_plan(snap, S, NOW))
    assert got["team-a/a-new"].target_priority == 0  # the head carries 0 until its write lands
    # Once the head carries its value, the newcomer may rise to it, not past it.
    raised = written(snap, compute_plan(snap, S, NOW), boost=True)
    again = pending(compute_plan(raised, S, NOW))
    assert 0 < again["team-a/a-new"].target_priority <= again[x.key].target_priority


@pytest.mark.parametrize(("within", "strategy"), [
    ("Never", "BestEffortFIFO"),  # nothing preempts within the queue by priority
    ("LowerPriority", "StrictFIFO"),  # no sticky head: the higher value is admitted instead
])
def test_nothing_is_held_where_the_head_cannot_be_preempted_after_admission(
    within: str, strategy: str,
) -> None:
    snap, unnamed, _x = the_case("z-head", ["a-new"], False, queue(within, strategy))
    assert compute_plan(snap, S, NOW).decisions == compute_plan(unnamed, S, NOW).decisions


@pytest.mark.parametrize(("evicted_ago", "held"), [
    (60.0, True),  # requeued before Kueue preempted for it: still the one it preempts for
    (5.0, False),  # evicted in the victim's second or after: admitted since, name stale
    (1.0, False),
])
def test_a_name_goes_stale_once_the_head_was_admitted_and_evicted_again(
    evicted_ago: float, held: bool,
) -> None:
    snap, unnamed, x = the_case("z-head", ["a-new"], False, queue())
    again = replace(x, last_eviction=NOW - timedelta(seconds=evicted_ago))
    snap = replace(snap, workloads=tuple(again if w.key == x.key else w
                                         for w in snap.workloads))
    unnamed = replace(unnamed, workloads=tuple(again if w.key == x.key else w
                                               for w in unnamed.workloads))
    got = pending(compute_plan(snap, S, NOW))["team-a/a-new"]
    assert got.terms.endswith(" behind=z-head") is held
    if not held:
        assert value(got) == value(pending(compute_plan(unnamed, S, NOW))["team-a/a-new"])


def test_approved_work_of_the_team_is_held_at_a_normal_heads_value() -> None:
    """Kueue picked a normal Workload as its preemptor while an approved one of its team still
    carried Kueue's default value (neither first value written yet). Raised into the approved
    band, the approved one would preempt the head the moment Kueue admits it, before its guard
    could land (approved may not preempt normal work). It is held at the head's value instead;
    urgent work, which may preempt normal work, and another team's approved work are not. The
    case seen on the plane: test_live_preemption's approved-over-normal check."""
    approved, urgent = {APPROVED_ANNOTATION: "true"}, {URGENT_ANNOTATION: "true"}
    x = wl("n-head", wait=30.0)
    items = [wl("l-run", wait=600, admitted=True),
             wl("h-run", "team-b", wait=600, admitted=True), x,
             wl("a-appr", wait=31.0, annotations=approved),
             wl("u-urgent", wait=29.0, annotations=urgent),
             wl("b-appr", "team-b", wait=31.0, annotations=approved)]
    snap = snapshot([*items, victim_of(x)], cq=queue())
    unnamed = snapshot([*items, victim_of(None)], cq=queue())
    got, before = pending(compute_plan(snap, S, NOW)), pending(compute_plan(unnamed, S, NOW))
    assert before["team-a/a-appr"].target_priority > before[x.key].target_priority
    held = got["team-a/a-appr"]
    assert held.target_priority == carried(x) == 0  # the head carries 0 until its write lands
    assert held.terms.endswith(" behind=n-head"), held.terms
    for key in (x.key, "team-a/u-urgent", "team-b/b-appr"):
        assert value(got[key]) == value(before[key]), key
    # Once the head carries its value, the approved one may rise to it, not past it.
    raised = pending(compute_plan(written(snap, compute_plan(snap, S, NOW), boost=True), S, NOW))
    assert 0 < raised["team-a/a-appr"].target_priority <= raised[x.key].target_priority
