"""Three control planes on this machine for MultiKueue: a manager and two workers.

The manager is etcd + kube-apiserver + Kueue (MultiKueue is on by default in Kueue v0.19); it
runs no controller-manager (MultiKueue marks the manager's Jobs ``spec.managedBy:
kueue.x-k8s.io/multikueue``, so nothing runs them there). Each worker is a :class:`Plane` with
its end-to-end extras (kube-controller-manager, kube-scheduler, kwok) and one kwok GPU node.
MultiKueue reaches a worker as Kueue's MultiKueue setup guide describes: a kubeconfig in a
Secret in the manager's ``kueue-system`` (key ``kubeconfig``, the CA inline, a bearer token for
an identity with a ClusterRole on the worker), a MultiKueueCluster per worker naming the Secret,
one MultiKueueConfig listing them and an AdmissionCheck of controller
``kueue.x-k8s.io/multikueue`` naming the config. Queues are per test (:meth:`add_queues`).

No visibility API (not needed here, and three more servers would cost CPU). Usage::

    with MultiKueuePlanes.temporary() as mk:
        mk.manager.api_client(); mk.workers["worker-1"].api_client()

Everything is stopped on exit (and at interpreter exit, like every Plane).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.support import kube
from tests.support.plane import KUEUE_NAMESPACE, KueueSettings, Plane
from tests.support.procs import PlaneError

Obj = dict[str, Any]
ORIGIN = "wdrf-manager"  # Kueue's multiKueue.origin on the manager: the copies' origin label
CHECK = "multikueue"  # the AdmissionCheck (and MultiKueueConfig) name on the manager
WORKERS = ("worker-1", "worker-2")
MK_USER = "multikueue-manager"  # the identity the manager uses on each worker
GPU_NODE = "gpu-node"
# What MultiKueue does on a worker for batch/v1 Jobs (Kueue's guide grants the same verbs):
# create and delete the copies and the Jobs, read their state, update the copies' status.
MK_WORKER_RULES: list[Obj] = [
    {"apiGroups": ["batch"], "resources": ["jobs"],
     "verbs": ["create", "delete", "get", "list", "watch", "update", "patch"]},
    {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
    {"apiGroups": [kube.KUEUE_GROUP], "resources": ["workloads"],
     "verbs": ["create", "delete", "get", "list", "watch", "update", "patch"]},
    {"apiGroups": [kube.KUEUE_GROUP], "resources": ["workloads/status"],
     "verbs": ["get", "patch", "update"]},
]


@dataclass
class Queues:
    """One test's queues: the same names on every plane. ``namespaces`` are the teams (each
    with LocalQueue ``lq``); ``namespace`` is the first."""

    namespace: str
    cluster_queue: str
    local_queue: str = "lq"
    namespaces: tuple[str, ...] = ()


@dataclass
class MultiKueuePlanes:
    manager: Plane
    workers: dict[str, Plane]
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    @contextlib.contextmanager
    def temporary(cls, keep: bool = False, gpus_per_worker: int = 8
                  ) -> Iterator[MultiKueuePlanes]:
        """Start the three planes and wire MultiKueue; stop them all on exit."""
        root = Path(tempfile.mkdtemp(prefix="wdrf-mk-"))
        mk = cls(manager=Plane(root / "manager", _manager_settings(), visibility=False),
                 workers={w: Plane(root / w, _worker_settings(), visibility=False)
                          for w in WORKERS})
        try:
            mk.start(gpus_per_worker)
            yield mk
        finally:
            mk.stop()
            if not keep:
                shutil.rmtree(root, ignore_errors=True)

    @property
    def planes(self) -> dict[str, Plane]:
        return {"manager": self.manager, **self.workers}

    def start(self, gpus_per_worker: int = 8) -> None:
        t0 = time.monotonic()
        tokens = {w: base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")
                  for w in self.workers}
        for w, plane in self.workers.items():
            plane.extra_tokens[MK_USER] = (tokens[w], ())
        # Concurrently: each start mostly waits on its own processes.
        with ThreadPoolExecutor(len(self.planes)) as pool:
            for f in [pool.submit(p.start) for p in self.planes.values()]:
                f.result()
        self.timings["planes"] = time.monotonic() - t0
        with ThreadPoolExecutor(len(self.workers)) as pool:
            for f in [pool.submit(p.start_e2e) for p in self.workers.values()]:
                f.result()
        self.timings["e2e"] = time.monotonic() - t0 - self.timings["planes"]
        for w, plane in self.workers.items():
            api = plane.api_client()
            self._grant_manager(api)
            kube.create_gpu_node(api, GPU_NODE, gpus_per_worker, hami=False)
            self._connect(w, plane, tokens[w])
        self.wait_connected()
        self.timings["start"] = time.monotonic() - t0

    def stop(self) -> None:
        """Stop the three planes concurrently (each waits for its processes' grace)."""
        with ThreadPoolExecutor(len(self.planes)) as pool:
            for f in [pool.submit(p.stop) for p in self.planes.values()]:
                with contextlib.suppress(Exception):
                    f.result()

    def logs_tail(self, lines: int = 20) -> str:
        return "\n".join(f"===== {n} =====\n{p.logs_tail(lines)}"
                         for n, p in self.planes.items())

    # ----- wiring -------------------------------------------------------------------------
    def _grant_manager(self, worker: k8s.ApiClient) -> None:
        kube.request(worker, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": MK_USER}, "rules": MK_WORKER_RULES})
        kube.request(worker, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": MK_USER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": MK_USER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": MK_USER}]})

    def _connect(self, name: str, worker: Plane, token: str) -> None:
        """The worker's kubeconfig Secret and MultiKueueCluster on the manager."""
        api = self.manager.api_client()
        kc = {"apiVersion": "v1", "kind": "Config", "current-context": name,
              "clusters": [{"name": name, "cluster": {
                  "server": worker.server,
                  "certificate-authority-data": base64.b64encode(
                      worker.pki.ca_pem).decode()}}],
              "users": [{"name": MK_USER, "user": {"token": token}}],
              "contexts": [{"name": name, "context": {"cluster": name, "user": MK_USER}}]}
        secret = f"{name}-kubeconfig"
        kube.request(api, "POST", f"/api/v1/namespaces/{KUEUE_NAMESPACE}/secrets", {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret, "namespace": KUEUE_NAMESPACE},
            "stringData": {"kubeconfig": yaml.safe_dump(kc, sort_keys=False)}})
        kube.request(api, "POST", kube.kueue_path("multikueueclusters"), {
            "apiVersion": f"{kube.KUEUE_GROUP}/{kube.KUEUE_VERSION}",
            "kind": "MultiKueueCluster", "metadata": {"name": name},
            "spec": {"clusterSource": {"kubeConfig": {
                "locationType": "Secret", "location": secret}}}})

    def wait_connected(self, timeout: float = 90) -> None:
        """MultiKueueConfig + AdmissionCheck; wait until every worker and the check are
        Active (Kueue's own conditions)."""
        api = self.manager.api_client()
        kube.request(api, "POST", kube.kueue_path("multikueueconfigs"), {
            "apiVersion": f"{kube.KUEUE_GROUP}/{kube.KUEUE_VERSION}",
            "kind": "MultiKueueConfig", "metadata": {"name": CHECK},
            "spec": {"clusters": list(self.workers)}})
        kube.request(api, "POST", kube.kueue_path("admissionchecks"), {
            "apiVersion": f"{kube.KUEUE_GROUP}/{kube.KUEUE_VERSION}",
            "kind": "AdmissionCheck", "metadata": {"name": CHECK},
            "spec": {"controllerName": "kueue.x-k8s.io/multikueue", "parameters": {
                "apiGroup": kube.KUEUE_GROUP, "kind": "MultiKueueConfig", "name": CHECK}}})

        def active(plural: str, name: str) -> bool:
            obj = kube.request(api, "GET", kube.kueue_path(plural, name))
            return kube.has_condition(obj, "Active")

        try:
            for w in self.workers:
                kube.wait_for(lambda w=w: active("multikueueclusters", w), timeout,  # type: ignore[misc]
                              f"MultiKueueCluster {w} Active")
            kube.wait_for(lambda: active("admissionchecks", CHECK), timeout,
                          f"AdmissionCheck {CHECK} Active")
        except kube.WaitTimeout as e:
            raise PlaneError(f"{e}\n{self.logs_tail()}") from e

    def add_queues(self, manager_quota: Mapping[str, str | int],
                   worker_quota: Mapping[str, str | int],
                   cq_spec: Obj | None = None, teams: int = 1) -> Queues:
        """``teams`` namespaces, each with LocalQueue ``lq``, and one ClusterQueue, of the same
        names on all three planes; the manager's ClusterQueue has the MultiKueue
        AdmissionCheck."""
        ns = kube.unique_name("mk")
        names = (ns, *(f"{ns}-{i}" for i in range(1, teams)))
        q = Queues(ns, f"cq-{ns}", namespaces=names)
        selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                          "operator": "In", "values": list(names)}]}
        for name, plane in self.planes.items():
            api = plane.api_client()
            for team in names:
                kube.create_namespace(api, team)
            spec = dict(cq_spec or {})
            quota = worker_quota
            if name == "manager":
                spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": CHECK}]}
                quota = manager_quota
            kube.create_cluster_queue(api, q.cluster_queue, quota, namespace_selector=selector,
                                      extra_spec=spec)
            for team in names:
                kube.create_local_queue(api, team, q.local_queue, q.cluster_queue)
        return q

    def hold(self, worker: str, cluster_queue: str, held: bool = True) -> None:
        """Stop (``Hold``: admit nothing new, keep what is admitted) or resume a worker's
        ClusterQueue, so the Jobs submitted meanwhile land on the other worker; returns once
        that worker's Kueue says so (the ClusterQueue's Active condition)."""
        api = self.workers[worker].api_client()
        path = kube.kueue_path("clusterqueues", cluster_queue)
        kube.request(api, "PATCH", path, {"spec": {"stopPolicy": "Hold" if held else "None"}})
        want = "False" if held else "True"
        kube.wait_for(lambda: kube.has_condition(kube.request(api, "GET", path), "Active", want),
                      30, f"{worker}'s ClusterQueue {cluster_queue} Active={want}")


def _manager_settings() -> KueueSettings:
    return KueueSettings(frameworks=("batch/job",), extra={"multiKueue": {
        "origin": ORIGIN, "gcInterval": "30s", "workerLostTimeout": "5m"}})


def _worker_settings() -> KueueSettings:
    return KueueSettings(frameworks=("batch/job",))


def remote_copy(worker: k8s.ApiClient, namespace: str, name: str) -> Obj | None:
    """The worker's copy of manager Workload ``namespace/name``, or None."""
    try:
        return kube.get_workload(worker, namespace, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
