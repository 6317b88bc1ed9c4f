"""The GPU agent on the real control plane (kube-apiserver with RBAC and admission policies).

- manifests/agent/ is server-side applied (strict field validation; the DaemonSet as a dry run);
- the agent (fake NVML, real ``KubeNodeClient``) authenticates with a ServiceAccount token bound
  to a Pod on its Node, exactly as the kubelet mounts it, and patches that Node's annotation;
- the controller's capacity (``controller.parse`` + ``controller.accounting``) follows the
  annotation: 4 GPUs, 3 when one turns unhealthy (plus a Warning Event on the Node), HAMi's
  register when the agent's inventory is stale;
- RBAC + the ValidatingAdmissionPolicy let the agent do that and nothing else: no other Node,
  no other annotation, no labels, no status, no delete, no Events outside its namespace, and
  nothing at all with a token not bound to a node.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.agent.kube import KubeNodeClient
from controller.agent.metrics import new_registry
from controller.agent.nvml import NvmlReader
from controller.agent.publish import REASON_UNHEALTHY
from controller.agent.runner import Agent, AgentConfig
from controller.domain import GPU, GPU_INVENTORY_ANNOTATION, CapacitySource
from controller.inventory import decode_agent_inventory, encode_agent_inventory, gpu_capacity
from tests.support import kube
from tests.support.fakenvml import FakeGpu, FakeNvml
from tests.support.kube import denial
from tests.support.manifests import ssa

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
NS = "kueue-system"
SA = "wdrf-gpu-agent"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
FIELD_MANAGER = "wdrf-agent-plane-test"
Obj = dict[str, Any]

def render() -> list[Obj]:
    return kube.render_kustomize(ROOT / "manifests" / "agent")


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def get_node(api: k8s.ApiClient, name: str) -> Obj:
    return kube.request(api, "GET", node_path(name))


def annotate(api: k8s.ApiClient, node: str, annotations: dict[str, str | None]) -> Obj:
    return kube.request(api, "PATCH", node_path(node), {"metadata": {"annotations": annotations}})


def controller_capacity(node: Obj, now: datetime) -> tuple[float, CapacitySource]:
    """GPU capacity as the controller computes it from this one Node."""
    from controller.accounting import UNKNOWN_POOL, gpu_inventory, pool_capacities
    from controller.config import Settings
    from controller.parse import build_snapshot

    snapshot = build_snapshot([node])
    assert snapshot.problems == () or all(
        p.object is None or p.object.name == node["metadata"]["name"] for p in snapshot.problems
    )
    inventory, _ = gpu_inventory(snapshot.nodes, Settings(), now)
    pools, source = pool_capacities(snapshot.cluster_queues, inventory)
    vector = pools.get(UNKNOWN_POOL, {})  # no ClusterQueue here: the cluster's own pool
    assert gpu_capacity(inventory) == int(vector.get(GPU, 0))  # the agent's own helper agrees
    return vector.get(GPU, 0.0), source


# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(admin: k8s.ApiClient) -> list[Obj]:
    objs = render()
    for o in objs:
        # no DaemonSet controller here
        ssa(admin, o, dry_run=o["kind"] == "DaemonSet", field_manager=FIELD_MANAGER)
    return objs


@pytest.fixture(scope="module")
def nodes(admin: k8s.ApiClient, installed: list[Obj]) -> Iterator[tuple[str, str]]:
    """Two HAMi-looking GPU nodes: the agent's own and a neighbour."""
    suffix = uuid.uuid4().hex[:5]
    own, other = f"gpu-agent-{suffix}", f"gpu-other-{suffix}"
    for name in (own, other):
        kube.create_gpu_node(admin, name, gpus=4, split=10)
    yield own, other
    for name in (own, other):
        with contextlib.suppress(ApiException):
            kube.request(admin, "DELETE", node_path(name))


def bound_token(admin: k8s.ApiClient, node: str) -> str:
    """A token for the agent's ServiceAccount bound to a Pod on ``node`` (what kubelet mounts)."""
    pod = kube.request(
        admin,
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": kube.unique_name("wdrf-gpu-agent"), "namespace": NS},
            "spec": {
                "nodeName": node,
                "serviceAccountName": SA,
                "automountServiceAccountToken": False,
                "containers": [{"name": "agent", "image": "wdrf-controller:0.1.0"}],
            },
        },
        "application/json",
    )
    tr = kube.request(
        admin,
        "POST",
        f"/api/v1/namespaces/{NS}/serviceaccounts/{SA}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 3600,
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"]["uid"],
                },
            },
        },
        "application/json",
    )
    token: str = tr["status"]["token"]
    return token


@pytest.fixture(scope="module")
def agent_api(admin: k8s.ApiClient, nodes: tuple[str, str]) -> k8s.ApiClient:
    own, other = nodes
    api = kube.token_client(admin, bound_token(admin, own))
    who = kube.whoami(api)
    assert who["username"] == f"system:serviceaccount:{NS}:{SA}"
    assert who.get("extra", {}).get(NODE_CLAIM) == [own], who

    # The policy is picked up asynchronously: wait until it refuses the neighbour's Node.
    def refused() -> bool | None:
        try:
            annotate(api, other, {GPU_INVENTORY_ANNOTATION: "{}"})
        except ApiException as e:
            return True if e.status in (403, 422) else None
        annotate(admin, other, {GPU_INVENTORY_ANNOTATION: None})
        return None

    kube.wait_for(refused, 30, "the agent admission policy to take effect")
    return api


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, nodes: tuple[str, str]) -> FakeNvml:
    own, _ = nodes
    # The same UUIDs HAMi registered for this node (tests/support/kube.py).
    f = FakeNvml(gpus=[FakeGpu(uuid=f"GPU-{own}-{i:02d}") for i in range(4)])
    f.install(monkeypatch.setattr)
    return f


def node_events(admin: k8s.ApiClient, node: str) -> list[Obj]:
    out = kube.request(
        admin,
        "GET",
        "/api/v1/namespaces/default/events",  # the only namespace for Events about Nodes
        query={"fieldSelector": f"involvedObject.kind=Node,involvedObject.name={node}"},
    )
    items: list[Obj] = out["items"]
    return items


# ---------------------------------------------------------------------------------------------


def test_agent_publishes_and_capacity_follows(
    admin: k8s.ApiClient, agent_api: k8s.ApiClient, nodes: tuple[str, str], fake: FakeNvml
) -> None:
    own, _ = nodes
    now = datetime.now(UTC)
    assert controller_capacity(get_node(admin, own), now) == (4.0, CapacitySource.HAMI)

    _registry, collector = new_registry()
    agent = Agent(AgentConfig(own), NvmlReader(), collector, KubeNodeClient(agent_api))
    agent.start()
    assert agent.step().patched
    node = get_node(admin, own)
    inv = decode_agent_inventory(node["metadata"]["annotations"][GPU_INVENTORY_ANNOTATION])
    assert [g.uuid for g in inv.gpus] == [f"GPU-{own}-{i:02d}" for i in range(4)]
    assert controller_capacity(node, datetime.now(UTC)) == (4.0, CapacitySource.AGENT)
    assert not agent.step().patched  # nothing changed: no second patch
    assert node_events(admin, own) == []

    fake.gpus[2].temperature = 97
    assert agent.step().patched
    node = get_node(admin, own)
    assert controller_capacity(node, datetime.now(UTC)) == (3.0, CapacitySource.AGENT)
    inv = decode_agent_inventory(node["metadata"]["annotations"][GPU_INVENTORY_ANNOTATION])
    assert [g.healthy for g in inv.gpus] == [True, True, False, True]
    (event,) = node_events(admin, own)
    assert event["reason"] == REASON_UNHEALTHY and event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == node["metadata"]["uid"]
    assert f"GPU 2 (GPU-{own}-02" in event["message"]
    assert "temperature above 85C" in event["message"]
    # the other annotations (HAMi's, kwok's) were left alone by the merge patch
    assert kube.HAMI_REGISTER in node["metadata"]["annotations"]

    # A stale inventory (a dead agent) is ignored: the controller falls back to HAMi's register.
    stale = inv.__class__(
        observed=datetime.now(UTC) - timedelta(hours=2), gpus=inv.gpus, driver=inv.driver
    )
    annotate(admin, own, {GPU_INVENTORY_ANNOTATION: encode_agent_inventory(stale)})
    assert controller_capacity(get_node(admin, own), datetime.now(UTC)) == (
        4.0,
        CapacitySource.HAMI,
    )


def test_agent_rbac_and_policy_allow_only_its_own_annotation(
    admin: k8s.ApiClient, agent_api: k8s.ApiClient, nodes: tuple[str, str]
) -> None:
    own, other = nodes
    inv_text = '{"v":1,"observed":"2025-01-01T00:00:00Z","gpus":[]}'
    annotate(agent_api, own, {GPU_INVENTORY_ANNOTATION: inv_text})  # allowed
    assert kube.request(agent_api, "GET", node_path(own))["metadata"]["name"] == own

    status, msg = denial(lambda: annotate(agent_api, other, {GPU_INVENTORY_ANNOTATION: inv_text}))
    assert status in (403, 422) and f"bound to node {own}" in msg, msg
    status, msg = denial(lambda: annotate(agent_api, own, {"example.com/x": "1"}))
    assert status in (403, 422) and "only change the wdrf.x-k8s.io/gpu-inventory" in msg, msg
    status, msg = denial(lambda: annotate(agent_api, own, {kube.HAMI_REGISTER: None}))
    assert status in (403, 422), msg
    status, msg = denial(
        lambda: kube.request(
            agent_api, "PATCH", node_path(own), {"metadata": {"labels": {"x": "y"}}}
        )
    )
    assert status in (403, 422) and "labels or spec" in msg, msg
    status, msg = denial(
        lambda: kube.request(agent_api, "PATCH", node_path(own), {"spec": {"unschedulable": True}})
    )
    assert status in (403, 422), msg
    # RBAC: no status, no delete, no list, Events only in "default", no Secrets, no Pods
    for call in (
        lambda: kube.request(
            agent_api,
            "PATCH",
            node_path(own) + "/status",
            {"metadata": {"annotations": {GPU_INVENTORY_ANNOTATION: "x"}}},
        ),
        lambda: kube.request(agent_api, "DELETE", node_path(own)),
        lambda: kube.request(agent_api, "GET", "/api/v1/nodes"),
        lambda: kube.request(
            agent_api,
            "POST",
            f"/api/v1/namespaces/{NS}/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "x.1"},
                "involvedObject": {"kind": "Pod", "name": "p", "namespace": NS},
                "reason": "X",
                "message": "x",
            },
            "application/json",
        ),
        lambda: kube.request(agent_api, "GET", f"/api/v1/namespaces/{NS}/secrets"),
        lambda: kube.request(agent_api, "GET", f"/api/v1/namespaces/{NS}/pods"),
    ):
        assert denial(call)[0] == 403

    # A token of the same ServiceAccount that is not bound to a Pod on a node: no node claim.
    unbound = kube.token_client(admin, kube.service_account_token(admin, NS, SA))
    assert NODE_CLAIM not in kube.whoami(unbound).get("extra", {})
    status, msg = denial(lambda: annotate(unbound, own, {GPU_INVENTORY_ANNOTATION: inv_text}))
    assert status in (403, 422) and "bound to no node" in msg, msg
