"""HAMi on the test plane: its scheduler (extender + webhook, built from HAMi's source by
``tools/build.sh``) wired as HAMi's chart wires it (``charts/hami/templates/scheduler/``), kwok GPU
nodes registered as HAMi's device plugin registers a node, and the one stand-in: the device
plugin's part of a bind.

What runs for real:

- ``hami-scheduler`` with the chart's flags (``--scheduler-name=hami-scheduler``, default node
  policy binpack, GPU policy spread, the chart's NVIDIA device config); TLS with the plane's
  serving certificate.
- its mutating webhook (``vgpu.hami.io`` on pod CREATE, ``failurePolicy: Ignore``), registered
  with the plane's CA. Chart values used to keep it to the HAMi tests' namespaces and nodes on a
  shared test plane: ``scheduler.admissionWebhook.namespaceSelector.matchLabels`` and
  ``scheduler.nodeLabelSelector`` (both ``wdrf-test/hami: "true"``).
- a second kube-scheduler, configured as the chart's ConfigMap does: profile
  ``hami-scheduler``, HAMi as extender (``filter``, ``bind``, nodeCacheCapable, HAMi's resources
  managed and ignored by kube-scheduler's own fit).

Nodes (:func:`create_node`): what HAMi's device plugin writes on registration, the
``hami.io/node-nvidia-register`` JSON (one object per physical card: id, split count, devmem MiB,
devcore, type, numa, health, index) and ``nvidia.com/gpu`` allocatable = cards x split count
(kubelet's device-plugin registration). HAMi v2.10's device plugin writes no handshake
annotation: HAMi's scheduler writes ``hami.io/node-handshake: Requesting_<time>`` itself and keeps
a node whose allocatable still shows the GPUs, so nothing is faked there.

The stand-in (:class:`DevicePluginStandIn`): on a real node kubelet calls the device plugin's
``Allocate`` when it starts a bound pod's containers; HAMi's plugin then empties the pod's
``hami.io/vgpu-devices-to-allocate`` (one container at a time), sets ``hami.io/bind-phase`` to
``success`` and releases the node lock (``hami.io/mutex.lock``) that HAMi's bind took. The plugin
needs an NVIDIA driver and cannot run here; the stand-in does exactly those three writes for pods
bound to HAMi nodes and nothing else (no environment, no device files). Without it every node
would stay locked after its first bind.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tests.support.procs import PlaneError

if TYPE_CHECKING:
    from tests.support.plane import Plane

Obj = dict[str, Any]

SCHEDULER_NAME = "hami-scheduler"  # the chart's schedulerName
LABEL_KEY, LABEL_VALUE = "wdrf-test/hami", "true"  # namespaces and nodes HAMi manages here
REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake"
NODE_LOCK = "hami.io/mutex.lock"
BIND_PHASE = "hami.io/bind-phase"
ASSIGNED_NODE = "hami.io/vgpu-node"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"
VENDOR = "NVIDIA"
# H100 SXM 80 GB as NVML reports it to HAMi's device plugin (MiB).
H100_MIB = 81559
SPLIT = 10  # the chart's devicePlugin.deviceSplitCount

# The chart's default device-config.yaml, NVIDIA section (templates/scheduler/
# device-configmap.yaml with values.yaml defaults; MIG allowlist left out: no MIG here).
DEVICE_CONFIG: Obj = {"nvidia": {
    "resourceCountName": "nvidia.com/gpu",
    "resourceMemoryName": "nvidia.com/gpumem",
    "resourceMemoryPercentageName": "nvidia.com/gpumem-percentage",
    "resourceCoreName": "nvidia.com/gpucores",
    "resourcePriorityName": "nvidia.com/priority",
    "overwriteEnv": False, "defaultMemory": 0, "defaultCores": 0, "defaultGPUNum": 1,
    "preConfiguredDeviceMemory": 0, "memoryFactor": 1, "deviceSplitCount": SPLIT,
    "deviceMemoryScaling": 1, "deviceCoreScaling": 1, "enableNumaTopology": False,
    "gpuCorePolicy": "default", "libCudaLogLevel": 0, "runtimeClassName": "",
}}
# templates/_helpers.tpl hami-vgpu.scheduler.managedResources, NVIDIA part.
MANAGED_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores",
                     "nvidia.com/gpumem-percentage", "nvidia.com/priority")


@dataclass(frozen=True)
class Card:
    """One physical GPU as HAMi's device plugin registers it (the v2.8+ JSON object)."""

    id: str
    index: int = 0
    devmem: int = H100_MIB
    health: bool = True
    count: int = SPLIT
    devcore: int = 100
    type: str = "NVIDIA-H100-80GB-HBM3"
    numa: int = 0


def cards(node: str, n: int, devmem: int = H100_MIB) -> list[Card]:
    return [Card(id=f"GPU-{node}-{i}", index=i, devmem=devmem) for i in range(n)]


def register_annotation(devices: Sequence[Card]) -> str:
    return json.dumps([asdict(c) for c in devices], separators=(",", ":"))


# ----- chart objects ------------------------------------------------------------------------
def scheduler_args(plane: Plane, device_config: str) -> list[str]:
    """hami-scheduler's command line: templates/scheduler/deployment.yaml with chart defaults."""
    pki = plane.pki
    return [
        f"--http_bind=127.0.0.1:{plane.ports['hami']}",
        f"--cert_file={pki.serving_crt}", f"--key_file={pki.serving_key}",
        f"--scheduler-name={SCHEDULER_NAME}",
        f"--metrics-bind-address=127.0.0.1:{plane.ports['hami-metrics']}",
        "--node-scheduler-policy=binpack", "--gpu-scheduler-policy=spread",
        "--force-overwrite-default-scheduler=true",
        f"--device-config-file={device_config}",
        "--leader-elect=false",
        f"--node-label-selector={LABEL_KEY}={LABEL_VALUE}",
        "-v=4",
    ]


def kube_scheduler_config(plane: Plane) -> Obj:
    """templates/scheduler/configmap.yaml (Kubernetes >= 1.26 branch, webhook enabled). The
    chart trusts the extender with ``insecure: true``; here it is checked against the CA."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(plane.kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
        "extenders": [{
            "urlPrefix": f"https://127.0.0.1:{plane.ports['hami']}",
            "enableHTTPS": True,
            "tlsConfig": {"caData": base64.b64encode(plane.pki.ca_pem).decode()},
            "filterVerb": "filter", "bindVerb": "bind", "nodeCacheCapable": True,
            "weight": 1, "httpTimeout": "30s",
            "managedResources": [{"name": r, "ignoredByScheduler": True}
                                 for r in MANAGED_RESOURCES],
        }],
    }


def webhook_configuration(plane: Plane) -> Obj:
    """templates/scheduler/webhook.yaml, with ``customURL`` (the scheduler listens on this
    machine) and ``namespaceSelector.matchLabels`` set."""
    ca = base64.b64encode(plane.pki.ca_pem).decode()
    ignore = {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "hami-webhook"},
        "webhooks": [{
            "admissionReviewVersions": ["v1beta1"],
            "clientConfig": {"url": f"https://127.0.0.1:{plane.ports['hami']}/webhook",
                             "caBundle": ca},
            "failurePolicy": "Ignore", "matchPolicy": "Equivalent", "name": "vgpu.hami.io",
            "namespaceSelector": {"matchLabels": {LABEL_KEY: LABEL_VALUE},
                                  "matchExpressions": [ignore]},
            "objectSelector": {"matchExpressions": [ignore]},
            "reinvocationPolicy": "Never",
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["pods"], "scope": "*"}],
            "sideEffects": "None", "timeoutSeconds": 10,
        }],
    }


# ----- nodes --------------------------------------------------------------------------------
def create_node(plane: Plane, name: str, devices: Sequence[Card], *,
                labels: Mapping[str, str] | None = None) -> Obj:
    """A kwok node registered as HAMi's device plugin registers one (see the module doc)."""
    gpus = sum(c.count for c in devices if c.health)
    cap = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name,
        "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0",
                        REGISTER: register_annotation(devices)},
        "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                   "kubernetes.io/arch": "amd64", "type": "kwok", LABEL_KEY: LABEL_VALUE,
                   **dict(labels or {})}},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {"capacity": cap, "allocatable": cap}}
    plane.request("POST", "/api/v1/nodes", body)
    return plane.request("PATCH", f"/api/v1/nodes/{name}/status",
                         {"status": {"capacity": cap, "allocatable": cap}},
                         "application/merge-patch+json")


def reregister(plane: Plane, name: str, devices: Sequence[Card]) -> None:
    """What the device plugin does when a card's health changes: a new register annotation and
    the healthy cards' slots as allocatable."""
    gpus = str(sum(c.count for c in devices if c.health))
    plane.request("PATCH", f"/api/v1/nodes/{name}",
                  {"metadata": {"annotations": {REGISTER: register_annotation(devices)}}},
                  "application/merge-patch+json")
    plane.request("PATCH", f"/api/v1/nodes/{name}/status",
                  {"status": {"capacity": {"nvidia.com/gpu": gpus},
                              "allocatable": {"nvidia.com/gpu": gpus}}},
                  "application/merge-patch+json")


# ----- what HAMi wrote ----------------------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    """One device of one container in ``hami.io/vgpu-devices-allocated``."""

    container: int
    uuid: str
    vendor: str
    mem_mib: int
    cores: int


def parse_allocated(value: str) -> list[Allocation]:
    """``UUID,NVIDIA,<MiB>,<cores>:`` per device, ``;`` after each container."""
    out: list[Allocation] = []
    for ci, ctr in enumerate(value.split(";")):
        for dev in ctr.split(":"):
            if not dev:
                continue
            uuid, vendor, mem, cores = dev.split(",")[:4]
            out.append(Allocation(ci, uuid, vendor, int(mem), int(cores)))
    return out


def scrape_metrics(plane: Plane) -> list[tuple[str, dict[str, str], float]]:
    """HAMi scheduler's Prometheus metrics as (name, labels, value)."""
    url = f"http://127.0.0.1:{plane.ports['hami-metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels: dict[str, str] = {}
        for part in _split_labels(rest.rstrip("}")):
            k, _, v = part.partition("=")
            labels[k] = v.strip('"')
        out.append((name, labels, float(value)))
    return out


def _split_labels(s: str) -> Iterable[str]:
    cur, quoted = "", False
    for ch in s:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            yield cur
            cur = ""
        else:
            cur += ch
    if cur:
        yield cur


# ----- the stand-in -------------------------------------------------------------------------
class DevicePluginStandIn:
    """The device plugin's part of a bind, for pods bound to HAMi nodes (see the module doc)."""

    def __init__(self, plane: Plane, interval: float = 0.2) -> None:
        self.plane = plane
        self.interval = interval
        self.done: set[str] = set()  # pod uids allocated
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hami-device-plugin",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except PlaneError as e:
                if "HTTP 404" in str(e):
                    continue  # the pod or node was deleted meanwhile (a test's cleanup)
                self.errors.append(repr(e))
                del self.errors[:-20]
            except Exception as e:  # a plane hiccup must not end the thread
                self.errors.append(repr(e))
                del self.errors[:-20]

    def step(self) -> int:
        """Allocate every bound pod waiting for it; returns how many."""
        pods = self.plane.request("GET", "/api/v1/pods")["items"]
        n = 0
        for pod in pods:
            meta = pod["metadata"]
            ann = meta.get("annotations") or {}
            node = pod["spec"].get("nodeName")
            if (ann.get(BIND_PHASE) != "allocating" or not node
                    or ann.get(ASSIGNED_NODE) != node or meta["uid"] in self.done):
                continue
            self.allocate(pod)
            n += 1
        return n

    def allocate(self, pod: Obj) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        ann = meta["annotations"]
        # Each Allocate call erases one container's devices; after the last none are left.
        erased = ";" * ann.get(TO_ALLOCATE, "").count(";")
        self.plane.request(
            "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}",
            {"metadata": {"annotations": {TO_ALLOCATE: erased, BIND_PHASE: "success"}}},
            "application/merge-patch+json")
        self._release_lock(pod["spec"]["nodeName"], ns, name)
        self.done.add(meta["uid"])

    def _release_lock(self, node: str, ns: str, name: str) -> None:
        for _ in range(10):
            n = self.plane.request("GET", f"/api/v1/nodes/{node}")
            lock = (n["metadata"].get("annotations") or {}).get(NODE_LOCK)
            if lock is None or not lock.endswith(f",{ns},{name}"):
                return  # not this pod's lock (HAMi's bind released or another pod holds it)
            try:
                self.plane.request(
                    "PATCH", f"/api/v1/nodes/{node}",
                    {"metadata": {"annotations": {NODE_LOCK: None},
                                  "resourceVersion": n["metadata"]["resourceVersion"]}},
                    "application/merge-patch+json")
                return
            except PlaneError:  # a conflict (the node changed): read again
                time.sleep(0.1)
