"""Policy decisions on concrete inputs: classes, overrides, base priority, bad input, warnings."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest

from controller.accounting import UsageHistory
from controller.config import MAX_OVERRIDE, Settings
from controller.domain import (
    APPLIED_PRIORITY_ANNOTATION,
    APPROVED_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    GPU,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
    ClusterQueue,
    ClusterSnapshot,
    InputProblem,
    KueueApiVersion,
    ObjectRef,
    Preemption,
    PriorityClass,
    PriorityMode,
    ResourceQuota,
    Workload,
)
from controller.parse import parse_workload
from controller.plan import Plan, WorkloadDecision
from controller.policy import compute_plan
from controller.workload import PriorityTarget, pointer, priority_patch
from tests.support.builders import NOW, job, snapshot, wl, workload_dict
from tests.support.builders import settings as make_settings


def one(plan: Plan, key: str = "team-a/p") -> WorkloadDecision:
    return next(d for d in plan.decisions if d.key == key)


def plan_for(*workloads, jobs=(), **kw) -> Plan:  # type: ignore[no-untyped-def]
    return compute_plan(snapshot(list(workloads), jobs=tuple(jobs)), Settings(), NOW, **kw)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, PriorityClass.NORMAL),
        ({URGENT_ANNOTATION: "true"}, PriorityClass.URGENT),
        ({APPROVED_ANNOTATION: "true"}, PriorityClass.APPROVED),
        ({URGENT_ANNOTATION: "true", APPROVED_ANNOTATION: "true"}, PriorityClass.URGENT),
        ({URGENT_ANNOTATION: "false", APPROVED_ANNOTATION: "true"}, PriorityClass.APPROVED),
    ],
)
def test_class_from_workload(annotations: dict[str, str], expected: PriorityClass) -> None:
    d = one(plan_for(wl("p", annotations=annotations)))
    assert d.breakdown is not None and d.breakdown.priority_class is expected
    assert not d.problems and not d.leave_unchanged


def test_class_from_owner_job() -> None:
    d = one(plan_for(wl("p", owner="train"),
                     jobs=[job("train", annotations={URGENT_ANNOTATION: "true"})]))
    assert d.breakdown is not None and d.breakdown.priority_class is PriorityClass.URGENT


def test_job_with_other_uid_is_not_the_owner() -> None:
    other = job("train", annotations={URGENT_ANNOTATION: "true"})
    other = type(other)(namespace=other.namespace, name=other.name, uid="someone-else",
                        annotations=other.annotations)
    d = one(plan_for(wl("p", owner="train"), jobs=[other]))
    assert d.breakdown is not None and d.breakdown.priority_class is PriorityClass.NORMAL


@pytest.mark.parametrize("api_version,kind", [("batch/v2", "Job"), ("example.com/v1", "Job"),
                                              ("batch/v1", "CronJob"), ("", "Job")])
def test_an_owner_reference_of_another_kind_is_not_the_job(api_version: str, kind: str) -> None:
    """Owners are trusted only as Kueue trusts them: exactly apiVersion batch/v1, kind Job (a
    forged reference naming an urgent Job of the namespace gives nothing)."""
    from dataclasses import replace

    w = wl("p", owner="train")
    assert w.owner is not None
    w = replace(w, owner=replace(w.owner, api_version=api_version, kind=kind))
    d = one(plan_for(w, jobs=[job("train", annotations={URGENT_ANNOTATION: "true"})]))
    assert d.breakdown is not None and d.breakdown.priority_class is PriorityClass.NORMAL


@pytest.mark.parametrize("value", ["yes", "TRUE", " true", "True", "true ", "1", ""])
@pytest.mark.parametrize("key", [URGENT_ANNOTATION, APPROVED_ANNOTATION])
def test_bad_class_value_is_reported_and_left_unchanged(key: str, value: str) -> None:
    w = wl("p", annotations={key: value, KUEUE_PRIORITY_BOOST_ANNOTATION: "7"}, priority=3)
    d = one(plan_for(w))
    assert d.leave_unchanged
    assert (d.target_boost, d.target_priority) == (7, 3)  # exactly what it has now
    [p] = d.problems
    assert p.object == w.ref and p.field == f"metadata.annotations[{key}]"
    assert p.value == value and '"true"' in p.message
    assert "Workload team-a/p" in str(p)


def test_bad_class_value_on_job_names_the_job() -> None:
    d = one(plan_for(wl("p", owner="train"),
                     jobs=[job("train", annotations={URGENT_ANNOTATION: "yes"})]))
    assert d.leave_unchanged
    assert d.problems[0].object is not None and d.problems[0].object.kind == "Job"


@pytest.mark.parametrize("value", ["0", "150000", str(MAX_OVERRIDE), "007"])
def test_valid_override_sets_the_priority(value: str) -> None:
    d = one(plan_for(wl("p", priority=40, annotations={PRIORITY_OVERRIDE_ANNOTATION: value})))
    assert not d.leave_unchanged and d.breakdown is not None
    assert d.breakdown.override == int(value)
    assert d.target_priority == int(value) and d.target_boost == int(value) - 40


@pytest.mark.parametrize(
    "value", ["1e12", "-5", "1e3", " 5", "5 ", "+5", "5.0", "abc", "", str(MAX_OVERRIDE + 1),
              "99999999999"]
)
def test_invalid_override_is_reported_and_left_unchanged(value: str) -> None:
    d = one(plan_for(wl("p", annotations={PRIORITY_OVERRIDE_ANNOTATION: value})))
    assert d.leave_unchanged
    [p] = d.problems
    assert p.field == f"metadata.annotations[{PRIORITY_OVERRIDE_ANNOTATION}]"
    assert f"0..{MAX_OVERRIDE}" in p.message


def test_base_priority_annotation_wins_over_spec() -> None:
    d = one(plan_for(wl("p", priority=105000, annotations={BASE_PRIORITY_ANNOTATION: "5"})))
    assert d.base_priority == 5
    assert d.target_priority == 5 + d.target_boost


@pytest.mark.parametrize("bad", ["x", "1e3", "99999999999", " 5"])
def test_bad_base_priority_is_reported(bad: str) -> None:
    d = one(plan_for(wl("p", annotations={BASE_PRIORITY_ANNOTATION: bad})))
    assert d.leave_unchanged and d.problems[0].field.endswith(f"[{BASE_PRIORITY_ANNOTATION}]")


@pytest.mark.parametrize(
    ("priority", "expected"),
    [
        (510, 10),  # spec.priority is the value this controller wrote: the remembered base
        (10, 10),  # Kueue reset it to the class value: re-assert, base unchanged
        (40, 40),  # neither: a new class or an admin set a new base
        (None, 10),
    ],
)
def test_applied_priority_tells_our_write_a_reset_and_a_new_base_apart(
    priority: int | None, expected: int
) -> None:
    ann = {BASE_PRIORITY_ANNOTATION: "10", APPLIED_PRIORITY_ANNOTATION: "510"}
    d = one(plan_for(wl("p", priority=priority, annotations=ann)))
    assert not d.problems and not d.leave_unchanged
    assert d.base_priority == expected
    assert d.target_priority == expected + d.target_boost


@pytest.mark.parametrize("applied", [None, "x", "99999999999", " 510"])
def test_missing_or_invalid_applied_priority_keeps_the_base_annotation(
    applied: str | None
) -> None:
    ann = {BASE_PRIORITY_ANNOTATION: "10"}
    if applied is not None:
        ann[APPLIED_PRIORITY_ANNOTATION] = applied
    d = one(plan_for(wl("p", priority=40, annotations=ann)))
    assert d.base_priority == 10 and not d.problems


def test_applied_priority_without_base_annotation_is_ignored() -> None:
    d = one(plan_for(wl("p", priority=40, annotations={APPLIED_PRIORITY_ANNOTATION: "510"})))
    assert d.base_priority == 40 and not d.problems


def test_base_defaults_to_spec_priority_then_zero() -> None:
    assert one(plan_for(wl("p", priority=12))).base_priority == 12
    assert one(plan_for(wl("p", priority=None))).base_priority == 0


def test_current_boost_is_read() -> None:
    d = one(plan_for(wl("p", annotations={KUEUE_PRIORITY_BOOST_ANNOTATION: "-3"})))
    assert d.current_boost == -3


def test_gpumem_with_suffix_is_reported() -> None:
    w = wl("p", resources={"nvidia.com/gpumem": str(8 * 2**30)})  # "8Gi" parsed
    d = one(plan_for(w))
    assert d.leave_unchanged
    assert "nvidia.com/gpumem" in d.problems[0].field and "8Gi" in d.problems[0].message


def test_unknown_resource_is_reported_but_not_blocking() -> None:
    d = one(plan_for(wl("p", resources={"example.com/fpga": "1"})))
    assert not d.leave_unchanged
    [p] = d.problems
    assert p.field.endswith("example.com/fpga") and "unknown resource" in p.message


def test_admitted_finished_and_inactive_are_not_decided() -> None:
    from dataclasses import replace

    items = [wl("run", admitted=True), replace(wl("done", admitted=True), finished=True),
             replace(wl("held"), active=False), wl("p")]
    plan = plan_for(*items)
    assert [d.key for d in plan.decisions] == ["team-a/p"]


def test_usage_counts_gpu_equivalents() -> None:
    frac = {"nvidia.com/gpucores": "25", "nvidia.com/gpumem-percentage": "25"}
    plan = plan_for(*[wl(f"s{i}", admitted=True, resources=frac) for i in range(4)], wl("p"))
    assert plan.teams["team-a"].usage[GPU] == Decimal("1.0")
    assert plan.teams["team-a"].dominant_share == pytest.approx(1 / 8)


def test_ranks_are_per_cluster_queue_and_sorted() -> None:
    urgent = wl("r", annotations={URGENT_ANNOTATION: "true"})
    plan = plan_for(wl("p", wait=10), wl("q", wait=20), urgent)
    assert [d.key for d in plan.decisions] == ["team-a/r", "team-a/q", "team-a/p"]
    assert [d.rank for d in plan.decisions] == [0, 1, 2]


def test_ties_are_broken_like_kueue_by_creation_then_uid() -> None:
    s = make_settings(aging_coefficient=0.0)
    plan = compute_plan(snapshot([wl("b", wait=5), wl("a", wait=5), wl("c", wait=9)]), s, NOW)
    assert [d.key for d in plan.decisions] == ["team-a/c", "team-a/a", "team-a/b"]


def test_warnings_for_newer_equal_preemption_and_afs() -> None:
    def queue(within: str) -> ClusterQueue:
        return ClusterQueue("risky", KueueApiVersion.V1BETA2,
                            quotas=(ResourceQuota("f", GPU, Decimal(8)),),
                            preemption=Preemption(within_cluster_queue=within),
                            admission_fair_sharing=True)

    plan = compute_plan(snapshot([wl("p")], cq=queue("LowerOrNewerEqualPriority")), Settings(),
                        NOW)
    assert any("risky" in w and "LowerOrNewerEqualPriority" in w for w in plan.warnings)
    assert any("risky" in w and "Admission Fair Sharing" in w for w in plan.warnings)
    # LowerPriority is safe by construction (class guards): no preemption warning.
    plan = compute_plan(snapshot([wl("p")], cq=queue("LowerPriority")), Settings(), NOW)
    assert not any("preempt" in w for w in plan.warnings)
    assert not compute_plan(snapshot([wl("p")]), Settings(), NOW).warnings


def test_parse_problems_on_a_pending_workload_travel_with_it() -> None:
    w = wl("p")
    prob = InputProblem(w.ref, "spec.podSets[0].x", "y", "bad")
    snap = snapshot([w])
    snap = ClusterSnapshot(snap.workloads, snap.cluster_queues, snap.local_queues,
                           problems=(prob, InputProblem(ObjectRef("Node", "n"), "f", "v", "m")))
    plan = compute_plan(snap, Settings(), NOW)
    assert one(plan).leave_unchanged and one(plan).problems == (prob,)
    assert len(plan.problems) == 1 and plan.problems[0].object == ObjectRef("Node", "n")


def test_history_half_life_decays_usage() -> None:
    s = make_settings(usage_half_life=3600.0)
    hog = [wl(f"h{i}", "team-b", admitted=True) for i in range(4)]
    p1 = compute_plan(snapshot([*hog, wl("p")]), s, NOW)
    assert p1.history is not None and p1.teams["team-b"].dominant_share == pytest.approx(0.5)
    # One half-life later team-b runs nothing: its decayed share halves.
    later = NOW + timedelta(hours=1)
    p2 = compute_plan(snapshot([wl("p")]), s, later, history=p1.history)
    assert p2.teams["team-b"].dominant_share == pytest.approx(0.25)
    assert p2.history is not None and p2.history.timestamp == later
    # Without history configured, usage is current only.
    p3 = compute_plan(snapshot([wl("p")]), Settings(), later, history=p1.history)
    assert "team-b" not in p3.teams or p3.teams["team-b"].dominant_share == 0


def test_history_charges_a_new_hog_at_once() -> None:
    s = make_settings(usage_half_life=86400.0)
    quiet = compute_plan(snapshot([wl("p")]), s, NOW)
    hog = [wl(f"h{i}", "team-b", admitted=True) for i in range(4)]
    later = NOW + timedelta(seconds=10)
    p = compute_plan(snapshot([*hog, wl("p")]), s, later, history=quiet.history)
    assert p.teams["team-b"].dominant_share == pytest.approx(0.5)  # current, not the average
    assert p.history is not None and p.history.usage["cq/cq|team-b"][GPU] < 0.01


def test_history_json_roundtrip() -> None:
    h = UsageHistory().advance({"a": {GPU: 2.5}}, NOW, 60.0)
    assert UsageHistory.from_json(h.to_json()) == h
    with pytest.raises(ValueError):
        UsageHistory.from_json("{nope")
    with pytest.raises(ValueError):
        UsageHistory.from_json('{"version": 1, "usage": {"a": {"gpu": "x"}}}')


def test_team_weight_lowers_share() -> None:
    s = make_settings(team_weights={"team-a": 2.0})
    plan = compute_plan(snapshot([wl("r", admitted=True), wl("p")]), s, NOW)
    assert plan.teams["team-a"].dominant_share == pytest.approx(1 / 8 / 2)


def test_weights_for_unknown_teams_and_resources_are_warned_about() -> None:
    s = make_settings(team_weights={"team-a": 2.0, "tema-b": 3.0},
                      resource_weights={"cpu": 1.0, "gpu": 1.0})
    plan = compute_plan(snapshot([wl("p")]), s, NOW)
    assert any("tema-b" in w and "team-a" not in w for w in plan.warnings)
    assert any("RESOURCE_WEIGHTS" in w and "gpu" in w for w in plan.warnings)


def test_class_and_team_label_from_an_owner_of_another_integrated_kind() -> None:
    """A JobSet (or RayJob, PyTorchJob...) owns its Workload: its annotations count like a
    Job's; an owner with another UID (recreated under the same name) does not."""
    from dataclasses import replace

    from controller.domain import OwnerInfo, TeamSource

    jobset = OwnerInfo("JobSet", "jobset.x-k8s.io/v1alpha2", "team-a", "train", "js-uid",
                       annotations={URGENT_ANNOTATION: "true"},
                       labels={"wdrf.x-k8s.io/team": "vision"})
    w = replace(wl("p"), owner=ObjectRef("JobSet", "train", "team-a", "js-uid",
                                         "jobset.x-k8s.io/v1alpha2"))
    snap = replace(snapshot([w]), owners=(jobset,))
    d = one(compute_plan(snap, Settings(), NOW))
    assert d.breakdown is not None and d.breakdown.priority_class is PriorityClass.URGENT
    by_label = make_settings(team_source=TeamSource.LABEL)
    assert one(compute_plan(snap, by_label, NOW)).team == "vision"
    stale = replace(snap, owners=(replace(jobset, uid="other"),))
    d = one(compute_plan(stale, Settings(), NOW))
    assert d.breakdown is not None and d.breakdown.priority_class is PriorityClass.NORMAL
    # The same kind name in another group is not that owner.
    forged = replace(w, owner=ObjectRef("JobSet", "train", "team-a", "js-uid", "evil.io/v1"))
    d = one(compute_plan(replace(snap, workloads=(forged,)), Settings(), NOW))
    assert d.breakdown is not None and d.breakdown.priority_class is PriorityClass.NORMAL



# --- The class stand-in WorkloadPriorityClasses (manifests/admission/class-priority.yaml) ---


def _parsed(name: str, annotations: dict[str, str], priority: int,
            priority_class: str | None, namespace: str = "team-a"
            ) -> tuple[Workload, dict[str, Any]]:
    raw = workload_dict(name, namespace, annotations=annotations, priority=priority,
                        priority_class=priority_class)
    w, problems = parse_workload(raw)
    assert w is not None and not problems
    return w, raw


@pytest.mark.parametrize("mode", [PriorityMode.BOOST, PriorityMode.SPEC])
def test_a_class_stand_in_priority_class_counts_as_base_0_and_writes_start_from_its_value(
    mode: PriorityMode,
) -> None:
    """An urgent Job stamped wdrf-urgent (1,500,000) ranks exactly as the same Job without
    it: its value is the class, not a base (with a base cap it would otherwise gain +cap).
    Boost and spec writes still start from the value Kueue gave it."""
    s = make_settings(base_priority_cap=20000)
    urgent = {URGENT_ANNOTATION: "true"}
    plain, _ = _parsed("plain", urgent, 0, None)
    stamped, raw = _parsed("stamped", urgent, 1_500_000, "wdrf-urgent", "team-b")
    plan = compute_plan(snapshot([plain, stamped]), s, NOW)  # two idle teams: same fairness
    a, b = one(plan, "team-a/plain"), one(plan, "team-b/stamped")
    assert a.breakdown is not None and b.breakdown is not None
    assert b.breakdown.base_term == a.breakdown.base_term == 20000
    assert b.target_priority == a.target_priority
    assert b.base_priority == 1_500_000
    assert b.target_boost == b.target_priority - 1_500_000
    target = PriorityTarget(b.base_priority, b.target_priority, b.target_boost, b.terms)
    patch = priority_patch(raw, mode, target)
    assert patch is not None
    adds = {op["path"]: op["value"] for op in patch.ops if op["op"] == "add"}
    if mode is PriorityMode.BOOST:
        key = pointer("metadata", "annotations", KUEUE_PRIORITY_BOOST_ANNOTATION)
        assert adds[key] == str(b.target_priority - 1_500_000)
    else:
        assert adds["/spec/priority"] == b.target_priority
        assert adds[pointer("metadata", "annotations", BASE_PRIORITY_ANNOTATION)] == "1500000"


def test_a_users_own_priority_class_still_counts_as_base() -> None:
    """Only the stand-in names are read as base 0; another WorkloadPriorityClass (one an
    admin allowed) is the user's base, inside the cap."""
    s = make_settings(base_priority_cap=20000)
    w, _ = _parsed("p", {}, 5000, "high")
    d = one(compute_plan(snapshot([w]), s, NOW))
    assert d.breakdown is not None and d.breakdown.base_term == 25000


def test_a_pod_priority_class_of_a_stand_in_name_is_a_base() -> None:
    """A Kubernetes PriorityClass that happens to be called wdrf-urgent is not the stand-in."""
    s = make_settings(base_priority_cap=20000)
    w = dataclasses.replace(wl("p", priority=5000), priority_class_name="wdrf-urgent")
    d = one(compute_plan(snapshot([w]), s, NOW))
    assert d.breakdown is not None and d.breakdown.base_term == 25000


@pytest.mark.parametrize(("pc", "value", "warned"), [
    ("wdrf-urgent", 1_500_000, False),
    ("wdrf-urgent", 150_000, True),  # below the approved guard: urgent could not preempt
    ("wdrf-approved", 0, False),
    ("wdrf-approved", 150_000, True),  # approved would preempt unguarded normal work
    ("wdrf-normal", 0, False),
    ("high", 150_000, False),  # not a stand-in
])
def test_a_stand_in_whose_value_does_not_fit_the_settings_is_warned_about(
    pc: str, value: int, warned: bool,
) -> None:
    w, _ = _parsed("p", {}, value, pc)
    warnings = [x for x in compute_plan(snapshot([w]), Settings(), NOW).warnings
                if "stand-in" in x]
    assert bool(warnings) is warned, warnings
    if warned:
        assert pc in warnings[0] and "team-a/p" in warnings[0] and str(value) in warnings[0]


def test_the_stand_in_value_is_read_from_the_base_a_spec_write_remembered() -> None:
    """In spec mode spec.priority holds the controller's value; the stand-in's is the base."""
    ann = {BASE_PRIORITY_ANNOTATION: "1500000", APPLIED_PRIORITY_ANNOTATION: "1912460"}
    w, _ = _parsed("p", ann, 1_912_460, "wdrf-urgent")
    assert not [x for x in compute_plan(snapshot([w]), Settings(), NOW).warnings
                if "stand-in" in x]
