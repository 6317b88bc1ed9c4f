"""Proof that the test control plane is real: Kueue admits, queues, orders by priority and
validates exactly as it does on a cluster. Every test uses its own namespace and queues."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.support import kube
from tests.support.plane import KUEUE_CONFIG_KEY, KUEUE_CONFIGMAP, KUEUE_NAMESPACE, Plane

pytestmark = pytest.mark.plane


def _one_slot_with_pending(api: k8s.ApiClient, ns: str, pending: int = 3) -> tuple[str, list[str]]:
    """One cpu of quota held by an admitted Workload, ``pending`` Workloads queued behind it
    (created one second apart, so creation order is unambiguous). Returns (running, pending)."""
    kube.create_queues(api, ns, {"cpu": 1})
    kube.create_job(api, ns, "running", "lq")
    running = kube.workload_for_job(api, ns, "running")["metadata"]["name"]
    kube.wait_for_workload_condition(api, ns, running, "Admitted")
    names = []
    for i in range(pending):
        if i:
            time.sleep(1.1)
        kube.create_job(api, ns, f"p{i}", "lq")
        names.append(kube.workload_for_job(api, ns, f"p{i}")["metadata"]["name"])
    # Kueue marks the head it tried (QuotaReserved=False, reason Pending); workloads behind it
    # may carry no QuotaReserved condition at all while they wait.
    kube.wait_for_workload_condition(api, ns, names[0], "QuotaReserved", "False",
                                     reason="Pending")
    time.sleep(1.0)
    for n in names:
        assert kube.is_pending(kube.get_workload(api, ns, n)), n
    return running, names


def _free_slot(api: k8s.ApiClient, ns: str, running: str) -> None:
    """Deactivate the running Workload so Kueue evicts it and releases its quota."""
    kube.patch_workload(api, ns, running, {"spec": {"active": False}})
    kube.wait_for_workload_condition(api, ns, running, "QuotaReserved", "False", timeout=30)


def _next_admitted(api: k8s.ApiClient, ns: str, candidates: list[str]) -> str:
    """Wait until exactly one of ``candidates`` holds quota and return it."""
    got = kube.wait_for(lambda: kube.admitted_names(api, ns) & set(candidates), 30,
                        f"one of {candidates} admitted in {ns}",
                        lambda: "; ".join(kube.describe_workload(w)
                                          for w in kube.list_workloads(api, ns)))
    time.sleep(1.0)  # let Kueue settle; no second admission may follow (one slot)
    got = kube.admitted_names(api, ns) & set(candidates)
    assert len(got) == 1, f"expected one admission, got {sorted(got)}"
    return got.pop()


def test_job_gets_v1beta2_workload_admitted_then_pending(api: k8s.ApiClient,
                                                          namespace: str) -> None:
    ns = namespace
    kube.create_queues(api, ns, {"cpu": 1, "memory": "1Gi"})
    # Created unsuspended: Kueue's mutating webhook must suspend it.
    job = kube.create_job(api, ns, "first", "lq", suspend=False,
                          requests={"cpu": "1", "memory": "512Mi"})
    assert job["spec"]["suspend"] is True, "Kueue's webhook did not suspend the Job"
    wl = kube.workload_for_job(api, ns, "first")
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert wl["spec"]["queueName"] == "lq"
    assert wl["metadata"]["ownerReferences"][0]["kind"] == "Job"
    name = wl["metadata"]["name"]
    assert name.startswith("job-first-")
    wl = kube.wait_for_workload_condition(api, ns, name, "QuotaReserved")
    wl = kube.wait_for_workload_condition(api, ns, name, "Admitted")
    assert wl["status"]["admission"]["clusterQueue"] == f"cq-{ns}"
    kube.wait_for(lambda: kube.get_job(api, ns, "first")["spec"]["suspend"] is False, 30,
                  "the admitted Job to be unsuspended")

    kube.create_job(api, ns, "second", "lq", requests={"cpu": "1"})
    second = kube.workload_for_job(api, ns, "second")["metadata"]["name"]
    wl2 = kube.wait_for_workload_condition(api, ns, second, "QuotaReserved", "False",
                                           reason="Pending")
    assert kube.is_pending(wl2)
    assert not kube.has_condition(wl2, "Admitted")
    assert kube.get_job(api, ns, "second")["spec"]["suspend"] is True

    # v1beta1 is still served, through Kueue's conversion webhook.
    old = kube.get_workload(api, ns, name, version="v1beta1")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert old["status"]["admission"]["clusterQueue"] == f"cq-{ns}"


def test_raising_spec_priority_admits_that_workload_next(api: k8s.ApiClient,
                                                         namespace: str) -> None:
    running, pending = _one_slot_with_pending(api, namespace)
    target = pending[-1]  # the youngest: FIFO would admit it last
    kube.set_priority(api, namespace, target, 100)
    _free_slot(api, namespace, running)
    assert _next_admitted(api, namespace, pending) == target


def test_priority_boost_annotation_admits_that_workload_next(api: k8s.ApiClient,
                                                             namespace: str) -> None:
    running, pending = _one_slot_with_pending(api, namespace)
    target = pending[-1]
    kube.set_priority_boost(api, namespace, target, 100)
    _free_slot(api, namespace, running)
    assert _next_admitted(api, namespace, pending) == target


def test_webhook_rejects_podset_change_of_admitted_workload(api: k8s.ApiClient,
                                                           namespace: str) -> None:
    ns = namespace
    kube.create_queues(api, ns, {"cpu": 4})
    kube.create_job(api, ns, "a", "lq")
    name = kube.workload_for_job(api, ns, "a")["metadata"]["name"]
    kube.wait_for_workload_condition(api, ns, name, "Admitted")
    with pytest.raises(ApiException) as err:
        kube.patch_workload(api, ns, name,
                            [{"op": "replace", "path": "/spec/podSets/0/count", "value": 2}])
    body = str(err.value.body)
    assert err.value.status in (403, 422), body
    message = json.loads(body)["message"]
    assert message.startswith('admission webhook "vworkload.kb.io" denied the request'), body
    assert "spec.podSets" in message and "field is immutable" in message, body
    # An allowed change on the same object still goes through the webhook fine.
    kube.set_priority(api, ns, name, 5)


def test_apiserver_restart_keeps_state_and_kueue_recovers(plane: Plane, api: k8s.ApiClient,
                                                          namespace: str) -> None:
    ns = namespace
    kube.create_queues(api, ns, {"cpu": 1})
    kube.create_job(api, ns, "before", "lq")
    before = kube.workload_for_job(api, ns, "before")["metadata"]["name"]
    kube.wait_for_workload_condition(api, ns, before, "Admitted")
    plane.stop_apiserver()
    time.sleep(2)
    plane.start_apiserver()
    plane.check_alive()  # Kueue must survive the outage
    assert kube.has_condition(kube.get_workload(api, ns, before), "Admitted")
    kube.patch_workload(api, ns, before, {"spec": {"active": False}})
    kube.create_job(api, ns, "after", "lq")
    after = kube.workload_for_job(api, ns, "after")["metadata"]["name"]
    kube.wait_for_workload_condition(api, ns, after, "Admitted", timeout=60)


@pytest.mark.e2e
def test_e2e_job_pods_run_on_kwok_gpu_node_and_free_quota(e2e_plane: Plane,
                                                          api: k8s.ApiClient,
                                                          namespace: str) -> None:
    ns = namespace
    node = f"gpu-{ns}"
    kube.create_gpu_node(api, node, gpus=1, labels={"wdrf-test/node": node})
    kube.wait_node_ready(api, node)
    kube.create_resource_flavor(api, f"gpu-{ns}", node_labels={"wdrf-test/node": node})
    kube.create_queues(api, ns, {"cpu": 2, "nvidia.com/gpu": 1}, flavor=f"gpu-{ns}")
    req = {"cpu": "1", "nvidia.com/gpu": "1"}
    kube.create_job(api, ns, "first", "lq", requests=req, run_seconds=15)
    first = kube.workload_for_job(api, ns, "first")["metadata"]["name"]
    kube.wait_for_workload_condition(api, ns, first, "Admitted")
    # second waits for first's quota (one GPU): witnessed afterwards by the conditions' times,
    # not by catching its Pending state in time (a loaded machine can miss that window)
    kube.create_job(api, ns, "second", "lq", requests=req, run_seconds=3)
    second = kube.workload_for_job(api, ns, "second")["metadata"]["name"]

    def pods_of(job: str) -> list[kube.Obj]:
        items: list[kube.Obj] = kube.request(api, "GET", f"/api/v1/namespaces/{ns}/pods",
                                             query={"labelSelector": f"job-name={job}"})["items"]
        return items

    pod = kube.wait_for(lambda: next((p for p in pods_of("first")
                                      if p["spec"].get("nodeName")), None),
                        60, "a pod of Job first bound to a node")
    assert pod["spec"]["nodeName"] == node
    t_bound = time.monotonic()
    kube.wait_for(lambda: all(p["status"].get("phase") == "Succeeded"
                              for p in pods_of("first")), 60, "Job first's pod Succeeded")
    assert time.monotonic() - t_bound >= 1.5, "pod finished before its set run time"
    done = kube.wait_for_workload_condition(api, ns, first, "Finished", timeout=60)
    admitted = kube.wait_for_workload_condition(api, ns, second, "QuotaReserved", timeout=60)
    finished, reserved = kube.condition(done, "Finished"), kube.condition(admitted, "QuotaReserved")
    assert finished is not None and reserved is not None
    finished_at, reserved_at = finished["lastTransitionTime"], reserved["lastTransitionTime"]
    assert reserved_at >= finished_at, (reserved_at, finished_at)  # RFC 3339 UTC: ordered
    kube.wait_for_workload_condition(api, ns, second, "Admitted", timeout=60)
    kube.wait_for(lambda: any(p["status"].get("phase") == "Succeeded"
                              for p in pods_of("second")), 60, "Job second's pod Succeeded")


def test_gate_off_priority_boost_changes_nothing(plane: Plane, api: k8s.ApiClient,
                                                 namespace: str,
                                                 record_property: Callable[[str, object], None],
                                                 ) -> None:
    ns = namespace
    with plane.kueue_configured(priority_boost=False):
        cm = kube.request(api, "GET",
                          f"/api/v1/namespaces/{KUEUE_NAMESPACE}/configmaps/{KUEUE_CONFIGMAP}")
        cfg = yaml.safe_load(cm["data"][KUEUE_CONFIG_KEY])
        assert cfg["featureGates"]["PriorityBoost"] is False
        running, pending = _one_slot_with_pending(api, ns)
        target = pending[-1]
        patched = kube.set_priority_boost(api, ns, target, 100)
        record_property("gate_off_boost_patch_accepted", True)
        record_property("gate_off_boost_annotation_kept",
                        patched["metadata"]["annotations"].get(kube.PRIORITY_BOOST))
        _free_slot(api, ns, running)
        got = _next_admitted(api, ns, pending)
        record_property("gate_off_admitted_next", "oldest" if got == pending[0] else got)
        assert got == pending[0], (
            f"with PriorityBoost off Kueue admitted {got}, expected FIFO head {pending[0]}")
        assert kube.is_pending(kube.get_workload(api, ns, target))
    # Back to the gate-on configuration for whatever runs next.
    assert plane.kueue_settings.priority_boost is True
