"""A Kueue cluster in the in-memory API server (`tests.support.fake.FakeApi`) and the live
controller on it: one ClusterQueue `cq` covering cpu, a LocalQueue `lq` in team-a and team-b,
Workloads and owner Jobs, and a synced `LiveController`. Times are relative to `NOW`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from controller.config import Settings, load_settings
from controller.domain import URGENT_ANNOTATION
from controller.live.api import (
    CLUSTER_QUEUES,
    CONFIG_MAPS,
    JOBS,
    LOCAL_QUEUES,
    WORKLOADS,
    Resource,
)
from controller.live.runner import LiveController
from tests.support.fake import FakeApi

NOW = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)
KUEUE_GROUP_DOC = {"kind": "APIGroup", "name": "kueue.x-k8s.io",
                   "versions": [{"groupVersion": "kueue.x-k8s.io/v1beta2", "version": "v1beta2"},
                                {"groupVersion": "kueue.x-k8s.io/v1beta1", "version": "v1beta1"}]}


def live_settings(**env: str) -> Settings:
    """Settings as the live tests run them: boost mode, quota capacity, no leader election."""
    base = {"METRICS_PORT": "0", "LEADER_ELECTION": "false", "CAPACITY_SOURCE": "quota",
            "PRIORITY_MODE": "boost"}
    return load_settings(env={**base, **env})


def cluster(api: FakeApi, gate: bool | None = None) -> None:
    api.static["/apis/kueue.x-k8s.io"] = KUEUE_GROUP_DOC
    if gate is not None:
        api.put_object(CONFIG_MAPS.item("kueue-manager-config", "kueue-system"), {
            "metadata": {"name": "kueue-manager-config"},
            "data": {"controller_manager_config.yaml":
                     f"apiVersion: config.kueue.x-k8s.io/v1beta1\nfeatureGates:\n"
                     f"  PriorityBoost: {str(gate).lower()}\n"}})
    api.put_object(CLUSTER_QUEUES.item("cq"), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}})
    for team in ("team-a", "team-b"):
        api.put_object(LOCAL_QUEUES.item("lq", team), {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "lq", "namespace": team}, "spec": {"clusterQueue": "cq"}})


def workload(api: FakeApi, ns: str, name: str, minutes_ago: int = 10,
             annotations: dict[str, str] | None = None, priority: int = 0,
             owner: str | None = None, gpu: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name, "namespace": ns, "annotations": annotations or {},
        "creationTimestamp": (NOW - timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner,
                                    "uid": f"uid-{owner}", "controller": True}]
    return api.put_object(WORKLOADS.item(name, ns), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": meta,
        "spec": {"queueName": "lq", "priority": priority, "podSets": [{
            "name": "main", "count": 1, "template": {"spec": {"containers": [
                {"name": "c", "resources": {"requests": {
                    "cpu": "1", **({"nvidia.com/gpu": "1"} if gpu else {})}}}]}}}]}})


def admitted_workload(api: FakeApi, ns: str, name: str, cpu: str) -> None:
    """A Workload Kueue admitted on ClusterQueue `cq`, using `cpu` cores."""
    wl = workload(api, ns, name)
    wl["status"] = {
        "conditions": [{"type": "QuotaReserved", "status": "True"}],
        "admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "main", "count": 1, "resourceUsage": {"cpu": cpu}, "flavors": {}}]}}
    api.put_object(WORKLOADS.item(name, ns), wl)


def controller(api: FakeApi, s: Settings, **kw: Any) -> LiveController:
    c = LiveController(s, api, identity=kw.pop("identity", "me"), **kw)
    c.discover()
    c.build_informers()
    c.sync_once()
    return c


def resync(c: LiveController) -> None:
    for inf in c.informers.values():
        inf.relist()


def stored(api: FakeApi, ns: str, name: str) -> dict[str, Any]:
    obj = api.get_object(WORKLOADS.item(name, ns))
    assert obj is not None
    return obj


def owner_job(api: FakeApi, name: str = "train", namespace: str = "team-a",
              annotations: dict[str, str] | None = None) -> None:
    """The suspended, never-started Job that `workload(..., owner=name)` is controlled by: one
    container with a GPU limit."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                            "labels": {"kueue.x-k8s.io/queue-name": "lq"}}
    if annotations is not None:
        meta["annotations"] = annotations
    api.put_object(JOBS.item(name, namespace), {
        "metadata": meta,
        "spec": {"suspend": True, "template": {"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})


JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")


def urgent_jobset(api: FakeApi, name: str = "train", namespace: str = "team-a") -> None:
    """The cluster serves JobSets (its discovery documents), and holds one Kueue-managed
    JobSet `name` (uid `uid-js`) annotated urgent."""
    api.static["/apis/jobset.x-k8s.io"] = {"kind": "APIGroup", "name": "jobset.x-k8s.io",
                                          "versions": [{"version": "v1alpha2"}]}
    api.static["/apis/jobset.x-k8s.io/v1alpha2"] = {"resources": [{"name": "jobsets"}]}
    api.put_object(JOBSETS.item(name, namespace), {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-js",
                     "labels": {"kueue.x-k8s.io/queue-name": "lq"},
                     "annotations": {URGENT_ANNOTATION: "true"}}})
