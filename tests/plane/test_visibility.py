"""Proof that the test plane serves Kueue's visibility API (`visibility.kueue.x-k8s.io`) through
kube-apiserver's aggregation layer, as a cluster does: discovery lists both versions, and the
`pendingworkloads` of a ClusterQueue and of its LocalQueues give Kueue's own queue order —
highest priority first, then oldest — with positions in the ClusterQueue and in each LocalQueue.

The order is checked against what the test set (spec.priority and creation order), not
against another reading of Kueue.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.plane import VISIBILITY_GROUP, VISIBILITY_VERSIONS, Plane

pytestmark = pytest.mark.plane

Obj = dict[str, Any]


def pending(api: k8s.ApiClient, version: str, path: str) -> list[Obj]:
    """The `items` of a pendingworkloads answer (`path`: clusterqueues/CQ or
    namespaces/NS/localqueues/LQ)."""
    doc = kube.request(api, "GET", f"/apis/{VISIBILITY_GROUP}/{version}/{path}/pendingworkloads")
    assert doc["kind"] == "PendingWorkloadsSummary", doc
    items: list[Obj] = doc["items"]
    return items


def test_discovery_lists_both_versions(plane: Plane, api: k8s.ApiClient) -> None:
    group = kube.request(api, "GET", f"/apis/{VISIBILITY_GROUP}")
    assert [v["version"] for v in group["versions"]] == list(VISIBILITY_VERSIONS)
    for version in VISIBILITY_VERSIONS:
        res = kube.request(api, "GET", f"/apis/{VISIBILITY_GROUP}/{version}")
        names = {r["name"]: r["verbs"] for r in res["resources"]}
        assert names["clusterqueues/pendingworkloads"] == ["get"], names
        assert names["localqueues/pendingworkloads"] == ["get"], names
    for version in VISIBILITY_VERSIONS:
        svc = kube.request(api, "GET", f"/apis/apiregistration.k8s.io/v1/apiservices/"
                                       f"{version}.{VISIBILITY_GROUP}")
        assert "insecureSkipTLSVerify" not in svc["spec"]  # the caBundle is checked
        available = [c for c in svc["status"]["conditions"] if c["type"] == "Available"]
        assert available and available[0]["status"] == "True", svc["status"]


def test_pending_workloads_in_kueue_order(api: k8s.ApiClient) -> None:
    with h.two_teams_on_a_full_queue(api) as (ns, other, cq):
        names: dict[str, tuple[str, str]] = {}  # job -> (namespace, workload)
        for job, job_ns in (("a", ns), ("b", ns), ("c", ns), ("d", other)):
            if names:
                time.sleep(1.1)  # creation times one second apart: the tie-break is known
            h.create_job(api, job_ns, job, "lq")
            names[job] = (job_ns, h.job_workload(api, job_ns, job))
        priorities = {"a": 0, "b": 50, "c": 100, "d": 75}
        for job, prio in priorities.items():
            if prio:
                kube.set_priority(api, *names[job], prio)
        expected = ["c", "d", "b", "a"]  # by priority; a (0) last
        wl_of = {wl: job for job, (_, wl) in names.items()}

        def cq_order() -> list[str] | None:
            items = pending(api, "v1beta2", f"clusterqueues/{cq}")
            order = [wl_of.get(i["metadata"]["name"], "?") for i in items]
            return order if order == expected else None

        kube.wait_for(cq_order, 30, f"Kueue's pending order {expected} in {cq}",
                      lambda: str([(i["metadata"]["name"], i["priority"]) for i in pending(
                          api, "v1beta2", f"clusterqueues/{cq}")]))

        for version in VISIBILITY_VERSIONS:
            items = pending(api, version, f"clusterqueues/{cq}")
            got = [(wl_of[i["metadata"]["name"]], i["metadata"]["namespace"], i["localQueueName"],
                    i["priority"], i["positionInClusterQueue"], i["positionInLocalQueue"])
                   for i in items]
            assert got == [("c", ns, "lq", 100, 0, 0), ("d", other, "lq", 75, 1, 0),
                           ("b", ns, "lq", 50, 2, 1), ("a", ns, "lq", 0, 3, 2)], (version, got)
            mine = pending(api, version, f"namespaces/{ns}/localqueues/lq")
            assert [(wl_of[i["metadata"]["name"]], i["positionInClusterQueue"],
                     i["positionInLocalQueue"]) for i in mine] == [
                ("c", 0, 0), ("b", 2, 1), ("a", 3, 2)], (version, mine)
            theirs = pending(api, version, f"namespaces/{other}/localqueues/lq")
            assert [(wl_of[i["metadata"]["name"]], i["positionInClusterQueue"],
                     i["positionInLocalQueue"]) for i in theirs] == [("d", 1, 0)], theirs
