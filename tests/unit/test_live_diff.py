"""The pure diff: plan decisions + current objects -> minimal patches."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import replace
from typing import Any

import pytest

from controller.domain import (
    APPLIED_PRIORITY_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    HAMI_GPU_POLICY_ANNOTATION,
    HAMI_NODE_POLICY_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
)
from controller.live.api import (
    JOBS,
    JSON_PATCH,
    PODS,
    STRATEGIC_MERGE_PATCH,
    WORKLOADS,
)
from controller.live.diff import (
    GPU_FRACTION,
    HAMI_ANNOTATIONS,
    diff_job_hami,
    diff_pods_hami,
    diff_priority,
    pointer,
    redo,
)
from controller.plan import HamiDecision, PriorityMode, WorkloadDecision
from controller.workload import PriorityTarget, priority_patch
from tests.support.fake import json_patch, merge_patch, strategic_merge_patch


def decision(
    base: int = 10, boost: int = 500, hami: HamiDecision | None = None, leave: bool = False
) -> WorkloadDecision:
    return WorkloadDecision(
        key="team-a/wl", uid="u1", cluster_queue="cq", team="team-a", rank=0,
        base_priority=base, current_priority=None, current_boost=None,
        target_boost=boost, target_priority=base + boost, breakdown=None, hami=hami,
        leave_unchanged=leave,
    )


def workload(
    priority: int | None = 10, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "metadata": {"name": "wl", "namespace": "team-a", "uid": "u1", "resourceVersion": "7"},
        "spec": {"queueName": "lq"}, "status": {},
    }
    if priority is not None:
        wl["spec"]["priority"] = priority
    if annotations is not None:
        wl["metadata"]["annotations"] = annotations
    return wl


def job(suspend: bool = True, started: bool = False, template_ann: dict[str, str] | None = None,
        limits: dict[str, str] | None = None) -> dict[str, Any]:
    j: dict[str, Any] = {
        "metadata": {"name": "train", "namespace": "team-a", "uid": "j1"},
        "spec": {
            "suspend": suspend,
            "template": {
                "metadata": {"annotations": dict(template_ann or {})},
                "spec": {"containers": [
                    {"name": "main",
                     "resources": {"limits": dict(limits or {"nvidia.com/gpu": "1"})}},
                    {"name": "side", "resources": {"limits": {"cpu": "1"}}},
                ]},
            },
        },
        "status": {"startTime": "2026-01-01T00:00:00Z"} if started else {},
    }
    return j


def apply(obj: dict[str, Any], change: Any) -> dict[str, Any]:
    if change.content_type == JSON_PATCH:
        return json_patch(obj, change.body)
    if change.content_type == STRATEGIC_MERGE_PATCH:
        return dict(strategic_merge_patch(obj, change.body))
    return dict(merge_patch(obj, change.body))


# -- boost mode -------------------------------------------------------------------------------


UID_TEST = {"op": "test", "path": "/metadata/uid", "value": "u1"}
# A pending decision is written only while the Workload still holds no quota.
PENDING_TEST = {"op": "test", "path": "/status/admission", "value": None}


def test_boost_mode_writes_only_the_boost_annotation_for_this_uid() -> None:
    change = diff_priority(decision(), workload(), WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    assert change.content_type == JSON_PATCH
    assert change.body == [
        UID_TEST, PENDING_TEST,
        {"op": "test", "path": "/metadata/annotations", "value": None},  # still none
        {"op": "add", "path": "/metadata/annotations", "value": {}},
        {"op": "add", "path": "/metadata/annotations/kueue.x-k8s.io~1priority-boost",
         "value": "500"},
    ]
    assert apply(workload(), change)["metadata"]["annotations"] == {
        KUEUE_PRIORITY_BOOST_ANNOTATION: "500"}


def test_every_workload_patch_tests_the_uid_so_a_recreated_workload_is_never_patched() -> None:
    old = workload(priority=10)
    for mode in (PriorityMode.BOOST, PriorityMode.SPEC):
        change = diff_priority(decision(), old, WORKLOADS, mode)
        assert change is not None and change.body[0] == UID_TEST
        recreated = workload(priority=10)
        recreated["metadata"]["uid"] = "u2"  # deleted and created again, same name
        with pytest.raises(Exception, match="422"):
            json_patch(recreated, change.body)
        assert redo(change, recreated) is None  # the re-read drops the stale change


def test_terms_are_written_in_the_same_patch_as_the_priority() -> None:
    d = dataclasses.replace(decision(), terms="class=normal;ref=1")
    for mode in (PriorityMode.BOOST, PriorityMode.SPEC):
        change = diff_priority(d, workload(), WORKLOADS, mode)
        assert change is not None
        after = apply(workload(), change)
        assert after["metadata"]["annotations"][PRIORITY_TERMS_ANNOTATION] == "class=normal;ref=1"
        assert diff_priority(d, after, WORKLOADS, mode) is None


def test_boost_mode_steady_state_writes_nothing() -> None:
    wl = workload(annotations={KUEUE_PRIORITY_BOOST_ANNOTATION: "500"})
    assert diff_priority(decision(), wl, WORKLOADS, PriorityMode.BOOST) is None


def test_boost_zero_removes_the_annotation_and_absent_is_steady() -> None:
    wl = workload(annotations={KUEUE_PRIORITY_BOOST_ANNOTATION: "500"})
    change = diff_priority(decision(boost=0), wl, WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    assert change.body == [UID_TEST, PENDING_TEST, {
        "op": "test", "path": "/metadata/annotations/kueue.x-k8s.io~1priority-boost",
        "value": "500"}, {
        "op": "remove", "path": "/metadata/annotations/kueue.x-k8s.io~1priority-boost"}]
    after = apply(wl, change)
    assert diff_priority(decision(boost=0), after, WORKLOADS, PriorityMode.BOOST) is None


def test_boost_mode_restores_spec_priority_left_by_spec_mode() -> None:
    wl = workload(priority=510, annotations={BASE_PRIORITY_ANNOTATION: "10",
                                             APPLIED_PRIORITY_ANNOTATION: "510"})
    change = diff_priority(decision(), wl, WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    after = apply(wl, change)
    assert after["spec"]["priority"] == 10
    assert after["metadata"]["annotations"] == {KUEUE_PRIORITY_BOOST_ANNOTATION: "500"}
    assert diff_priority(decision(), after, WORKLOADS, PriorityMode.BOOST) is None


# -- spec mode --------------------------------------------------------------------------------


def test_spec_mode_tests_the_old_value_and_remembers_the_base() -> None:
    wl = workload(priority=10)
    change = diff_priority(decision(), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    assert change.content_type == JSON_PATCH
    assert change.body[:3] == [UID_TEST, PENDING_TEST,
                               {"op": "test", "path": "/spec/priority", "value": 10}]
    after = apply(wl, change)
    assert after["spec"]["priority"] == 510
    assert after["metadata"]["annotations"][BASE_PRIORITY_ANNOTATION] == "10"
    assert diff_priority(decision(), after, WORKLOADS, PriorityMode.SPEC) is None


def test_spec_mode_reasserts_after_kueue_reset() -> None:
    # Kueue reset spec.priority to the class value; our annotations survived.
    wl = workload(priority=10, annotations={BASE_PRIORITY_ANNOTATION: "10",
                                            APPLIED_PRIORITY_ANNOTATION: "510"})
    change = diff_priority(decision(), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    assert [op["op"] for op in change.body] == ["test", "test", "test", "add"]
    assert apply(wl, change)["spec"]["priority"] == 510


def test_spec_mode_writes_the_applied_priority_in_the_same_patch() -> None:
    wl = workload(priority=10, annotations={BASE_PRIORITY_ANNOTATION: "10"})  # from before it
    change = diff_priority(decision(), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    assert change.body[:3] == [UID_TEST, PENDING_TEST,
                               {"op": "test", "path": "/spec/priority", "value": 10}]
    assert {"op": "test", "path": "/metadata/annotations/wdrf.x-k8s.io~1applied-priority",
            "value": None} in change.body
    assert {"op": "add", "path": "/spec/priority", "value": 510} in change.body
    after = apply(wl, change)
    assert after["metadata"]["annotations"] == {BASE_PRIORITY_ANNOTATION: "10",
                                                APPLIED_PRIORITY_ANNOTATION: "510"}
    assert diff_priority(decision(), after, WORKLOADS, PriorityMode.SPEC) is None


def test_spec_mode_own_value_with_new_boost_keeps_the_base() -> None:
    wl = workload(priority=510, annotations={BASE_PRIORITY_ANNOTATION: "10",
                                             APPLIED_PRIORITY_ANNOTATION: "510"})
    change = diff_priority(decision(boost=700), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    after = apply(wl, change)
    assert after["spec"]["priority"] == 710
    assert after["metadata"]["annotations"] == {BASE_PRIORITY_ANNOTATION: "10",
                                                APPLIED_PRIORITY_ANNOTATION: "710"}


def test_spec_mode_new_base_rewrites_the_base_annotation() -> None:
    # spec.priority is neither ours nor the base: a class change; the policy took 40 as base.
    wl = workload(priority=40, annotations={BASE_PRIORITY_ANNOTATION: "10",
                                            APPLIED_PRIORITY_ANNOTATION: "510"})
    change = diff_priority(decision(base=40), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    assert change.body[2] == {"op": "test", "path": "/spec/priority", "value": 40}
    after = apply(wl, change)
    assert after["spec"]["priority"] == 540
    assert after["metadata"]["annotations"] == {BASE_PRIORITY_ANNOTATION: "40",
                                                APPLIED_PRIORITY_ANNOTATION: "540"}
    assert diff_priority(decision(base=40), after, WORKLOADS, PriorityMode.SPEC) is None


def test_spec_mode_redo_never_overwrites_a_new_base_with_a_stale_plan() -> None:
    wl = workload(priority=510, annotations={BASE_PRIORITY_ANNOTATION: "10",
                                             APPLIED_PRIORITY_ANNOTATION: "510"})
    change = diff_priority(decision(boost=700), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    moved = copy.deepcopy(wl)
    moved["spec"]["priority"] = 40  # a class change between read and write
    with pytest.raises(Exception, match="422"):
        json_patch(moved, change.body)
    assert redo(change, moved) is None  # the next cycle plans from base 40


def test_spec_mode_test_op_fails_when_someone_changed_the_priority() -> None:
    wl = workload(priority=10)
    change = diff_priority(decision(), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    moved = copy.deepcopy(wl)
    moved["spec"]["priority"] = 99
    with pytest.raises(Exception, match="422"):
        json_patch(moved, change.body)
    again = redo(change, moved)
    assert again is not None
    assert again.body[2] == {"op": "test", "path": "/spec/priority", "value": 99}


def test_spec_mode_back_to_base_drops_the_base_annotation() -> None:
    wl = workload(priority=510, annotations={BASE_PRIORITY_ANNOTATION: "10",
                                             APPLIED_PRIORITY_ANNOTATION: "510"})
    change = diff_priority(decision(boost=0), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    after = apply(wl, change)
    assert after["spec"]["priority"] == 10
    assert after["metadata"]["annotations"] == {}


def test_spec_mode_removes_boost_left_by_boost_mode() -> None:
    wl = workload(priority=10, annotations={KUEUE_PRIORITY_BOOST_ANNOTATION: "500"})
    change = diff_priority(decision(), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    after = apply(wl, change)
    assert KUEUE_PRIORITY_BOOST_ANNOTATION not in after["metadata"]["annotations"]
    assert after["spec"]["priority"] == 510


def test_spec_mode_without_priority_field_tests_that_it_is_still_absent() -> None:
    wl = workload(priority=None)
    change = diff_priority(decision(base=0), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    assert [op for op in change.body if op["op"] == "test"][:3] == [
        UID_TEST, PENDING_TEST, {"op": "test", "path": "/spec/priority", "value": None}]
    assert apply(wl, change)["spec"]["priority"] == 500


def test_leave_unchanged_never_writes() -> None:
    for mode in (PriorityMode.BOOST, PriorityMode.SPEC):
        assert diff_priority(decision(leave=True), workload(), WORKLOADS, mode) is None


def test_auto_mode_must_be_resolved() -> None:
    with pytest.raises(ValueError):
        diff_priority(decision(), workload(), WORKLOADS, PriorityMode.AUTO)


def test_pointer_escapes_slashes_and_tildes() -> None:
    assert pointer("metadata", "annotations", "a/b~c") == "/metadata/annotations/a~1b~0c"


def test_a_priority_change_builds_its_patch_when_asked() -> None:
    """All but WRITE_BUDGET of a cold start's changes wait: none holds its patch, and the
    body built when sent is the patch of the object as read."""
    obj = workload()
    c = diff_priority(decision(), obj, WORKLOADS, PriorityMode.SPEC)
    assert c is not None and callable(c.patch)
    target = PriorityTarget(decision().base_priority, decision().target_priority,
                            decision().target_boost, decision().terms, pending=True)
    expected = priority_patch(obj, PriorityMode.SPEC, target)
    assert expected is not None and c.body == expected.ops and c.body is not c.body
    assert (c.summary, c.old_terms) == (expected.summary, expected.old_terms)


def test_patches_of_different_workloads_share_their_path_strings() -> None:
    """Every deferred change is held until written: equal paths are one string."""
    a = diff_priority(decision(), workload(), WORKLOADS, PriorityMode.SPEC)
    b = diff_priority(decision(), copy.deepcopy(workload()), WORKLOADS, PriorityMode.SPEC)
    assert a is not None and b is not None and a.body == b.body
    for op_a, op_b in zip(a.body, b.body, strict=True):
        assert op_a["path"] is op_b["path"]
    key = "wdrf.x-k8s.io/" + "base-priority"  # built at run time: not a shared constant
    assert pointer("metadata", "annotations", key) is pointer("metadata", "annotations", key)


# -- HAMi ---------------------------------------------------------------------------------------

HAMI = HamiDecision(node_policy="binpack", gpu_policy="spread", gpucores=30, gpumem_percentage=25)


def test_hami_annotations_and_fraction_on_a_pristine_job() -> None:
    j = job()
    d = diff_job_hami(decision(hami=HAMI), j, JOBS, None)
    assert not d.notices
    whats = {c.what: c for c in d.changes}
    assert set(whats) == {HAMI_ANNOTATIONS, GPU_FRACTION}
    after = apply(apply(j, whats[HAMI_ANNOTATIONS]), whats[GPU_FRACTION])
    tmpl = after["spec"]["template"]
    assert tmpl["metadata"]["annotations"] == {
        HAMI_NODE_POLICY_ANNOTATION: "binpack", HAMI_GPU_POLICY_ANNOTATION: "spread"}
    main, side = tmpl["spec"]["containers"]
    assert main["resources"]["limits"] == {
        "nvidia.com/gpu": "1", GPUCORES: "30", GPUMEM_PERCENTAGE: "25"}
    assert side["resources"]["limits"] == {"cpu": "1"}
    assert diff_job_hami(decision(hami=HAMI), after, JOBS, None).changes == ()


def test_hami_only_missing_keys_are_patched() -> None:
    j = job(template_ann={HAMI_NODE_POLICY_ANNOTATION: "binpack", "user": "x"})
    d = diff_job_hami(decision(hami=HamiDecision(node_policy="binpack", gpu_policy="spread")),
                      j, JOBS, None)
    assert [c.body for c in d.changes] == [[
        {"op": "test", "path": "/metadata/uid", "value": "j1"},
        {"op": "test", "path": "/spec/suspend", "value": True},
        {"op": "test", "path": "/spec/template/metadata/annotations/hami.io~1gpu-scheduler-policy",
         "value": None},
        {"op": "add", "path": "/spec/template/metadata/annotations/hami.io~1gpu-scheduler-policy",
         "value": "spread"},
    ]]


def test_hami_writes_test_that_the_job_is_still_suspended() -> None:
    j = job()
    d = diff_job_hami(decision(hami=HAMI), j, JOBS, None)
    assert {c.what for c in d.changes} == {HAMI_ANNOTATIONS, GPU_FRACTION}
    unsuspended = copy.deepcopy(j)
    unsuspended["spec"]["suspend"] = False  # Kueue admitted it between our read and our patch
    for change in d.changes:
        assert change.content_type == JSON_PATCH
        assert {"op": "test", "path": "/spec/suspend", "value": True} in change.body
        with pytest.raises(Exception, match="422"):
            json_patch(unsuspended, change.body)
        assert redo(change, unsuspended) is None  # nothing to do for that Job any more


def test_fraction_addresses_containers_by_index_and_tests_their_names() -> None:
    j = job()
    fraction = next(c for c in diff_job_hami(decision(hami=HAMI), j, JOBS, None).changes
                    if c.what == GPU_FRACTION)
    reordered = copy.deepcopy(j)
    reordered["spec"]["template"]["spec"]["containers"].reverse()
    with pytest.raises(Exception, match="422"):
        json_patch(reordered, fraction.body)


def test_hami_on_started_job_is_a_notice_not_a_patch() -> None:
    d = diff_job_hami(decision(hami=HAMI), job(started=True), JOBS, None)
    assert d.changes == ()
    assert [n.reason for n in d.notices] == ["HamiSettingsNotApplied"]


def test_fraction_where_resources_are_immutable_is_a_notice() -> None:
    d = diff_job_hami(decision(hami=HAMI), job(), JOBS, False)
    assert [c.what for c in d.changes] == [HAMI_ANNOTATIONS]
    assert [n.reason for n in d.notices] == ["GpuFractionNotApplied"]
    assert "MutablePodResourcesForSuspendedJobs" in d.notices[0].message


def test_hami_nothing_when_decision_has_no_hami() -> None:
    d = diff_job_hami(decision(hami=None), job(), JOBS, None)
    assert d.changes == () and d.notices == ()


def test_gated_pods_get_annotations_ungated_are_left_alone() -> None:
    gated = {"metadata": {"name": "p1", "namespace": "team-a", "uid": "p1"},
             "spec": {"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
                      "containers": [{"name": "c", "resources": {}}]}}
    running = {"metadata": {"name": "p2", "namespace": "team-a", "uid": "p2"},
               "spec": {"containers": [{"name": "c", "resources": {}}]}}
    d = diff_pods_hami(decision(hami=HamiDecision(node_policy="spread")), [gated, running], PODS)
    assert [c.ref.name for c in d.changes] == ["p1"]
    change = d.changes[0]
    assert change.content_type == JSON_PATCH
    assert change.body[0] == {"op": "test", "path": "/metadata/uid", "value": "p1"}
    assert apply(gated, change)["metadata"]["annotations"] == {
        HAMI_NODE_POLICY_ANNOTATION: "spread"}
    recreated = {**gated, "metadata": {**gated["metadata"], "uid": "p1-new"}}
    with pytest.raises(Exception, match="422"):  # a failed test, as kube-apiserver answers it
        apply(recreated, change)  # the same name, another pod: the patch does not land


# -- compare-and-swap ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode,theirs", [
    (PriorityMode.BOOST, {KUEUE_PRIORITY_BOOST_ANNOTATION: "12345"}),  # another leader's boost
    (PriorityMode.BOOST, {PRIORITY_TERMS_ANNOTATION: "v2 class=urgent"}),  # ... its terms
    (PriorityMode.SPEC, {PRIORITY_TERMS_ANNOTATION: "v2 class=urgent"}),
    (PriorityMode.SPEC, {BASE_PRIORITY_ANNOTATION: "3"}),
    (PriorityMode.SPEC, {APPLIED_PRIORITY_ANNOTATION: "77"}),
])
def test_a_write_computed_from_a_stale_read_fails_whatever_field_changed(
        mode: PriorityMode, theirs: dict[str, str]) -> None:
    """Every field a priority write replaces is tested at the value it was read with: a
    patch computed before another writer set any of them fails as a whole (last writer does
    not win)."""
    read = workload(priority=10, annotations={"unrelated": "x"})
    change = diff_priority(dataclasses.replace(decision(), terms="v2 class=normal"), read,
                           WORKLOADS, mode)
    assert change is not None
    assert apply(read, change)  # against what it read: applies
    now = copy.deepcopy(read)
    now["metadata"]["annotations"].update(theirs)
    with pytest.raises(Exception, match="422"):
        json_patch(now, change.body)
    # Someone else's unrelated annotation does not make it fail.
    other = copy.deepcopy(read)
    other["metadata"]["annotations"]["someone/else"] = "y"
    json_patch(other, change.body)


def test_a_stale_spec_priority_and_a_stale_job_template_fail_too() -> None:
    read = workload(priority=10)
    change = diff_priority(decision(), read, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    moved = copy.deepcopy(read)
    moved["spec"]["priority"] = 11
    with pytest.raises(Exception, match="422"):
        json_patch(moved, change.body)
    j = job()
    d = diff_job_hami(decision(hami=HAMI), j, JOBS, None)
    for c in d.changes:
        changed = copy.deepcopy(j)
        if c.what == HAMI_ANNOTATIONS:
            changed["spec"]["template"]["metadata"]["annotations"] = {
                HAMI_NODE_POLICY_ANNOTATION: "spread"}  # a user's own choice, set meanwhile
        else:
            changed["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
                "nvidia.com/gpucores"] = "40"
        with pytest.raises(Exception, match="422"):
            json_patch(changed, c.body)


def test_a_pending_value_is_never_written_on_a_workload_kueue_admitted_since() -> None:
    """A Workload admitted between the plan's read and its write keeps the value Kueue admitted
    it at: the write's `test` of `status.admission` fails, and the re-read finds nothing to
    do (the next plan sees it admitted and guards it if need be)."""
    for mode in (PriorityMode.BOOST, PriorityMode.SPEC):
        wl = workload(priority=10)
        change = diff_priority(decision(), wl, WORKLOADS, mode)
        assert change is not None and PENDING_TEST in change.body
        admitted = copy.deepcopy(wl)
        admitted["status"]["admission"] = {"clusterQueue": "cq"}
        with pytest.raises(Exception, match="422"):
            json_patch(admitted, change.body)
        assert redo(change, admitted) is None
        assert diff_priority(decision(), admitted, WORKLOADS, mode) is None
        # A guard (a decision for an admitted Workload) is written whatever the status.
        guard = replace(decision(), admitted=True)
        assert diff_priority(guard, admitted, WORKLOADS, mode) is not None
