"""Helpers for the live controller's proof tests on the real control plane."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.accounting import UsageHistory
from controller.config import PolicySettings, Settings, load_settings
from controller.domain import PRIORITY_TERMS_ANNOTATION, ClusterSnapshot
from controller.incremental import IncrementalPlanner
from controller.live.kube import KubeTransport
from controller.live.runner import CycleReport, LiveController
from controller.plan import Plan, WorkloadDecision
from controller.policy import compute_plan
from tests.support import kube

REPO = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]


def live_settings(**env: str) -> Settings:
    """Settings for an in-process controller: fast loop, no HTTP port, no Lease unless asked."""
    base = {
        "LOOP_INTERVAL": "1", "METRICS_PORT": "0", "LEADER_ELECTION": "false",
        "CAPACITY_SOURCE": "quota", "PRIORITY_MODE": "boost",
        "AGING_COEFFICIENT": "0", "LEASE_NAME": kube.unique_name("wdrf"),
        "HISTORY_CONFIG_MAP": kube.unique_name("wdrf-history"),
        "RESOURCE_WEIGHTS": "{cpu: 1}", "EVENT_RATE_LIMIT": "10m",
    }
    base.update(env)
    return load_settings(REPO / "config.yaml", env=base)


class CheckedPlanner(IncrementalPlanner):
    """The live controller's incremental planner, checked every cycle against compute_plan on
    the very snapshot the cycle planned (a difference fails the cycle)."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0
        self.reused = 0  # pools whose part of the last plan was reused

    def plan(self, snapshot: ClusterSnapshot, settings: PolicySettings, now: datetime,
             history: UsageHistory | None = None) -> Plan:
        plan = super().plan(snapshot, settings, now, history)
        assert plan == compute_plan(snapshot, settings, now, history), (
            f"incremental plan differs from the full plan (replanned {self.replanned})")
        self.checked += 1
        self.reused += self.pools - len(self.replanned) if not self.fallback else 0
        return plan


def new_controller(kubeconfig: Path, settings: Settings, **kw: Any) -> LiveController:
    """A controller whose every plan is checked against the full plan (`CheckedPlanner`)."""
    c = LiveController(settings, KubeTransport.from_config(str(kubeconfig)), **kw)
    c.planner = CheckedPlanner()
    return c


@contextlib.contextmanager
def started(c: LiveController, loop: bool = False) -> Iterator[LiveController]:
    """Informers (and Lease) running; with `loop` the control loop too, in a thread."""
    c.start(serve_http=False)
    assert c.wait_synced(60), "informers did not sync"
    thread = None
    if loop:
        thread = threading.Thread(target=c.loop, name="control-loop", daemon=True)
        thread.start()
    try:
        yield c
    finally:
        c.shutdown()
        if thread is not None:
            thread.join(30)


def converge(c: LiveController, max_cycles: int = 30) -> CycleReport:
    """Run cycles until one finds nothing to write (caches caught up with our writes)."""
    report = c.run_cycle()
    for _ in range(max_cycles):
        if not report.changes:
            return report
        time.sleep(0.3)
        report = c.run_cycle()
    raise AssertionError(f"no steady cycle after {max_cycles}: last changes "
                         f"{[ch.summary for ch in report.changes][:5]}")


def head_of(report: CycleReport, cluster_queue: str) -> WorkloadDecision:
    for d in report.plan.decisions:
        if d.cluster_queue == cluster_queue and d.rank == 0:
            return d
    raise AssertionError(f"no pending workload planned in {cluster_queue}")


def planned_in(report: CycleReport, cluster_queue: str) -> list[WorkloadDecision]:
    return [d for d in report.plan.decisions if d.cluster_queue == cluster_queue]


def create_job(api: k8s.ApiClient, ns: str, name: str, queue: str, **kw: Any) -> Obj:
    """A Kueue Job whose pods can never be scheduled (node selector matching no node): when
    the session's plane also runs the e2e extras (controller-manager, scheduler, kwok), an
    admitted Job must keep its quota instead of running to completion."""
    body = kube.job_manifest(ns, name, queue, **kw)
    body["spec"]["template"]["spec"]["nodeSelector"] = {"wdrf-test/parked": "nowhere"}
    return kube.request(api, "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body)


def job_workload(api: k8s.ApiClient, ns: str, job: str) -> str:
    name: str = kube.workload_for_job(api, ns, job)["metadata"]["name"]
    return name


def wait_pending(api: k8s.ApiClient, ns: str, name: str) -> None:
    """The Workload exists and holds no quota. (Kueue sets QuotaReserved=False/Pending only
    on the workloads its scheduler actually tried: behind an inadmissible head in another
    LocalQueue a workload may carry no QuotaReserved condition at all.)"""
    wl = kube.get_workload(api, ns, name)
    assert kube.is_pending(wl), kube.describe_workload(wl)


def deactivate(api: k8s.ApiClient, ns: str, name: str) -> None:
    """Spec.active=false: Kueue evicts it (freeing its quota) and the policy ignores it."""
    kube.patch_workload(api, ns, name, {"spec": {"active": False}})


def release(api: k8s.ApiClient, ns: str, name: str) -> None:
    deactivate(api, ns, name)
    kube.wait_for_workload_condition(api, ns, name, "QuotaReserved", "False", timeout=30)


def next_admitted(api: k8s.ApiClient, candidates: Mapping[str, str]) -> str:
    """Wait until one of `candidates` (key ns/name -> ns) holds quota; exactly one must."""

    def admitted() -> set[str]:
        out = set()
        for key, ns in candidates.items():
            wl = kube.get_workload(api, ns, key.split("/", 1)[1])
            if kube.has_condition(wl, "QuotaReserved"):
                out.add(key)
        return out

    kube.wait_for(admitted, 30, f"one of {sorted(candidates)} admitted")
    time.sleep(1.0)  # one slot was freed: no second admission may follow
    got = admitted()
    assert len(got) == 1, f"expected exactly one admission, got {sorted(got)}"
    return got.pop()


def cleanup(api: k8s.ApiClient, namespaces: list[str], cluster_queues: list[str]) -> None:
    """Deactivate this test's Workloads and delete its ClusterQueues, so later tests' plans
    (shares, capacity) do not see them."""
    for ns in namespaces:
        with contextlib.suppress(ApiException):
            for wl in kube.list_workloads(api, ns):
                if wl["spec"].get("active", True):
                    with contextlib.suppress(ApiException):
                        deactivate(api, ns, wl["metadata"]["name"])
    for cq in cluster_queues:
        with contextlib.suppress(ApiException):
            kube.request(api, "DELETE", kube.kueue_path("clusterqueues", cq))


@contextlib.contextmanager
def two_teams_on_a_full_queue(api: k8s.ApiClient) -> Iterator[tuple[str, str, str]]:
    """Two namespaces whose LocalQueues `lq` share one ClusterQueue of 1 cpu, filled by an
    admitted Job `running` in the first, so what is created next stays pending; yields
    (namespace, other namespace, ClusterQueue) and cleans up on exit."""
    ns, other = kube.create_namespace(api), kube.create_namespace(api)
    cq = f"cq-{ns}"
    kube.create_cluster_queue(api, cq, {"cpu": 1}, namespace_selector={"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns, other]}]})
    kube.create_local_queue(api, ns, "lq", cq)
    kube.create_local_queue(api, other, "lq", cq)
    try:
        create_job(api, ns, "running", "lq")
        kube.wait_for_workload_condition(api, ns, job_workload(api, ns, "running"),
                                         "QuotaReserved")
        yield ns, other, cq
    finally:
        cleanup(api, [ns, other], [cq])


def controller_env(kubeconfig: Path, **env: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("LOOP_", "LEASE_"))}
    out.update({"KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1", **env})
    return out


def spawn_controller(
    kubeconfig: Path, log: Path, *args: str, **env: str
) -> subprocess.Popen[bytes]:
    """`python -m controller` as a separate process (its own Lease identity), logs to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "controller", *args], cwd=REPO,
            env=controller_env(kubeconfig, **env), stdout=out, stderr=subprocess.STDOUT,
        )


def lease_holder(api: k8s.ApiClient, namespace: str, name: str) -> str:
    try:
        lease = kube.request(api, "GET",
                             f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
    except ApiException as e:
        if e.status == 404:
            return ""
        raise
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def events_for(api: k8s.ApiClient, ns: str, name: str, reason: str | None = None) -> list[Obj]:
    """The controller's Events (not Kueue's) about object `name`."""
    items: list[Obj] = kube.request(api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == name
            and (e.get("source") or {}).get("component") == "wdrf-controller"
            and (reason is None or e.get("reason") == reason)]


class MethodCounter:
    """Counts HTTP methods at the urllib3 pool of an ApiClient: below every wrapper of the
    controller, so it sees exactly what leaves the process."""

    def __init__(self, transport: KubeTransport) -> None:
        self.methods: list[str] = []
        api = transport._api  # the kubernetes ApiClient
        pool = api.rest_client.pool_manager
        original = pool.request
        lock = threading.Lock()

        def counting(method: str, url: str, *a: Any, **kw: Any) -> Any:
            with lock:
                self.methods.append(method.upper())
            return original(method, url, *a, **kw)

        pool.request = counting

    def writes(self) -> list[str]:
        return [m for m in self.methods if m != "GET"]


def dump_workloads(api: k8s.ApiClient, namespaces: list[str]) -> str:
    """Each Workload's state, effective priority and terms (for a failure's message)."""
    lines = []
    for ns in namespaces:
        for w in kube.list_workloads(api, ns):
            ann = w["metadata"].get("annotations") or {}
            lines.append(f"{kube.describe_workload(w)} terms={ann.get(PRIORITY_TERMS_ANNOTATION)}")
    return "\n".join(lines)
