"""MultiKueue: detection from ClusterQueues, AdmissionChecks and origin labels, and the rule
that a spec-mode plan never writes spec.priority where MultiKueue would delete the remote copy."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from prometheus_client import generate_latest

from controller.domain import MULTIKUEUE_CONTROLLER, MULTIKUEUE_ORIGIN_LABEL, PriorityMode
from controller.live.api import ADMISSION_CHECKS, WORKLOADS
from controller.live.diff import PRIORITY, plan_diff
from controller.live.metrics import Metrics
from controller.multikueue import guard_plan, multikueue_queues
from controller.parse import build_snapshot, parse_admission_check, parse_cluster_queue
from controller.plan import Plan
from controller.policy import compute_plan
from tests.support.builders import (
    cluster_queue_dict,
    local_queue_dict,
    settings,
    workload_dict,
    workload_infos,
)
from tests.support.fake import FakeApi

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def check_dict(name: str, controller: str = MULTIKUEUE_CONTROLLER) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "AdmissionCheck",
            "metadata": {"name": name}, "spec": {"controllerName": controller}}


def mk_cq(name: str, checks: list[str] | None = None, strategy: list[str] | None = None,
          ) -> dict[str, Any]:
    cq = cluster_queue_dict(name, cohort=None)
    if checks is not None:
        cq["spec"]["admissionChecks"] = checks
    if strategy is not None:
        cq["spec"]["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": n, "onFlavors": ["default"]} for n in strategy]}
    return cq


def urgent(name: str, queue: str, *, wpc: bool = False, origin: bool = False,
           ) -> dict[str, Any]:
    wl = workload_dict(name, queue=queue, annotations={"wdrf.x-k8s.io/urgent": "true"},
                       labels={MULTIKUEUE_ORIGIN_LABEL: "manager-1"} if origin else None,
                       requests={"nvidia.com/gpu": "1"}, age=300)
    if wpc:
        wl["spec"]["priorityClassRef"] = {"group": "kueue.x-k8s.io",
                                          "kind": "WorkloadPriorityClass", "name": "low"}
    return wl


def docs(*workloads: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        check_dict("mk"), check_dict("prov", "kueue.x-k8s.io/provisioning-request"),
        mk_cq("cq-mk", checks=["mk"]), mk_cq("cq-plain", checks=["prov"]),
        mk_cq("cq-strategy", strategy=["prov", "mk"]),
        local_queue_dict("team-a", "to-mk", "cq-mk"),
        local_queue_dict("team-a", "to-plain", "cq-plain"),
        local_queue_dict("team-a", "to-strategy", "cq-strategy"),
        *workloads,
    ]


def plan_of(objs: list[dict[str, Any]], mode: PriorityMode) -> tuple[Plan, dict[str, int]]:
    snap = build_snapshot(objs)
    guarded = guard_plan(compute_plan(snap, settings(), NOW), snap, mode)
    return guarded.plan, dict(guarded.skipped)


def priority_writes(plan: Plan, objs: list[dict[str, Any]], mode: PriorityMode) -> set[str]:
    infos = workload_infos(copy.deepcopy(o) for o in objs)
    diff = plan_diff(plan.decisions, mode, WORKLOADS, infos, lambda _k: None, {})
    return {c.ref.name for c in diff.changes if c.what == PRIORITY}


# -- detection ---------------------------------------------------------------------------


def test_cluster_queue_admission_checks_from_both_fields() -> None:
    cq, problems = parse_cluster_queue(mk_cq("a", checks=["x", "y"], strategy=["y", "z"]))
    assert cq is not None and not problems
    assert cq.admission_checks == ("x", "y", "z")


def test_a_bad_admission_check_name_is_reported_and_ignored() -> None:
    cq, problems = parse_cluster_queue(mk_cq("a", checks=["x", 7]))  # type: ignore[list-item]
    assert cq is not None and cq.admission_checks == ("x",)
    assert [p.field for p in problems] == ["spec.admissionChecks[1]"]


def test_admission_check_without_controller_is_skipped_with_a_problem() -> None:
    ac, problems = parse_admission_check({"apiVersion": "kueue.x-k8s.io/v1beta2",
                                          "kind": "AdmissionCheck", "metadata": {"name": "x"},
                                          "spec": {}})
    assert ac is None and problems[0].field == "spec.controllerName"
    ac, problems = parse_admission_check(check_dict("mk"))
    assert ac is not None and ac.multikueue and not problems


def test_multikueue_queues_are_those_naming_a_multikueue_check() -> None:
    snap = build_snapshot(docs())
    assert dict(multikueue_queues(snap)) == {"cq-mk": "mk", "cq-strategy": "mk"}


def test_workload_priority_class_and_origin_label_are_parsed() -> None:
    snap = build_snapshot(docs(urgent("w", "to-mk", wpc=True, origin=True),
                               urgent("k8s", "to-mk")))
    by = {w.name: w for w in snap.workloads}
    assert by["w"].workload_priority_class and by["w"].labels[MULTIKUEUE_ORIGIN_LABEL]
    assert not by["k8s"].workload_priority_class


def test_v1beta1_priority_class_source() -> None:
    wl = workload_dict("w", api="kueue.x-k8s.io/v1beta1", priority_class="low")
    wl["spec"]["priorityClassSource"] = "kueue.x-k8s.io/workloadpriorityclass"
    snap = build_snapshot([wl])
    assert snap.workloads[0].workload_priority_class


# -- the rule ----------------------------------------------------------------------------


def test_spec_mode_never_writes_spec_priority_of_a_multikueue_workload() -> None:
    objs = docs(urgent("mk", "to-mk"), urgent("strat", "to-strategy"),
                urgent("plain", "to-plain"), urgent("wpc", "to-mk", wpc=True))
    plan, skipped = plan_of(objs, PriorityMode.SPEC)
    # the plain ClusterQueue's and the WorkloadPriorityClass Workload's priorities are written
    assert priority_writes(plan, objs, PriorityMode.SPEC) == {"plain", "wpc"}
    assert skipped == {"cq-mk": 1, "cq-strategy": 1}
    by = {d.key: d for d in plan.decisions}
    assert by["team-a/mk"].leave_unchanged
    assert "MultiKueue" in by["team-a/mk"].problems[-1].message
    assert any("ClusterQueue cq-mk" in w and "AdmissionCheck mk" in w for w in plan.warnings)
    # without the guard the same plan would write them: the rule is what prevents it
    snap = build_snapshot(objs)
    unguarded = compute_plan(snap, settings(), NOW)
    assert {"mk", "strat"} <= priority_writes(unguarded, objs, PriorityMode.SPEC)


def test_spec_mode_never_writes_a_worker_copy() -> None:
    objs = docs(urgent("copy", "to-plain", origin=True), urgent("own", "to-plain"))
    plan, skipped = plan_of(objs, PriorityMode.SPEC)
    assert priority_writes(plan, objs, PriorityMode.SPEC) == {"own"}
    assert skipped == {"cq-plain": 1}
    assert any("worker copies" in w and "cq-plain" in w for w in plan.warnings)


def test_boost_mode_writes_and_says_the_boost_is_not_forwarded() -> None:
    objs = docs(urgent("mk", "to-mk"), urgent("copy", "to-plain", origin=True))
    plan, skipped = plan_of(objs, PriorityMode.BOOST)
    assert skipped == {}
    assert priority_writes(plan, objs, PriorityMode.BOOST) == {"mk", "copy"}
    warning = [w for w in plan.warnings if "ClusterQueue cq-mk" in w]
    assert len(warning) == 1 and "does not forward" in warning[0]


def test_no_multikueue_leaves_the_plan_as_it_is() -> None:
    objs = [mk_cq("cq-plain"), local_queue_dict("team-a", "to-plain", "cq-plain"),
            urgent("a", "to-plain")]
    snap = build_snapshot(objs)
    plan = compute_plan(snap, settings(), NOW)
    guarded = guard_plan(plan, snap, PriorityMode.SPEC)
    assert guarded.plan is plan and not guarded.skipped


def test_skipped_metric_per_cluster_queue() -> None:
    m = Metrics()
    m.set_labelled(m.multikueue_skipped, {"cq-mk": 2})
    text = generate_latest(m.registry).decode()
    assert 'wdrf_multikueue_skipped_workloads{cluster_queue="cq-mk"} 2.0' in text


# -- the live loop -----------------------------------------------------------------------


def test_live_spec_mode_writes_nothing_to_a_multikueue_cluster_queue() -> None:
    from controller.domain import URGENT_ANNOTATION
    from controller.live.api import CLUSTER_QUEUES
    from tests.unit.test_live_runner import cluster, controller, stored, workload
    from tests.unit.test_live_runner import settings as live_settings

    api = FakeApi()
    cluster(api)
    cq = api.get_object(CLUSTER_QUEUES.item("cq"))
    assert cq is not None
    cq["spec"]["admissionChecks"] = ["mk"]
    api.put_object(CLUSTER_QUEUES.item("cq"), cq)
    api.put_object(ADMISSION_CHECKS.item("mk"), check_dict("mk"))
    workload(api, "team-a", "a1")
    workload(api, "team-b", "b1", annotations={URGENT_ANNOTATION: "true"})
    c = controller(api, live_settings(PRIORITY_MODE="spec"))
    report = c.run_cycle(NOW)
    assert report.changes == []
    assert stored(api, "team-b", "b1")["spec"]["priority"] == 0
    assert any("ClusterQueue cq" in w for w in report.plan.warnings)
    text = generate_latest(c.metrics.registry).decode()
    assert 'wdrf_multikueue_skipped_workloads{cluster_queue="cq"} 2.0' in text
    # the same cluster without the AdmissionCheck's MultiKueue controller is written
    api.put_object(ADMISSION_CHECKS.item("mk"), check_dict("mk", "example.com/other"))
    c.sync_once()
    report = c.run_cycle(NOW)
    assert {ch.ref.name for ch in report.changes} == {"a1", "b1"}
    assert stored(api, "team-b", "b1")["spec"]["priority"] > 0
