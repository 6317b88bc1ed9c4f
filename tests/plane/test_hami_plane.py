"""HAMi's real scheduler on the test plane (tests/support/hami.py): fractions, binpack/spread and
capacity, witnessed by what HAMi writes (``hami.io/vgpu-devices-allocated``, ``hami.io/vgpu-node``,
its Events and scheduler metrics), not by the controller.

The plane here is its own (module scope): HAMi's webhook and extender then see only these
tests' pods and nodes, and the controller's capacity only these nodes' cards.

Arrivals are sequential where HAMi's choice depends on order: each Job has its own ClusterQueue
with no GPU quota (so the controller writes its HAMi settings while the Job is suspended), and
the next Job's quota opens only after HAMi has placed (or refused) the previous one.

``WDRF_HAMI_ARRIVALS`` / ``WDRF_HAMI_NODES`` lengthen the mixed-arrival scenario
(``make hami-long``); the default is the short one of ``make test``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.domain import (
    GPU,
    GPUCORES,
    GPUMEM,
    GPUMEM_PERCENTAGE,
    HAMI_GPU_POLICY_ANNOTATION,
    HAMI_NODE_POLICY_ANNOTATION,
    SCHEDULING_POLICY_ANNOTATION,
)
from controller.live.runner import LiveController
from tests.plane import live_helpers as h
from tests.support import hami, kube
from tests.support.plane import Plane
from tests.support.procs import PlaneError

pytestmark = [pytest.mark.plane, pytest.mark.e2e]

Obj = dict[str, Any]
QUOTA_RESOURCES = ("cpu", GPU, GPUCORES, GPUMEM_PERCENTAGE, GPUMEM)
# The kinds of Job in an arrival sequence: HAMi resources per container.
KINDS: dict[str, dict[str, int]] = {
    "f": {GPU: 1, GPUCORES: 25, GPUMEM_PERCENTAGE: 25},  # a quarter GPU
    "h": {GPU: 1, GPUCORES: 50, GPUMEM_PERCENTAGE: 50},  # half a GPU
    "w": {GPU: 1},  # one whole GPU
    "g2": {GPU: 2},
    "g4": {GPU: 4},
}


@pytest.fixture(scope="module")
def hplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    p = Plane(tmp_path_factory.mktemp("hami-plane"))
    try:
        p.start()
        p.start_hami()
    except PlaneError as e:
        p.stop()
        pytest.fail(f"the HAMi plane did not start: {e}", pytrace=False)
    try:
        yield p
    finally:
        errors = p.hami_plugin.errors if p.hami_plugin else []
        p.stop()
        assert not errors, f"device plugin stand-in errors: {errors}"


@pytest.fixture
def hapi(hplane: Plane) -> k8s.ApiClient:
    return hplane.api_client()


@pytest.fixture
def hns(hapi: k8s.ApiClient) -> str:
    """A namespace HAMi's webhook serves (the chart's namespaceSelector.matchLabels)."""
    return kube.create_namespace(hapi, labels={hami.LABEL_KEY: hami.LABEL_VALUE})


# ----- helpers --------------------------------------------------------------------------------
@dataclass
class Arm:
    """Nodes, a flavor on them, and the ClusterQueues of one arrival sequence."""

    api: k8s.ApiClient
    plane: Plane
    ns: str
    name: str
    cards: dict[str, list[hami.Card]] = field(default_factory=dict)
    queues: list[str] = field(default_factory=list)

    @property
    def flavor(self) -> str:
        return f"{self.name}-{self.ns}"

    def add_nodes(self, n: int, cards: int) -> None:
        for i in range(n):
            node = f"{self.flavor}-{i}"
            self.cards[node] = hami.cards(node, cards)
            hami.create_node(self.plane, node, self.cards[node],
                             labels={"wdrf-test/node": self.flavor})
        for node in self.cards:
            kube.wait_node_ready(self.api, node)
        ids = {c.id for cards in self.cards.values() for c in cards}
        # HAMi registers a node on its informer's add event; its metrics then list the cards.
        kube.wait_for(lambda: ids <= metrics_by_card(self.plane, "hami_gpu_memory_limit_bytes")
                      .keys() or None, 60, f"HAMi registering the cards of {list(self.cards)}")
        kube.create_resource_flavor(self.api, self.flavor,
                                    node_labels={"wdrf-test/node": self.flavor})

    def queue(self, job: str, gpus: int = 0) -> str:
        """A ClusterQueue + LocalQueue for one Job, with ``gpus`` GPUs of quota."""
        cq = f"{job}-{self.ns}"
        kube.create_cluster_queue(self.api, cq, _quota(gpus), self.flavor,
                                  namespace_selector={"matchLabels": {
                                      "kubernetes.io/metadata.name": self.ns}})
        kube.create_local_queue(self.api, self.ns, job, cq)
        self.queues.append(cq)
        return job

    def open(self, job: str, gpus: int) -> None:
        q = _quota(gpus)
        kube.request(self.api, "PATCH", kube.kueue_path("clusterqueues", f"{job}-{self.ns}"),
                     {"spec": {"resourceGroups": [{"coveredResources": list(q), "flavors": [
                         {"name": self.flavor, "resources": [
                             {"name": r, "nominalQuota": str(v)} for r, v in q.items()]}]}]}})


def _quota(gpus: int) -> dict[str, str | int]:
    return {"cpu": 64, GPU: gpus, GPUCORES: 100 * gpus, GPUMEM_PERCENTAGE: 100 * gpus,
            GPUMEM: hami.H100_MIB * gpus}


def gpu_job(api: k8s.ApiClient, ns: str, name: str, queue: str, res: Mapping[str, int], *,
            pod_annotations: Mapping[str, str] | None = None,
            annotations: Mapping[str, str] | None = None) -> None:
    kube.create_job(api, ns, name, queue, requests={"cpu": "100m", **res},
                    pod_annotations=pod_annotations, annotations=annotations, run_seconds=3600)


def job_pod(api: k8s.ApiClient, ns: str, job: str) -> Obj | None:
    items = kube.request(api, "GET", f"/api/v1/namespaces/{ns}/pods",
                         query={"labelSelector": f"job-name={job}"})["items"]
    return items[0] if items else None


def hami_events(api: k8s.ApiClient, ns: str, pod: str, reason: str) -> list[Obj]:
    items: list[Obj] = kube.request(api, "GET", f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == pod
            and e.get("reason") == reason]


def wait_placed(api: k8s.ApiClient, ns: str, job: str, timeout: float = 90) -> Obj | None:
    """The Job's pod once HAMi has bound it and the device plugin's part is done, or None once
    HAMi's filter has refused it (a ``FilteringFailed`` Event from HAMi on the pod)."""
    def probe() -> tuple[Obj | None] | None:
        pod = job_pod(api, ns, job)
        if pod is None:
            return None
        ann = pod["metadata"].get("annotations") or {}
        if pod["spec"].get("nodeName") and ann.get(hami.BIND_PHASE) == "success":
            return (pod,)
        if hami_events(api, ns, pod["metadata"]["name"], "FilteringFailed"):
            return (None,)
        return None
    return kube.wait_for(probe, timeout, f"HAMi placing or refusing Job {ns}/{job}",
                         lambda: str(job_pod(api, ns, job)))[0]


def allocations(pod: Obj) -> list[hami.Allocation]:
    return hami.parse_allocated(pod["metadata"]["annotations"][hami.ALLOCATED])


def wait_template_annotation(api: k8s.ApiClient, ns: str, job: str, key: str) -> str:
    def probe() -> str | None:
        ann = kube.get_job(api, ns, job)["spec"]["template"]["metadata"].get("annotations") or {}
        return ann.get(key)
    return kube.wait_for(probe, 60, f"the controller writing {key} on Job {ns}/{job}")


def metrics_by_card(plane: Plane, name: str) -> dict[str, float]:
    return {lb["device_uuid"]: v for n, lb, v in hami.scrape_metrics(plane) if n == name}


def wait_hami_reregistered(api: k8s.ApiClient, node: str) -> None:
    """Wait until HAMi's scheduler has read the node's current registration. It re-reads nodes
    on a 15 s tick, not on node updates; the probe: clear HAMi's handshake annotation, which its
    next registration pass writes again (``Requesting_<time>``) in the same pass that re-reads
    the devices."""
    kube.request(api, "PATCH", f"/api/v1/nodes/{node}",
                 {"metadata": {"annotations": {hami.HANDSHAKE: None}}})
    kube.wait_for(lambda: (kube.request(api, "GET", f"/api/v1/nodes/{node}")["metadata"][
        "annotations"].get(hami.HANDSHAKE) or "").startswith("Requesting_") or None,
        60, f"HAMi's next registration pass over node {node}")


def teardown(api: k8s.ApiClient, arms: list[Arm]) -> None:
    for arm in arms:
        h.cleanup(api, [arm.ns], arm.queues)
        for node in arm.cards:
            with suppress(ApiException):
                kube.request(api, "DELETE", f"/api/v1/nodes/{node}")


def settings_env(**extra: str) -> dict[str, str]:
    return {"CAPACITY_SOURCE": "hami", **extra}


# ----- capacity (first: the controller's capacity is the inventory only while this plane has a
# single pool, i.e. before the other tests' ClusterQueues) -----------------------------------
def test_capacity_source_hami_reads_the_registered_cards_and_drops_an_unhealthy_one(
    hplane: Plane, hapi: k8s.ApiClient, hns: str
) -> None:
    """CAPACITY_SOURCE=hami: the controller's GPU capacity is the healthy cards HAMi registered
    (HAMi's metrics list them); a card the device plugin reports unhealthy leaves the capacity
    and HAMi places nothing on it."""
    arm = Arm(hapi, hplane, hns, "cap")
    try:
        arm.add_nodes(1, 3)
        node, cards = next(iter(arm.cards.items()))
        ids = {c.id for c in cards}
        registered = kube.wait_for(
            lambda: (lambda m: m if ids <= m.keys() else None)(
                metrics_by_card(hplane, "hami_gpu_memory_limit_bytes")),
            60, "HAMi registering the node's cards")
        assert registered.keys() == ids  # the only HAMi node of this plane so far
        assert all(v == hami.H100_MIB * 1024 * 1024 for v in registered.values())
        handshake = kube.request(hapi, "GET", f"/api/v1/nodes/{node}")["metadata"][
            "annotations"].get(hami.HANDSHAKE, "")
        assert handshake.startswith("Requesting_"), handshake  # HAMi's side of the handshake
        q = arm.queue("cap")
        gpu_job(hapi, hns, "three", q, {GPU: 3})
        flavor_gpu = f"{arm.flavor}:{GPU}"
        c = h.new_controller(hplane.kubeconfig, h.live_settings(**settings_env()))
        with h.started(c):
            # the team shows in the plan once the informers have its Workload
            cap = kube.wait_for(lambda: (lambda t: t[hns].capacity[flavor_gpu] if hns in t
                                         else None)(h.converge(c).plan.teams), 30,
                                "the team's Workload in the controller's plan")
            assert cap == len(ids), cap

            sick = cards[1]
            cards[1] = hami.Card(id=sick.id, index=sick.index, health=False)
            hami.reregister(hplane, node, cards)
            kube.wait_for(lambda: c.run_cycle().plan.teams[hns].capacity[flavor_gpu]
                          == len(ids) - 1 or None, 30,
                          "the unhealthy card leaving the controller's capacity")
        wait_hami_reregistered(hapi, node)
        arm.open("cap", 3)
        assert wait_placed(hapi, hns, "three") is None  # HAMi: two healthy cards left
        gpu_job(hapi, hns, "two", q, KINDS["g2"])
        arm.open("cap", 5)
        pod = wait_placed(hapi, hns, "two")
        assert pod is not None
        assert {a.uuid for a in allocations(pod)} == ids - {sick.id}
    finally:
        teardown(hapi, [arm])


# ----- fractions and accounting ---------------------------------------------------------------
def test_fractions_share_cards_as_hami_allocates_and_usage_equals_hami_sum(
    hplane: Plane, hapi: k8s.ApiClient, hns: str
) -> None:
    """Three fractional Jobs and one whole-GPU Job on a 2-card node: HAMi packs the fractions
    onto one card (the controller's binpack rule), gives the whole GPU the other, and the
    controller's GPU-equivalent usage of the team is the sum over HAMi's allocations."""
    arm = Arm(hapi, hplane, hns, "frac")
    try:
        arm.add_nodes(1, 2)
        q = arm.queue("all")
        jobs = {
            "f-half": {GPU: 1, GPUCORES: 50, GPUMEM_PERCENTAGE: 50},
            "f-mib": {GPU: 1, GPUCORES: 25, GPUMEM: 20000},
            "f-mem": {GPU: 1, GPUMEM_PERCENTAGE: 25},
            "whole": {GPU: 1},
        }
        for name, res in jobs.items():
            gpu_job(hapi, hns, name, q, res)
        c = h.new_controller(hplane.kubeconfig, h.live_settings(**settings_env()))
        with h.started(c):
            h.converge(c)
            for name in ("f-half", "f-mib", "f-mem"):
                assert wait_template_annotation(
                    hapi, hns, name, HAMI_GPU_POLICY_ANNOTATION) == "binpack"
            arm.open("all", 4)
            pods = {name: wait_placed(hapi, hns, name) for name in jobs}
            placed = {n: p for n, p in pods.items() if p is not None}
            assert placed.keys() == jobs.keys(), f"HAMi refused {jobs.keys() - placed.keys()}"
            allocs = {n: allocations(p) for n, p in placed.items()}
            print({n: [(a.uuid, a.mem_mib, a.cores) for a in al] for n, al in allocs.items()})
            node = next(iter(arm.cards))
            assert {p["metadata"]["annotations"][hami.ASSIGNED_NODE]
                    for p in placed.values()} == {node}
            frac_cards = {a.uuid for n in ("f-half", "f-mib", "f-mem") for a in allocs[n]}
            assert len(frac_cards) == 1, f"fractions not packed onto one card: {allocs}"
            (whole,) = allocs["whole"]
            assert whole.uuid not in frac_cards
            assert (whole.mem_mib, whole.cores) == (hami.H100_MIB, 100)
            half, mib, mem = allocs["f-half"][0], allocs["f-mib"][0], allocs["f-mem"][0]
            assert (half.mem_mib, half.cores) == (hami.H100_MIB * 50 // 100, 50)
            assert (mib.mem_mib, mib.cores) == (20000, 25)
            assert (mem.mem_mib, mem.cores) == (hami.H100_MIB * 25 // 100, 0)

            # HAMi's own metrics agree with its annotations, card by card.
            by_card: dict[str, list[hami.Allocation]] = {}
            for al in allocs.values():
                for a in al:
                    by_card.setdefault(a.uuid, []).append(a)
            # (HAMi refreshes its metrics on its 15 s registration tick.)
            want = {u: (sum(a.mem_mib for a in al) * 1024 * 1024, len(al))
                    for u, al in by_card.items()}

            def metrics_agree() -> bool | None:
                mem = metrics_by_card(hplane, "hami_gpu_memory_allocated_bytes")
                shared = metrics_by_card(hplane, "hami_gpu_shared_count")
                return all((mem.get(u), shared.get(u)) == w for u, w in want.items()) or None
            kube.wait_for(metrics_agree, 45, f"HAMi's metrics showing {want}")

            # The controller's GPU-equivalents: max(cores, memory share) per allocated card.
            hami_sum = sum(max(a.cores / 100, a.mem_mib / hami.H100_MIB)
                           for al in allocs.values() for a in al)
            report = h.converge(c)
            usage = float(report.plan.teams[hns].usage[f"{arm.flavor}:{GPU}"])
            print(f"controller usage {usage:.4f} GPU-eq, HAMi allocations {hami_sum:.4f}")
            assert usage == pytest.approx(hami_sum, abs=1e-3)
            assert hami_sum == pytest.approx(2.0, abs=1e-3)
    finally:
        teardown(hapi, [arm])


# ----- binpack vs HAMi's defaults -------------------------------------------------------------
@dataclass
class ArmResult:
    placed: dict[str, Obj | None] = field(default_factory=dict)
    whole_free_before: dict[str, int] = field(default_factory=dict)  # multi-GPU job -> count


def whole_free(arm: Arm, placed: Mapping[str, Obj | None]) -> int:
    """Cards of the arm's nodes on which HAMi has allocated nothing (its pod annotations)."""
    used = {a.uuid for pod in placed.values() if pod is not None for a in allocations(pod)}
    return sum(1 for cards in arm.cards.values() for c in cards if c.id not in used)


def run_arrivals(api: k8s.ApiClient, arm: Arm, arrivals: list[str],
                 controller: LiveController | None) -> ArmResult:
    out = ArmResult()
    names = [f"j{i:02d}-{kind}" for i, kind in enumerate(arrivals)]
    for name, kind in zip(names, arrivals, strict=True):
        gpu_job(api, arm.ns, name, arm.queue(name), KINDS[kind])
    for name, kind in zip(names, arrivals, strict=True):
        fractional = GPUCORES in KINDS[kind]
        if controller is not None and fractional:
            # The controller's rule for fractional work: binpack node and card.
            assert wait_template_annotation(api, arm.ns, name,
                                            HAMI_GPU_POLICY_ANNOTATION) == "binpack"
        if KINDS[kind][GPU] > 1:
            out.whole_free_before[name] = whole_free(arm, out.placed)
        arm.open(name, KINDS[kind][GPU])
        out.placed[name] = wait_placed(api, arm.ns, name)
        pod = job_pod(api, arm.ns, name)
        assert pod is not None
        ann = pod["metadata"].get("annotations") or {}
        want = "binpack" if controller is not None and fractional else None
        assert ann.get(HAMI_GPU_POLICY_ANNOTATION) == want, (name, ann)
        assert pod["spec"]["schedulerName"] == hami.SCHEDULER_NAME  # HAMi's webhook ran
    return out


def test_binpack_keeps_whole_gpus_free_and_starts_a_multi_gpu_job(
    hplane: Plane, hapi: k8s.ApiClient, hns: str
) -> None:
    """The same arrival of fractional, whole and multi-GPU Jobs on identical nodes, once with
    HAMi's defaults (node binpack, card spread) and once with the controller's rules: with the
    controller HAMi packs the fractions, more whole GPUs stay free, and a multi-GPU Job starts
    that waits under the defaults."""
    arrivals = os.environ.get("WDRF_HAMI_ARRIVALS", "f,f,g2").split(",")
    nodes, cards = (int(x) for x in os.environ.get("WDRF_HAMI_NODES", "1x3").split("x"))
    assert all(k in KINDS for k in arrivals), f"unknown kinds in {arrivals} (known: {KINDS})"
    default = Arm(hapi, hplane, hns, "dflt")
    other = kube.create_namespace(hapi, labels={hami.LABEL_KEY: hami.LABEL_VALUE})
    wdrf = Arm(hapi, hplane, other, "wdrf")
    try:
        default.add_nodes(nodes, cards)
        wdrf.add_nodes(nodes, cards)
        base = run_arrivals(hapi, default, arrivals, None)
        c = h.new_controller(hplane.kubeconfig, h.live_settings(**settings_env()))
        with h.started(c, loop=True):
            ours = run_arrivals(hapi, wdrf, arrivals, c)
        multi = [n for n in base.whole_free_before]
        rows = [(n, base.whole_free_before[n], ours.whole_free_before[n],
                 base.placed[n] is not None, ours.placed[n] is not None) for n in multi]
        print(f"\n{nodes} nodes x {cards} H100, arrivals {','.join(arrivals)}")
        print("multi-GPU job | whole free GPUs: HAMi defaults / controller | started: "
              "defaults / controller")
        for r in rows:
            print(f"  {r[0]} | {r[1]} / {r[2]} | {r[3]} / {r[4]}")
        print(f"  final whole free GPUs: {whole_free(default, base.placed)} / "
              f"{whole_free(wdrf, ours.placed)}")
        assert multi, "the arrival sequence has no multi-GPU job"
        first = multi[0]
        assert ours.whole_free_before[first] > base.whole_free_before[first], rows
        started_base = sum(1 for n in multi if base.placed[n] is not None)
        started_ours = sum(1 for n in multi if ours.placed[n] is not None)
        assert started_ours >= started_base and started_ours > 0, rows
        if arrivals == ["f", "f", "g2"]:  # the short scenario, exactly
            assert [r[1:] for r in rows] == [(1, 2, False, True)], rows
        # A started multi-GPU Job holds distinct whole cards on one node.
        for n in multi:
            pod = ours.placed[n]
            if pod is None:
                continue
            al = allocations(pod)
            assert len({a.uuid for a in al}) == len(al)
            assert all((a.mem_mib, a.cores) == (hami.H100_MIB, 100) for a in al), al
    finally:
        teardown(hapi, [default, wdrf])


# ----- policy values --------------------------------------------------------------------------
def test_invalid_policy_never_reaches_a_pod_and_a_users_valid_policy_is_kept(
    hplane: Plane, hapi: k8s.ApiClient, hns: str
) -> None:
    """A fraction with no policy gets the controller's binpack; a user's ``spread`` on the pod
    template is kept and HAMi spreads it to the other card; a scheduling-policy value the
    controller refuses leaves the pod without any HAMi policy (HAMi's defaults apply)."""
    arm = Arm(hapi, hplane, hns, "pol")
    try:
        arm.add_nodes(1, 2)
        quarter = KINDS["f"]
        gpu_job(hapi, hns, "ruled", arm.queue("ruled"), quarter)
        gpu_job(hapi, hns, "users", arm.queue("users"), quarter,
                pod_annotations={HAMI_GPU_POLICY_ANNOTATION: "spread"})
        gpu_job(hapi, hns, "typo", arm.queue("typo"), quarter,
                annotations={SCHEDULING_POLICY_ANNOTATION: "binpak"})
        c = h.new_controller(hplane.kubeconfig, h.live_settings(**settings_env()))
        with h.started(c, loop=True):
            assert wait_template_annotation(hapi, hns, "ruled",
                                            HAMI_GPU_POLICY_ANNOTATION) == "binpack"
            assert wait_template_annotation(hapi, hns, "users",
                                            HAMI_NODE_POLICY_ANNOTATION) == "binpack"
            kube.wait_for(lambda: h.events_for(hapi, hns, "typo", "InvalidAnnotation") or None,
                          60, "the controller's InvalidAnnotation Event on Job typo")
            pods: dict[str, Obj] = {}
            for name in ("ruled", "users", "typo"):
                arm.open(name, 1)
                pod = wait_placed(hapi, hns, name)
                assert pod is not None, f"HAMi refused {name}"
                pods[name] = pod
        ann = {n: p["metadata"].get("annotations") or {} for n, p in pods.items()}
        assert ann["ruled"][HAMI_GPU_POLICY_ANNOTATION] == "binpack"
        assert ann["users"][HAMI_GPU_POLICY_ANNOTATION] == "spread"
        assert HAMI_GPU_POLICY_ANNOTATION not in ann["typo"], ann["typo"]
        assert HAMI_NODE_POLICY_ANNOTATION not in ann["typo"], ann["typo"]
        tmpl = kube.get_job(hapi, hns, "typo")["spec"]["template"]["metadata"]
        assert not set(tmpl.get("annotations") or {}) & {
            HAMI_GPU_POLICY_ANNOTATION, HAMI_NODE_POLICY_ANNOTATION}
        # HAMi honoured the user's spread: the second quarter went to the empty card, where the
        # controller's binpack would have stacked it on the first.
        (ruled,), (users,) = allocations(pods["ruled"]), allocations(pods["users"])
        assert ruled.uuid != users.uuid
    finally:
        teardown(hapi, [arm])
