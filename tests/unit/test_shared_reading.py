"""Workloads of one shape share what is read of them within one plan (`policy._Demands`: the
resource checks, GPU summary and demand of one pod set of one container; `classify`'s defaults;
`decide_hami`'s decision by the rules that match): a plan equals the one in which every
Workload is read on its own, whatever single field two Workloads differ in."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from controller import hami, policy
from controller.config import HamiRule, Settings
from controller.domain import (
    APPROVED_ANNOTATION,
    CPU,
    GPU,
    GPUCORES,
    GPUMEM,
    GPUMEM_PERCENTAGE,
    HAMI_NODE_POLICY_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    URGENT_ANNOTATION,
    ClusterQueue,
    ClusterSnapshot,
    Container,
    JobInfo,
    KueueApiVersion,
    LocalQueue,
    PodSet,
    Preemption,
    QuotaCheck,
    ResourceQuota,
    Workload,
    frozen_resources,
)
from controller.plan import Plan, WorkloadDecision
from controller.policy import compute_plan
from tests.support.builders import NOW, needs_pure_policy, wl
from tests.support.builders import settings as make_settings

# The first Workload of each pair is read first; the second differs from it in one field.
BASE: dict[str, str] = {CPU: "4", GPU: "1"}
VARIANTS: dict[str, dict[str, Any]] = {
    "count": {"count": 2},
    "quantity": {"resources": {CPU: "4", GPU: "2"}},
    "resource": {"resources": {CPU: "4", GPU: "1", "example.com/fpga": "1"}},
    "fraction": {"resources": {CPU: "4", GPU: "1", GPUCORES: "50", GPUMEM_PERCENTAGE: "50"}},
    "memory": {"resources": {CPU: "4", GPU: "1", GPUMEM: "40960"}},
    "bad-percentage": {"resources": {CPU: "4", GPU: "1", GPUCORES: "150"}},
    "no-gpu": {"resources": {CPU: "4"}},
    "spelling": {"resources": {CPU: "4.0", GPU: "1"}},  # the same numbers: shared, same plan
    "priority": {"priority": 7},
    "other-class": {"priority": 7, "priority_class_name": "custom",
                    "workload_priority_class": True},
    "kubernetes-class": {"priority": 7, "priority_class_name": "wdrf-normal"},
    "stand-in": {"priority": 7, "priority_class_name": "wdrf-normal",
                 "workload_priority_class": True},
    "class": {"annotations": {APPROVED_ANNOTATION: "true"}},
    "bad-class": {"annotations": {URGENT_ANNOTATION: "yes"}},  # blocking
    "boost": {"annotations": {KUEUE_PRIORITY_BOOST_ANNOTATION: "5"}},  # as written
    "bad-boost": {"annotations": {KUEUE_PRIORITY_BOOST_ANNOTATION: "five"}},
    "owner-class": {"owner": {APPROVED_ANNOTATION: "true"}},
    "pod-set-annotation": {"pod_annotations": {HAMI_NODE_POLICY_ANNOTATION: "spread"}},
    "owner": {"owner": True},
    "queue": {"queue": "other"},
    "pool": {"queue": "far"},
}


# Admitted: the second of a pair differs from the first in one field.
ADMITTED: dict[str, dict[str, Any]] = {
    "count": {"count": 2, "usage": BASE},  # (Kueue's usage alone does not tell)
    "usage": {"usage": {CPU: "8", GPU: "1"}},
    "flavor": {"flavors": {GPU: "a100"}},
    "fraction": {"resources": {CPU: "4", GPU: "1", GPUCORES: "50", GPUMEM_PERCENTAGE: "50"},
                 "usage": BASE},
    "spelling": {"usage": {CPU: "4.00", GPU: "1"}},  # the same numbers: shared, same plan
}


def cq(name: str, cohort: str, cores: bool) -> ClusterQueue:
    return ClusterQueue(
        name, KueueApiVersion.V1BETA2,
        quotas=(ResourceQuota("default", GPU, Decimal(8)),
                ResourceQuota("default", CPU, Decimal(64)),
                *([ResourceQuota("default", GPUCORES, Decimal(800))] if cores else [])),
        cohort=cohort, preemption=Preemption(within_cluster_queue="LowerPriority"))


def workload(name: str, ns: str, wait: float, change: dict[str, Any]) -> Workload:
    w = wl(name, ns, wait=wait, gpu=None, resources=change.get("resources", BASE),
           annotations=change.get("annotations"), priority=change.get("priority", 0),
           queue=change.get("queue", "default"), count=change.get("count", 1),
           owner=name if change.get("owner") else None)
    ps = w.pod_sets[0]
    if "pod_annotations" in change:
        w = replace(w, pod_sets=(replace(ps, annotations=change["pod_annotations"]),))
    return replace(w, priority_class_name=change.get("priority_class_name"),
                   workload_priority_class=change.get("workload_priority_class", False))


def snapshot() -> ClusterSnapshot:
    """Per variant a team of three: one Workload of the base shape, one that differs in the
    variant's field, then another of the base shape (its share counts the two before it)."""
    workloads: list[Workload] = []
    jobs: list[JobInfo] = []
    local: list[LocalQueue] = []
    for i, (variant, change) in enumerate(VARIANTS.items()):
        ns = f"team-{variant}"
        local += [LocalQueue(ns, "default", "near"), LocalQueue(ns, "other", "near"),
                  LocalQueue(ns, "far", "away")]
        for j, (suffix, fields) in enumerate((("a", {}), ("b", change), ("c", {}))):
            w = workload(f"w{i}{suffix}", ns, 3000.0 - 10 * j, fields)
            workloads.append(w)
            if w.owner is not None:
                on_job = fields["owner"]
                jobs.append(JobInfo(ns, w.owner.name, w.owner.uid,
                                    annotations=on_job if isinstance(on_job, dict) else {},
                                    template_annotations={} if isinstance(on_job, dict)
                                    else {HAMI_NODE_POLICY_ANNOTATION: "spread"}))
    # Admitted Workloads alike share their usage: per variant a team holding two, the second
    # differing in one field, and waiting with one (its share counts both).
    for variant, change in ADMITTED.items():
        ns = f"held-{variant}"
        local.append(LocalQueue(ns, "default", "near"))
        for suffix, fields in (("a", {}), ("b", change)):
            w = wl(f"{variant}-{suffix}", ns, wait=5000.0, gpu=None, admitted=True,
                   resources=fields.get("resources", BASE), count=fields.get("count", 1))
            adm = w.admission
            assert adm is not None
            workloads.append(replace(w, admission=replace(
                adm, cluster_queue="near", flavors=fields.get("flavors", {}),
                usage=frozen_resources({k: Decimal(v) for k, v in fields["usage"].items()})
                if "usage" in fields else adm.usage)))
        workloads.append(wl(f"{variant}-waiting", ns, wait=100.0, gpu=None, resources=BASE))
    # A Workload of two pod sets reads on its own; its team's next one shares again.
    two = wl("two", "team-two", wait=100.0, resources=BASE)
    workloads.append(replace(two, pod_sets=(*two.pod_sets, PodSet(
        "side", 1, (Container("c", frozen_resources({CPU: Decimal(1)})),)))))
    workloads.append(wl("two-next", "team-two", wait=50.0, gpu=None, resources=BASE))
    local.append(LocalQueue("team-two", "default", "near"))
    return ClusterSnapshot(
        workloads=tuple(workloads),
        cluster_queues=(cq("near", "A", cores=False), cq("away", "B", cores=True)),
        local_queues=tuple(local), jobs=tuple(jobs), quota_check=QuotaCheck())


SETTINGS = make_settings(
    hami_rules=(HamiRule(local_queue="other", node_policy="spread"),
                HamiRule(cluster_queue="away", gpu_policy="spread"),
                HamiRule(priority_class="approved", gpu_policy="topology-aware"),
                HamiRule(fractional=True, node_policy="binpack", gpu_policy="binpack")),
    hami_default_node_policy="binpack", gpu_memory_mib=81920, base_priority_cap=100)


def each_on_its_own(snap: ClusterSnapshot, settings: Settings,
                    monkeypatch: pytest.MonkeyPatch) -> Plan:
    """The plan with nothing shared between Workloads: no shapes, no HAMi cache."""
    needs_pure_policy()
    with monkeypatch.context() as m:
        m.setattr(policy, "_shape", lambda _w: None)
        decide = hami.decide_hami
        m.setattr(policy, "decide_hami",
                  lambda *args: decide(*args[:6], None))  # type: ignore[misc]
        return compute_plan(snap, settings, NOW)


def signature(d: WorkloadDecision) -> tuple[object, ...]:
    """What a decision says, less the names in it."""
    b = d.breakdown
    return (d.target_priority, d.target_boost, d.current_boost, d.hami, d.leave_unchanged,
            tuple(p.message for p in d.problems),
            (b.pool, b.dominant_share, b.fairness_level) if b is not None else None)


@pytest.mark.parametrize("settings", [Settings(), SETTINGS], ids=["default", "hami-rules"])
def test_workloads_of_one_shape_get_the_plan_each_gets_read_on_its_own(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = snapshot()
    assert compute_plan(snap, settings, NOW) == each_on_its_own(snap, settings, monkeypatch)


def test_each_variant_shows_in_the_plan() -> None:
    """(So the test above compares something.) Against the team whose Workloads only spell
    their numbers otherwise, each variant changes its own decision or its team's next one."""
    by_key = {d.key: d for d in compute_plan(snapshot(), SETTINGS, NOW).decisions}

    def team(variant: str) -> tuple[tuple[object, ...], ...]:
        i = list(VARIANTS).index(variant)
        return tuple(signature(by_key[f"team-{variant}/w{i}{s}"]) for s in "bc")

    plain = team("spelling")
    for variant in VARIANTS:
        if variant != "spelling":
            assert team(variant) != plain, variant
    shares = compute_plan(snapshot(), SETTINGS, NOW).pool_shares
    held = shares[("cohort/A", "held-spelling")].usage
    for variant in ADMITTED:
        if variant != "spelling":
            assert shares[("cohort/A", f"held-{variant}")].usage != held, variant


def test_a_plan_of_many_alike_workloads_equals_reading_each_on_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Many Workloads of few shapes, spread over teams and queues, created in turn."""
    snap = snapshot()
    workloads = list(snap.workloads)
    extra = []
    for k in range(120):
        src = workloads[k % len(workloads)]
        extra.append(replace(src, name=f"copy-{k}", uid=f"copy-{k}",
                             namespace=workloads[(k * 7) % len(workloads)].namespace,
                             created=NOW - timedelta(seconds=k)))
    snap = replace(snap, workloads=(*workloads, *extra))
    assert compute_plan(snap, SETTINGS, NOW) == each_on_its_own(snap, SETTINGS, monkeypatch)
