"""MultiKueue on a manager, on the real plane (no workers): in spec mode the controller never
writes spec.priority to a Workload of a ClusterQueue that dispatches through MultiKueue (Kueue
would delete the remote copies), while it does write to the same kind of Workload in a plain
ClusterQueue beside it. Witnessed by the apiserver's audit log and the Workloads as stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client as k8s

from controller.domain import MULTIKUEUE_CONTROLLER, URGENT_ANNOTATION
from controller.live.kube import KubeTransport
from controller.live.runner import LiveController
from tests.plane import live_audit as audit
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.plane import Plane

pytestmark = pytest.mark.plane


def test_spec_mode_writes_nothing_to_a_multikueue_cluster_queue(
    plane: Plane, api: k8s.ApiClient, kubeconfig: Path
) -> None:
    ns = kube.create_namespace(api)
    check = kube.unique_name("mk")
    cq_mk, cq_plain = kube.unique_name("cq-mk"), kube.unique_name("cq-plain")
    kube.request(api, "POST", kube.kueue_path("admissionchecks"), {
        "apiVersion": f"{kube.KUEUE_GROUP}/{kube.KUEUE_VERSION}", "kind": "AdmissionCheck",
        "metadata": {"name": check},
        "spec": {"controllerName": MULTIKUEUE_CONTROLLER, "parameters": {
            "apiGroup": kube.KUEUE_GROUP, "kind": "MultiKueueConfig", "name": check}}})
    kube.create_cluster_queue(api, cq_mk, {"cpu": 0}, extra_spec={
        "admissionChecksStrategy": {"admissionChecks": [{"name": check}]}})
    kube.create_cluster_queue(api, cq_plain, {"cpu": 0})
    try:
        kube.create_local_queue(api, ns, "to-mk", cq_mk)
        kube.create_local_queue(api, ns, "to-plain", cq_plain)
        wls: dict[str, str] = {}
        for job, queue in (("mk-urgent", "to-mk"), ("mk-normal", "to-mk"),
                           ("plain-urgent", "to-plain"), ("plain-normal", "to-plain")):
            ann = {URGENT_ANNOTATION: "true"} if job.endswith("urgent") else {}
            h.create_job(api, ns, job, queue, annotations=ann)
            wls[job] = h.job_workload(api, ns, job)
            h.wait_pending(api, ns, wls[job])
        identity = kube.unique_name("mk")
        transport = KubeTransport.from_config(str(kubeconfig),
                                              user_agent=audit.UA_PREFIX + identity)
        c = LiveController(h.live_settings(PRIORITY_MODE="spec"), transport, identity=identity)
        with h.started(c):
            report = h.converge(c)
        assert c.mode is not None and c.mode.mode.value == "spec"
        written = {w.name for w in audit.controller_writes(
            plane.audit_events(audit.UA_PREFIX + identity))
            if w.resource == "workloads" and w.namespace == ns}
        assert wls["plain-urgent"] in written  # the controller did act on this plane
        assert not written & {wls["mk-urgent"], wls["mk-normal"]}, written
        for job in ("mk-urgent", "mk-normal"):
            stored = kube.get_workload(api, ns, wls[job])
            assert stored["spec"].get("priority", 0) == 0
            assert "wdrf.x-k8s.io/base-priority" not in stored["metadata"].get("annotations", {})
        assert kube.get_workload(api, ns, wls["plain-urgent"])["spec"]["priority"] > 0
        assert any(f"ClusterQueue {cq_mk}" in w for w in report.plan.warnings)
    finally:
        h.cleanup(api, [ns], [cq_mk, cq_plain])
        kube.request(api, "DELETE", kube.kueue_path("admissionchecks", check))
