"""Guards are written against what can preempt by priority: a pending Workload of the admitted
one's own ClusterQueue (withinClusterQueue), or of another ClusterQueue of its cohort that
reclaims with `LowerPriority` or borrows. Reclaim with `Any` ignores priorities, so a pending
Workload that can only reclaim costs no guard write. On the real `compute_plan`."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from controller.domain import (
    GPU,
    Admission,
    ClusterQueue,
    ClusterSnapshot,
    KueueApiVersion,
    LocalQueue,
    Preemption,
    ResourceQuota,
    Workload,
)
from controller.plan import Plan
from controller.policy import compute_plan
from tests.support.builders import NOW, wl
from tests.support.builders import settings as make_settings

S = make_settings()


def cohort(reclaim: str, borrow: str, within: str = "LowerPriority") -> tuple[ClusterQueue, ...]:
    pre = Preemption(within_cluster_queue=within, reclaim_within_cohort=reclaim,
                     borrow_within_cohort=borrow)
    return tuple(ClusterQueue(f"cq-{t}", KueueApiVersion.V1BETA2,
                              quotas=(ResourceQuota("default", GPU, Decimal(4)),),
                              cohort="all", preemption=pre) for t in "ab")


def running(name: str, team: str, cq: str) -> Workload:
    """Admitted long ago with a low value (boost 0): anything newer with fairness outranks it."""
    w = wl(name, team, wait=86400, admitted=True)
    return replace(w, admission=Admission(cq, w.pod_sets[0].per_pod()))


def plan_for(queues: tuple[ClusterQueue, ...], items: list[Workload]) -> Plan:
    lqs = (LocalQueue("team-a", "default", "cq-a"), LocalQueue("team-b", "default", "cq-b"))
    return compute_plan(ClusterSnapshot(workloads=tuple(items), cluster_queues=queues,
                                        local_queues=lqs), S, NOW)


def guarded(plan: Plan) -> set[str]:
    return {d.key for d in plan.decisions if d.admitted and "state=admitted" in d.terms}


@pytest.mark.parametrize(("reclaim", "borrow", "guard"), [
    ("Any", "Never", False),  # reclaim ignores priorities: a guard would not protect
    ("LowerPriority", "Never", True),
    ("Any", "LowerPriority", True),
])
def test_a_pending_workload_of_another_queue_guards_only_what_it_reaches_by_priority(
    reclaim: str, borrow: str, guard: bool,
) -> None:
    items = [running("run", "team-a", "cq-a"), wl("p", "team-b", wait=60)]
    plan = plan_for(cohort(reclaim, borrow), items)
    p = next(d for d in plan.pending if d.key == "team-b/p")
    assert p.target_priority > 0  # it does reach the admitted Workload's value
    assert guarded(plan) == ({"team-a/run"} if guard else set())


def test_a_pending_workload_of_the_same_queue_is_guarded_against() -> None:
    items = [running("run", "team-a", "cq-a"), wl("p", "team-a", wait=60)]
    assert guarded(plan_for(cohort("Any", "Never"), items)) == {"team-a/run"}
    # ... unless that queue does not preempt within itself
    assert guarded(plan_for(cohort("Any", "Never", within="Never"), items)) == set()
