"""MultiKueue: detection from ClusterQueues, AdmissionChecks and origin labels, and the rule
that a spec-mode plan never writes spec.priority where MultiKueue would delete the remote copy."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime
from typing import Any

from prometheus_client import generate_latest

from controller.classify import read_class
from controller.domain import (
    APPROVED_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    MULTIKUEUE_CONTROLLER,
    MULTIKUEUE_ORIGIN_LABEL,
    PRIORITY_OVERRIDE_ANNOTATION,
    URGENT_ANNOTATION,
    ClusterSnapshot,
    PriorityClass,
    PriorityMode,
)
from controller.live.api import ADMISSION_CHECKS, WORKLOADS
from controller.live.diff import PRIORITY, plan_diff
from controller.live.metrics import Metrics
from controller.multikueue import (
    ORIGIN_UNKNOWN,
    OWNER_NOT_READ,
    classes_from_manager,
    guard_plan,
    hold_unknown,
    multikueue_queues,
)
from controller.parse import build_snapshot, parse_admission_check, parse_cluster_queue
from controller.plan import Plan
from controller.policy import compute_plan
from tests.support.builders import (
    cluster_queue_dict,
    job_dict,
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
    from controller.live.api import CLUSTER_QUEUES
    from tests.support.fake_cluster import cluster, controller, live_settings, stored, workload

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


# -- a worker's copies take their classes from the manager -------------------------------------


def worker_and_manager(copy_ann: dict[str, str], manager_ann: dict[str, str],
                       manager_job_ann: dict[str, str] | None,
                       worker_job_ann: dict[str, str] | None = None) -> tuple[
                           ClusterSnapshot, ClusterSnapshot]:
    """A worker with one copy (and, when given, the Job MultiKueue created for it there) and a
    local Workload; the manager with the copy's origin Workload and (when given) its Job."""
    copy_wl = workload_dict("w", queue="lq", annotations=copy_ann,
                            labels={MULTIKUEUE_ORIGIN_LABEL: "manager-1"},
                            owner_job="j" if worker_job_ann is not None else None)
    own = workload_dict("own", queue="lq", annotations={URGENT_ANNOTATION: "true"})
    worker = [copy_wl, own]
    if worker_job_ann is not None:
        worker.append(job_dict("j", annotations=worker_job_ann))
    manager = [workload_dict("w", queue="lq", annotations=manager_ann,
                             owner_job="j" if manager_job_ann is not None else None)]
    if manager_job_ann is not None:
        manager.append(job_dict("j", annotations=manager_job_ann))
    return build_snapshot(worker), build_snapshot(manager)


def overlay(worker: ClusterSnapshot, manager: ClusterSnapshot | None) -> ClusterSnapshot:
    wls = {w.key: w for w in manager.workloads} if manager else {}
    jobs = {(j.namespace, j.name): j for j in manager.jobs} if manager else {}
    return classes_from_manager(worker, wls.get, lambda ns, n: jobs.get((ns, n))).snapshot


def class_of(snap: ClusterSnapshot, name: str) -> PriorityClass:
    w = next(w for w in snap.workloads if w.name == name)
    job = next((j for j in snap.jobs if w.owner is not None and j.name == w.owner.name), None)
    return read_class(w, job)[0]


def test_a_copy_takes_the_class_of_its_manager_job() -> None:
    worker, manager = worker_and_manager({}, {}, {APPROVED_ANNOTATION: "true"})
    assert class_of(worker, "w") is PriorityClass.NORMAL
    out = overlay(worker, manager)
    assert class_of(out, "w") is PriorityClass.APPROVED
    assert class_of(out, "own") is PriorityClass.URGENT  # not a copy: its own annotations


def test_a_copy_takes_the_class_of_its_manager_workload() -> None:
    worker, manager = worker_and_manager({}, {URGENT_ANNOTATION: "true"}, None)
    assert class_of(overlay(worker, manager), "w") is PriorityClass.URGENT


def test_what_is_set_on_the_worker_counts_for_nothing() -> None:
    """Urgent on the copy and on the Job MultiKueue created on the worker: ignored; the
    manager says normal."""
    worker, manager = worker_and_manager(
        {URGENT_ANNOTATION: "true", PRIORITY_OVERRIDE_ANNOTATION: "9"}, {}, {},
        worker_job_ann={URGENT_ANNOTATION: "true"})
    assert class_of(worker, "w") is PriorityClass.URGENT
    out = overlay(worker, manager)
    assert class_of(out, "w") is PriorityClass.NORMAL
    copy_wl = next(w for w in out.workloads if w.name == "w")
    assert PRIORITY_OVERRIDE_ANNOTATION not in copy_wl.annotations
    # the Job in the snapshot is the manager's now (annotations as the manager has them)
    assert [j.annotations for j in out.jobs if j.name == "j"] == [{}]


def test_a_copy_without_a_known_origin_is_left_unchanged() -> None:
    """Not planned as normal (that could demote an urgent copy while the manager cannot be
    read): named unknown, and the plan leaves it unchanged with a problem."""
    worker, manager = worker_and_manager({URGENT_ANNOTATION: "true"}, {}, None,
                                         worker_job_ann={APPROVED_ANNOTATION: "true"})
    found = classes_from_manager(worker, lambda _k: None, lambda _n, _m: None)
    assert found.unknown == {"team-a/w": ORIGIN_UNKNOWN}
    assert next(w for w in found.snapshot.workloads if w.name == "w").owner is None
    held = hold_unknown(compute_plan(found.snapshot, settings(), NOW), found.unknown)
    assert held.counts == {ORIGIN_UNKNOWN: 1}
    by = {d.key: d for d in held.plan.decisions}
    assert by["team-a/w"].leave_unchanged and "not known" in by["team-a/w"].problems[-1].message
    assert not by["team-a/own"].leave_unchanged
    # a manager Workload whose Job is not known: unknown too (the Job may say approved)
    worker, manager = worker_and_manager({}, {}, {APPROVED_ANNOTATION: "true"})
    wls = {w.key: w for w in manager.workloads}
    assert classes_from_manager(worker, wls.get, lambda _n, _m: None).unknown == {
        "team-a/w": ORIGIN_UNKNOWN}


def test_a_copy_of_a_jobset_is_left_unchanged_and_a_pod_groups_is_planned() -> None:
    """The manager Workload of a JobSet (or RayJob, ...: kinds whose objects carry the class)
    is owned by an object the controller does not read on the manager (the manager does not
    serve the kind, or forbids reading it; no manager_owner here): its class is unknown,
    the copy is left unchanged with a problem naming the reason, counted as owner-not-read
    (planned as normal it could demote an urgent JobSet whose stand-in priority is urgent's).
    A pod group's class is on its Workload, which is read: its copy is planned with it."""
    copies = [workload_dict(n, queue="lq", labels={MULTIKUEUE_ORIGIN_LABEL: "manager-1"},
                            owner=(kind, f"{n}-owner"), priority=prio)
              for n, kind, prio in (("js", "JobSet", 1_500_000), ("ray", "RayJob", 0),
                                    ("pods", "Pod", 0))]
    worker = build_snapshot(copies)
    manager = build_snapshot([
        workload_dict("js", queue="lq", owner=("JobSet", "js-owner"), priority=1_500_000),
        workload_dict("ray", queue="lq", owner=("RayJob", "ray-owner")),
        workload_dict("pods", queue="lq", owner=("Pod", "pods-owner"),
                      annotations={URGENT_ANNOTATION: "true"})])
    wls = {w.key: w for w in manager.workloads}
    found = classes_from_manager(worker, wls.get, lambda _n, _m: None)
    assert found.unknown == {"team-a/js": OWNER_NOT_READ, "team-a/ray": OWNER_NOT_READ}
    assert class_of(found.snapshot, "pods") is PriorityClass.URGENT
    plan = compute_plan(found.snapshot, settings(), NOW)
    held = hold_unknown(plan, found.unknown)
    assert held.counts == {OWNER_NOT_READ: 2}
    by = {d.key: d for d in held.plan.decisions}
    for key in ("team-a/js", "team-a/ray"):
        assert by[key].leave_unchanged, by[key]
        assert "batch/v1 Job (JobSet, RayJob" in by[key].problems[-1].message
    assert not by["team-a/pods"].leave_unchanged
    # what the plan alone would have done: the urgent-stand-in JobSet copy planned as normal
    js = next(d for d in plan.decisions if d.key == "team-a/js")
    assert js.target_priority < 1_500_000 and not js.leave_unchanged


def test_the_controllers_own_annotations_on_a_copy_are_kept() -> None:
    boost = {KUEUE_PRIORITY_BOOST_ANNOTATION: "1500000"}
    worker, manager = worker_and_manager(dict(boost), {}, {URGENT_ANNOTATION: "true"})
    copy_wl = next(w for w in overlay(worker, manager).workloads if w.name == "w")
    assert dict(copy_wl.annotations) == boost


def test_no_copies_no_change() -> None:
    snap = build_snapshot([workload_dict("a", queue="lq")])
    found = classes_from_manager(snap, lambda _k: None, lambda _n, _m: None)
    assert found.snapshot is snap and not found.unknown


def test_live_worker_orders_copies_by_the_managers_classes_and_never_writes_the_manager() -> None:
    from controller.live.api import JOBS
    from tests.support.fake_cluster import (
        cluster,
        controller,
        live_settings,
        resync,
        stored,
        workload,
    )

    worker, manager = FakeApi(), FakeApi()
    cluster(worker)
    cluster(manager)
    for api in (worker, manager):
        workload(api, "team-a", "a1", minutes_ago=20)
        workload(api, "team-b", "b1", minutes_ago=10, owner="b1-job")
    for name in ("a1", "b1"):  # copies on the worker; urgent set there is ignored
        obj = stored(worker, "team-a" if name == "a1" else "team-b", name)
        obj["metadata"]["labels"] = {MULTIKUEUE_ORIGIN_LABEL: "manager-1"}
        obj["metadata"]["annotations"] = {URGENT_ANNOTATION: "true"} if name == "b1" else {}
        worker.put_object(WORKLOADS.item(name, obj["metadata"]["namespace"]), obj)
    manager.put_object(JOBS.item("b1-job", "team-b"), {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "b1-job", "namespace": "team-b", "uid": "uid-b1-job",
                     "labels": {"kueue.x-k8s.io/queue-name": "lq"}, "annotations": {}},
        "spec": {"template": {"spec": {"containers": []}}}})
    c = controller(worker, live_settings(), manager=manager)
    report = c.run_cycle(NOW)
    head = [d.key for d in report.plan.decisions if d.rank == 0]
    assert head == ["team-a/a1"]  # the older one: b1 is urgent on the worker only
    # a lead approves b1's Job on the manager: the worker's next cycle puts b1 first
    job = manager.get_object(JOBS.item("b1-job", "team-b"))
    assert job is not None
    job["metadata"]["annotations"] = {APPROVED_ANNOTATION: "true"}
    manager.put_object(JOBS.item("b1-job", "team-b"), job)
    resync(c)
    report = c.run_cycle(NOW)
    assert [d.key for d in report.plan.decisions if d.rank == 0] == ["team-b/b1"]
    assert manager.writes() == []
    assert any("/jobs" in path for _, path in manager.requests)


def test_live_worker_leaves_copies_alone_while_the_manager_has_no_record_of_them() -> None:
    from tests.support.fake_cluster import cluster, controller, live_settings, stored, workload

    worker, manager = FakeApi(), FakeApi()
    cluster(worker)
    cluster(manager)  # reachable, but none of the copies' manager Workloads is there
    workload(worker, "team-a", "own", annotations={URGENT_ANNOTATION: "true"})
    copy_wl = workload(worker, "team-b", "copy", annotations={URGENT_ANNOTATION: "true"})
    copy_wl["metadata"]["labels"] = {MULTIKUEUE_ORIGIN_LABEL: "manager-1"}
    worker.put_object(WORKLOADS.item("copy", "team-b"), copy_wl)
    c = controller(worker, live_settings(), manager=manager)
    report = c.run_cycle(NOW)
    assert {ch.ref.name for ch in report.changes} == {"own"}, report.changes
    assert "annotations" not in stored(worker, "team-b", "copy")["metadata"] or \
        KUEUE_PRIORITY_BOOST_ANNOTATION not in stored(worker, "team-b", "copy")["metadata"][
            "annotations"]


def test_live_worker_counts_the_copies_it_holds_by_reason() -> None:
    """wdrf_multikueue_held_copies{reason}: a JobSet's copy (owner-not-read) and a copy the
    manager has no record of (origin-unknown), neither written; a Job's copy is written."""
    from tests.support.fake_cluster import cluster, controller, live_settings, stored, workload

    worker, manager = FakeApi(), FakeApi()
    cluster(worker)
    cluster(manager)
    for name in ("js", "lost", "plain"):
        obj = workload(worker, "team-a", name)
        obj["metadata"]["labels"] = {MULTIKUEUE_ORIGIN_LABEL: "manager-1"}
        worker.put_object(WORKLOADS.item(name, "team-a"), obj)
    for name in ("js", "plain"):
        workload(manager, "team-a", name)
    js = stored(manager, "team-a", "js")
    js["metadata"]["ownerReferences"] = [{
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js",
        "uid": "uid-js", "controller": True}]
    manager.put_object(WORKLOADS.item("js", "team-a"), js)
    c = controller(worker, live_settings(), manager=manager)
    report = c.run_cycle(NOW)
    assert {ch.ref.name for ch in report.changes} == {"plain"}, report.changes
    text = generate_latest(c.metrics.registry).decode()
    assert 'wdrf_multikueue_held_copies{reason="owner-not-read"} 1.0' in text
    assert 'wdrf_multikueue_held_copies{reason="origin-unknown"} 1.0' in text
    by = {d.key: d for d in report.plan.decisions}
    assert "JobSet" in by["team-a/js"].problems[-1].message


def test_a_copy_of_a_jobset_takes_the_class_of_the_managers_jobset() -> None:
    """Where the manager's JobSets are read, a JobSet's copy is planned with the manager
    JobSet's class (urgent there), not the worker-side JobSet's (approved there); a JobSet the
    manager has no record of (yet) leaves its copy unchanged as origin-unknown; a kind not read
    there as owner-not-read."""
    from controller.domain import OwnerInfo

    copies = [workload_dict(n, queue="lq", labels={MULTIKUEUE_ORIGIN_LABEL: "manager-1"},
                            owner=(kind, n)) for n, kind in
              (("js", "JobSet"), ("gone", "JobSet"), ("ray", "RayJob"))]
    worker_js = OwnerInfo("JobSet", "jobset.x-k8s.io/v1alpha2", "team-a", "js", "worker-uid",
                          annotations={APPROVED_ANNOTATION: "true"})
    worker = dataclasses.replace(build_snapshot(copies), owners=(worker_js,))
    manager = build_snapshot([workload_dict(n, queue="lq", owner=(kind, n)) for n, kind in
                              (("js", "JobSet"), ("gone", "JobSet"), ("ray", "RayJob"))])
    js_ref = next(w.owner for w in manager.workloads if w.name == "js")
    assert js_ref is not None
    manager_js = OwnerInfo("JobSet", js_ref.api_version, "team-a", "js", js_ref.uid,
                           annotations={URGENT_ANNOTATION: "true"})
    wls = {w.key: w for w in manager.workloads}

    def owner(namespace: str, ref: Any) -> OwnerInfo | None:
        return manager_js if (namespace, ref.kind, ref.name) == ("team-a", "JobSet", "js") \
            else None

    found = classes_from_manager(worker, wls.get, lambda _n, _m: None, owner,
                                 frozenset({"jobset.x-k8s.io/JobSet"}))
    assert found.unknown == {"team-a/gone": ORIGIN_UNKNOWN, "team-a/ray": OWNER_NOT_READ}
    assert found.snapshot.owners == (manager_js,)
    plan = compute_plan(found.snapshot, settings(), NOW)
    d = next(d for d in plan.decisions if d.key == "team-a/js")
    assert d.breakdown is not None and d.breakdown.priority_class is PriorityClass.URGENT


def test_live_worker_reads_the_managers_jobsets_where_the_manager_serves_them() -> None:
    """The manager serves JobSets: the worker's controller watches them there (read only)
    and plans the copy of an urgent JobSet as urgent, ahead of an older normal Job's copy."""
    from controller.live.api import JOBS
    from tests.support.fake_cluster import (
        cluster,
        controller,
        live_settings,
        stored,
        urgent_jobset,
        workload,
    )

    worker, manager = FakeApi(), FakeApi()
    cluster(worker)
    cluster(manager)
    urgent_jobset(manager)
    for api in (worker, manager):
        workload(api, "team-b", "old", minutes_ago=60, owner="old-job")
        workload(api, "team-a", "train", minutes_ago=1)
    manager.put_object(JOBS.item("old-job", "team-b"), {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "old-job", "namespace": "team-b", "uid": "uid-old-job",
                     "labels": {"kueue.x-k8s.io/queue-name": "lq"}, "annotations": {}},
        "spec": {"template": {"spec": {"containers": []}}}})
    js = stored(manager, "team-a", "train")
    js["metadata"]["ownerReferences"] = [{"apiVersion": "jobset.x-k8s.io/v1alpha2",
                                          "kind": "JobSet", "name": "train", "uid": "uid-js",
                                          "controller": True}]
    manager.put_object(WORKLOADS.item("train", "team-a"), js)
    for ns, name in (("team-b", "old"), ("team-a", "train")):
        obj = stored(worker, ns, name)
        obj["metadata"]["labels"] = {MULTIKUEUE_ORIGIN_LABEL: "manager-1"}
        if name == "train":
            obj["metadata"]["ownerReferences"] = [{
                "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train",
                "uid": "uid-worker-js", "controller": True}]
        worker.put_object(WORKLOADS.item(name, ns), obj)
    c = controller(worker, live_settings(), manager=manager)
    assert "manager-owners-jobsets" in c.informers
    report = c.run_cycle(NOW)
    assert [d.key for d in report.plan.decisions if d.rank == 0] == ["team-a/train"]
    by = {d.key: d for d in report.plan.decisions}
    assert not by["team-a/train"].leave_unchanged, by["team-a/train"].problems
    assert {ch.ref.name for ch in report.changes} == {"old", "train"}
    assert manager.writes() == []
