"""Parsing Kubernetes objects: Kueue v1beta1 and v1beta2 mixed, Jobs, files, bad input."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import Settings
from controller.domain import GPU, KueueApiVersion
from controller.parse import (
    SnapshotFileError,
    build_snapshot,
    load_snapshot,
    parse_cluster_queue,
    parse_workload,
)
from controller.policy import compute_plan
from tests.support.builders import (
    NOW,
    V1B1,
    V1B2,
    as_list,
    cluster_queue_dict,
    job_dict,
    local_queue_dict,
    workload_dict,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.mark.parametrize("api", [V1B1, V1B2])
def test_workload_both_versions(api: str) -> None:
    w, problems = parse_workload(workload_dict(api=api, priority=7, priority_class="high",
                                               requests={"cpu": "500m", "memory": "1Gi"},
                                               limits={GPU: "2"}, count=3))
    assert not problems and w is not None
    assert w.api_version is KueueApiVersion(api)
    assert w.priority == 7 and w.priority_class_name == "high"
    assert w.pending and not w.admitted
    assert w.pod_sets[0].count == 3
    assert w.pod_sets[0].per_pod() == {"cpu": Decimal("0.5"), "memory": Decimal(2**30),
                                       GPU: Decimal(2)}
    assert w.created == NOW - timedelta(seconds=60)


@pytest.mark.parametrize("api", [V1B1, V1B2])
def test_cluster_queue_both_versions(api: str) -> None:
    cq, problems = parse_cluster_queue(cluster_queue_dict(
        api=api, cohort="pool", preemption={"withinClusterQueue": "LowerPriority"}, afs=True))
    assert not problems and cq is not None
    assert cq.cohort == "pool" and cq.preemption.can_evict and cq.admission_fair_sharing
    assert cq.nominal() == {"cpu": Decimal(64), GPU: Decimal(8)}


def test_mixed_versions_in_one_list() -> None:
    snap = build_snapshot([as_list(
        workload_dict("old", api=V1B1, admitted_to="cq"),
        workload_dict("new", api=V1B2),
        cluster_queue_dict(api=V1B1),
        local_queue_dict("team-a", api=V1B1),
        job_dict("train"),
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
         "metadata": {"name": "default"}},
    )])
    assert not snap.problems
    assert {w.name: w.api_version for w in snap.workloads} == {
        "old": KueueApiVersion.V1BETA1, "new": KueueApiVersion.V1BETA2}
    assert snap.workloads[0].admission is not None and snap.workloads[0].quota_reserved
    assert len(snap.cluster_queues) == len(snap.local_queues) == len(snap.jobs) == 1
    plan = compute_plan(snap, Settings(), NOW)
    assert [d.key for d in plan.decisions] == ["team-a/new"]


def test_admitted_usage_from_status_admission() -> None:
    w, _ = parse_workload(workload_dict(admitted_to="cq", count=2,
                                        usage={"cpu": "4", GPU: "2"}))
    assert w is not None and w.admission is not None
    assert w.admission.cluster_queue == "cq"
    assert w.admission.usage == {"cpu": Decimal(4), GPU: Decimal(2)}


def test_finished_workload() -> None:
    w, _ = parse_workload(workload_dict(admitted_to="cq", finished=True))
    assert w is not None and w.finished and not w.pending


def _broken(mutate: Any) -> dict[str, Any]:
    obj = workload_dict("broken")
    mutate(obj)
    return obj


BAD_OBJECTS = [
    ("no name", lambda o: o["metadata"].pop("name"), "metadata.name"),
    ("no creation time", lambda o: o["metadata"].pop("creationTimestamp"),
     "metadata.creationTimestamp"),
    ("bad creation time", lambda o: o["metadata"].update(creationTimestamp="yesterday"),
     "metadata.creationTimestamp"),
    ("no spec", lambda o: o.pop("spec"), "spec"),
    ("spec is a list", lambda o: o.update(spec=[1]), "spec"),
    ("no queue", lambda o: o["spec"].pop("queueName"), "spec.queueName"),
    ("no pod sets", lambda o: o["spec"].update(podSets=[]), "spec.podSets"),
    ("count is text", lambda o: o["spec"]["podSets"][0].update(count="two"),
     "spec.podSets[0].count"),
]


@pytest.mark.parametrize(("why", "mutate", "field"), BAD_OBJECTS, ids=[b[0] for b in BAD_OBJECTS])
def test_unusable_workload_is_one_problem_and_the_rest_goes_on(
    why: str, mutate: Any, field: str
) -> None:
    snap = build_snapshot([as_list(_broken(mutate), workload_dict("fine"))])
    assert [w.name for w in snap.workloads] == ["fine"]
    [p] = snap.problems
    assert p.field == field and "skipped" in p.message


BAD_FIELDS = [
    ("bad quantity", {"requests": {"cpu": "lots"}},
     "spec.podSets[0].template.spec.containers[0].resources.requests.cpu"),
    ("gpumem 8Gi", {"requests": {GPU: "1", "nvidia.com/gpumem": "8Gi"}}, "nvidia.com/gpumem"),
]


@pytest.mark.parametrize(("why", "kw", "field"), BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_bad_field_leaves_the_workload_unchanged(why: str, kw: dict[str, Any], field: str) -> None:
    snap = build_snapshot([as_list(workload_dict("w", **kw), cluster_queue_dict(),
                                   local_queue_dict("team-a"))])
    plan = compute_plan(snap, Settings(), NOW)
    [d] = plan.decisions
    assert d.leave_unchanged
    assert any(field in p.field for p in d.problems)
    assert all(p.object is not None and p.object.name == "w" for p in d.problems)


def test_missing_status_is_pending_and_fine() -> None:
    w, problems = parse_workload(workload_dict())
    assert w is not None and not problems and w.pending


def test_quota_reserved_without_admission_is_reported() -> None:
    obj = workload_dict(admitted_to="cq")
    del obj["status"]["admission"]
    w, problems = parse_workload(obj)
    assert w is not None and w.quota_reserved and w.admission is None
    assert problems[0].field == "status.admission"


def test_status_not_a_mapping() -> None:
    obj = workload_dict()
    obj["status"] = "weird"
    w, problems = parse_workload(obj)
    assert w is not None and problems[0].field == "status"


def test_non_string_annotation_is_reported() -> None:
    w, problems = parse_workload(workload_dict(annotations={"wdrf.x-k8s.io/urgent": True}))
    assert w is not None and "wdrf.x-k8s.io/urgent" not in w.annotations
    assert problems[0].field == "metadata.annotations[wdrf.x-k8s.io/urgent]"


def test_unsupported_kueue_version_and_garbage_items() -> None:
    obj = workload_dict()
    obj["apiVersion"] = "kueue.x-k8s.io/v1alpha1"
    snap = build_snapshot([as_list(obj, "a string", {"no": "kind"}, workload_dict("ok"))])
    assert [w.name for w in snap.workloads] == ["ok"]
    fields = [p.field for p in snap.problems]
    assert fields == ["apiVersion", "items[1]", "items[2]"]


def test_job_parsing() -> None:
    tmpl = {"hami.io/node-scheduler-policy": "spread"}
    snap = build_snapshot([job_dict("train", annotations={"wdrf.x-k8s.io/urgent": "true"},
                                    template_annotations=tmpl)])
    [j] = snap.jobs
    assert j.annotations["wdrf.x-k8s.io/urgent"] == "true"
    assert j.template_annotations["hami.io/node-scheduler-policy"] == "spread"
    assert j.suspended and j.containers[0].resources[GPU] == 1


def test_observed_is_newest_workload_timestamp() -> None:
    snap = build_snapshot([as_list(workload_dict("a", age=100), workload_dict("b", age=10))])
    assert snap.observed is not None and (NOW - snap.observed).total_seconds() == 10


# ---------------------------------------------------------------------------- files


def test_files_directory_json_and_multi_doc(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        yaml.safe_dump(workload_dict("a")) + "---\n" + yaml.safe_dump(cluster_queue_dict()))
    (tmp_path / "b.json").write_text(json.dumps(as_list(workload_dict("b"))))
    (tmp_path / "notes.txt").write_text("ignored")
    snap = load_snapshot([tmp_path])
    assert sorted(w.name for w in snap.workloads) == ["a", "b"]
    assert len(snap.cluster_queues) == 1


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("bad.yaml", "items: [1, 2\nkind: List\n", "bad.yaml:"),
        ("bad.json", '{"items": [}', "bad.json:1:"),
        ("scalar.yaml", "just a string\n", "not an object"),
        ("empty.yaml", "", "no documents"),
    ],
)
def test_unparseable_file_raises_with_where(tmp_path: Path, name: str, text: str,
                                            where: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(SnapshotFileError, match=where.replace(".", r"\.")):
        load_snapshot([tmp_path / name])


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(SnapshotFileError, match="no such file"):
        load_snapshot([tmp_path / "nope.yaml"])


def test_example_snapshot_parses_cleanly() -> None:
    snap = load_snapshot([REPO / "examples" / "cluster-snapshot.yaml"])
    assert len(snap.workloads) >= 10 and len(snap.cluster_queues) == 2
    assert {w.namespace for w in snap.workloads} >= {"team-vision", "team-nlp", "team-speech"}
    assert len(snap.jobs) == 2
    assert not snap.problems
    plan = compute_plan(snap, Settings(), snap.observed or NOW)
    bad = [d for d in plan.decisions if d.leave_unchanged]
    assert [d.key for d in bad] == ["team-speech/job-tts-demo-1f2e3"]


# Real output captured from the control plane (tests/fixtures, added by the control-plane work).
REAL = sorted(FIXTURES.glob("real-snapshot*.yaml")) if FIXTURES.exists() else []


@pytest.mark.skipif(not REAL, reason="no captured real snapshot in tests/fixtures yet")
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_snapshot_parses(path: Path) -> None:
    snap = load_snapshot([path])
    assert snap.workloads or snap.cluster_queues
    structural = [p for p in snap.problems if "skipped" in p.message]
    assert not structural, [str(p) for p in structural]
    compute_plan(snap, Settings(), snap.observed or NOW)


def test_owners_of_integrated_kinds_are_read_for_their_annotations() -> None:
    from controller.parse import build_snapshot

    snap = build_snapshot([{
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "train", "namespace": "team-a", "uid": "js-uid",
                     "annotations": {"wdrf.x-k8s.io/approved": "true"}},
    }, {"apiVersion": "example.com/v1", "kind": "Unrelated",
        "metadata": {"name": "x", "namespace": "team-a"}}])
    [o] = snap.owners
    assert (o.kind, o.name, o.uid, dict(o.annotations)) == (
        "JobSet", "train", "js-uid", {"wdrf.x-k8s.io/approved": "true"})
    assert not snap.problems


def test_the_preemptor_is_read_from_the_evicted_condition() -> None:
    from controller.parse import parse_workload

    def evicted(status: str, reason: str, message: object) -> str:
        obj = {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "w", "namespace": "ns", "uid": "u",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1, "template": {
                "spec": {"containers": [{"name": "c"}]}}}]},
            "status": {"conditions": [
                {"type": "Evicted", "status": status, "reason": reason, "message": message,
                 "lastTransitionTime": "2026-01-01T01:00:00Z"}]},
        }
        w, _ = parse_workload(obj)
        assert w is not None
        return w.preempted_for

    kueue = ("Preempted to accommodate a workload (UID: 1b2c-3d, JobUID: 9f) due to "
             "prioritization in the ClusterQueue; preemptor path: /cq; preemptee path: /cq")
    assert evicted("True", "Preempted", kueue) == "1b2c-3d"
    assert evicted("True", "Preempted", "Preempted to accommodate a workload (UID: 7a) due "
                   "to reclamation within the cohort") == "7a"  # older Kueue: no JobUID
    assert evicted("True", "Preempted", kueue.replace("1b2c-3d", "UNKNOWN")) == ""
    assert evicted("False", "QuotaReserved", "Previously: " + kueue) == ""  # admitted again
    assert evicted("True", "PodsReadyTimeout", kueue) == ""
    assert evicted("True", "Preempted", None) == evicted("True", "Preempted", 3) == ""


def test_reservation_and_preemption_times_are_read_from_conditions() -> None:
    from controller.parse import parse_workload

    obj = {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": "w", "namespace": "ns", "uid": "u",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1, "template": {
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}}]},
        "status": {
            "admission": {"clusterQueue": "cq", "podSetAssignments": []},
            "conditions": [
                {"type": "QuotaReserved", "status": "True",
                 "lastTransitionTime": "2026-01-01T02:00:00Z"},
                {"type": "Evicted", "status": "True", "reason": "Preempted",
                 "lastTransitionTime": "2026-01-01T01:00:00Z"},
            ]},
    }
    w, _ = parse_workload(obj)
    assert w is not None
    assert w.reserved_since is not None and w.reserved_since.hour == 2
    assert w.preempted_at is not None and w.preempted_at.hour == 1
    obj["status"]["conditions"][1]["reason"] = "PodsReadyTimeout"  # type: ignore[index]
    w, _ = parse_workload(obj)
    assert w is not None and w.preempted_at is None and w.last_eviction is not None
    assert w.preemption_cleared_at is None and w.last_preemption is None
    # Admitted again after the preemption: Kueue sets Preempted=False, reason QuotaReserved.
    obj["status"]["conditions"][1:] = [  # type: ignore[index]
        {"type": "Evicted", "status": "False", "reason": "QuotaReserved",
         "lastTransitionTime": "2026-01-01T02:00:00Z"},
        {"type": "Preempted", "status": "False", "reason": "QuotaReserved",
         "message": "Previously: Preempted to accommodate a workload",
         "lastTransitionTime": "2026-01-01T02:00:00Z"}]
    w, _ = parse_workload(obj)
    assert w is not None and w.preempted_at is None
    assert w.preemption_cleared_at is not None and w.preemption_cleared_at.hour == 2
    assert w.last_preemption == w.preemption_cleared_at
