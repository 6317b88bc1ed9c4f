"""End to end (kube-controller-manager, scheduler, kwok GPU node): HAMi settings reach the
suspended Job's pod template before Kueue unsuspends it, and the pods the Job creates."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client as k8s

from controller.domain import (
    GPU_FRACTION_ANNOTATION,
    GPUCORES,
    GPUMEM_PERCENTAGE,
    HAMI_GPU_POLICY_ANNOTATION,
    HAMI_NODE_POLICY_ANNOTATION,
)
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.plane import Plane

pytestmark = [pytest.mark.plane, pytest.mark.e2e]


def test_hami_settings_on_suspended_job_template_and_its_pods(
    e2e_plane: Plane, api: k8s.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    ns = namespace
    node = f"gpu-{ns}"
    kube.create_gpu_node(api, node, gpus=2, labels={"wdrf-test/node": node},
                         extra_capacity={GPUCORES: "2000", GPUMEM_PERCENTAGE: "2000"})
    kube.wait_node_ready(api, node)
    flavor = f"gpu-{ns}"
    kube.create_resource_flavor(api, flavor, node_labels={"wdrf-test/node": node})
    # The queue covers HAMi's fraction resources: Kueue's default quotaCheckStrategy
    # (BlockUndeclared) would otherwise never admit a Job that asks for them.
    quota = {"cpu": 4, "nvidia.com/gpu": 0, GPUCORES: 200, GPUMEM_PERCENTAGE: 200}
    cq, _ = kube.create_queues(api, ns, quota, flavor=flavor)
    try:
        kube.create_job(api, ns, "train", "lq", requests={"cpu": "1", "nvidia.com/gpu": "1"},
                        annotations={GPU_FRACTION_ANNOTATION: "0.5"}, run_seconds=30)
        wl = h.job_workload(api, ns, "train")
        h.wait_pending(api, ns, wl)

        c = h.new_controller(kubeconfig, h.live_settings(CAPACITY_SOURCE="hami"))
        with h.started(c):
            h.converge(c)
            job = kube.get_job(api, ns, "train")
            assert job["spec"]["suspend"] is True  # still waiting for quota
            ann = job["spec"]["template"]["metadata"]["annotations"]
            # A 50 % GPU is fractional: the default HAMI_RULES pack it (binpack/binpack).
            assert ann[HAMI_NODE_POLICY_ANNOTATION] == "binpack"
            assert ann[HAMI_GPU_POLICY_ANNOTATION] == "binpack"
            limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
            mutable = not c.applier.refused_fraction(job["metadata"]["uid"])
            if mutable:
                assert limits[GPUCORES] == "50" and limits[GPUMEM_PERCENTAGE] == "50"
            else:
                # The cluster refused the resource change: an Event says so on the Job.
                assert GPUCORES not in limits
                assert h.events_for(api, ns, "train", "GpuFractionNotApplied")
            assert h.events_for(api, ns, "train", "HamiSettingsApplied")

            # Now give the queue a GPU: Kueue admits and unsuspends, the Job creates its pod.
            quota["nvidia.com/gpu"] = 1
            kube.request(api, "PATCH", kube.kueue_path("clusterqueues", cq),
                         {"spec": {"resourceGroups": [{
                             "coveredResources": list(quota),
                             "flavors": [{"name": flavor, "resources": [
                                 {"name": r, "nominalQuota": str(q)}
                                 for r, q in quota.items()]}]}]}})
            pod = kube.wait_for(lambda: next(iter(kube.request(
                api, "GET", f"/api/v1/namespaces/{ns}/pods",
                query={"labelSelector": "job-name=train"})["items"]), None), 90,
                "a pod of Job train", lambda: "; ".join(
                    kube.describe_workload(w) for w in kube.list_workloads(api, ns)))
        print("fraction written (resources mutable):", mutable)
        pod_ann = pod["metadata"].get("annotations") or {}
        assert pod_ann.get(HAMI_NODE_POLICY_ANNOTATION) == "binpack"
        assert pod_ann.get(HAMI_GPU_POLICY_ANNOTATION) == "binpack"
        if mutable:
            pod_limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert pod_limits[GPUCORES] == "50" and pod_limits[GPUMEM_PERCENTAGE] == "50"
    finally:
        h.cleanup(api, [ns], [cq])
