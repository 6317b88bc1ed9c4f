"""Publishing: patch the Node annotation only on change (or to refresh the timestamp), Events on
health transitions, restarts that do not re-patch, failures that are retried, never raised."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.agent import kube as agent_kube
from controller.agent.metrics import new_registry, render
from controller.agent.nvml import NvmlReader
from controller.agent.publish import (
    REASON_HEALTHY,
    REASON_MISSING,
    REASON_UNHEALTHY,
    KubeError,
    NodeEvent,
    NodeInfo,
    annotation_patch,
)
from controller.agent.runner import Agent, AgentConfig
from controller.domain import GPU_INVENTORY_ANNOTATION
from controller.inventory import (
    AgentGpu,
    AgentInventory,
    decode_agent_inventory,
    encode_agent_inventory,
)
from tests.support.fakenvml import FakeNvml, h100s

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


@dataclass
class FakeNodeClient:
    annotations: dict[str, str] = field(default_factory=dict)
    uid: str = "node-uid-1"
    patches: list[dict[str, str]] = field(default_factory=list)
    events: list[NodeEvent] = field(default_factory=list)
    fail_patch: bool = False
    fail_read: bool = False

    def read_node(self, name: str) -> NodeInfo:
        if self.fail_read:
            raise KubeError(f"reading node {name}: HTTP 403 Forbidden")
        return NodeInfo(name, self.uid, dict(self.annotations))

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str]) -> None:
        if self.fail_patch:
            raise KubeError(f"patching node {name}: HTTP 500")
        self.patches.append(dict(annotations))
        self.annotations.update(annotations)

    def create_event(self, event: NodeEvent) -> None:
        self.events.append(event)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    f = FakeNvml(gpus=h100s(4))
    f.install(monkeypatch.setattr)
    yield f


def agent_for(client: FakeNodeClient, clock: Clock, refresh: float = 120) -> Agent:
    config = AgentConfig("gpu-1", refresh=timedelta(seconds=refresh))
    _, collector = new_registry()
    agent = Agent(config, NvmlReader(), collector, client, clock)
    agent.start()
    return agent


def published(client: FakeNodeClient) -> AgentInventory:
    return decode_agent_inventory(client.annotations[GPU_INVENTORY_ANNOTATION])


def test_patch_only_on_change_and_refresh(fake: FakeNvml) -> None:
    client, clock = FakeNodeClient(), Clock()
    agent = agent_for(client, clock, refresh=120)
    assert agent.step().patched
    assert len(client.patches) == 1
    assert list(client.patches[0]) == [GPU_INVENTORY_ANNOTATION]  # only our annotation
    assert published(client).observed == T0
    for _ in range(7):  # 105 s of unchanged content: no patches
        clock.advance(15)
        fake.gpus[0].util_gpu += 10  # readings change; the inventory content does not
        assert not agent.step().patched
    assert len(client.patches) == 1
    clock.advance(15)  # 120 s since the last patch: refresh the timestamp
    assert agent.step().patched
    assert published(client).observed == T0 + timedelta(seconds=120)
    clock.advance(15)
    fake.gpus[2].ecc_uncorrected = 1  # content change: patch at once
    assert agent.step().patched
    assert len(client.patches) == 3
    assert [g.healthy for g in published(client).gpus] == [True, True, False, True]


def test_unhealthy_gpu_event_once_then_recovery(fake: FakeNvml) -> None:
    client, clock = FakeNodeClient(), Clock()
    agent = agent_for(client, clock)
    agent.step()
    assert client.events == []
    fake.gpus[1].temperature = 95
    clock.advance(15)
    agent.step()
    (ev,) = client.events
    assert (ev.node, ev.node_uid, ev.type, ev.reason) == (
        "gpu-1",
        "node-uid-1",
        "Warning",
        REASON_UNHEALTHY,
    )
    assert "GPU 1 (GPU-0001" in ev.message and "temperature above 85C" in ev.message
    assert "left out of WDRF GPU capacity" in ev.message
    clock.advance(15)
    agent.step()
    assert len(client.events) == 1  # still hot: no repeat
    fake.gpus[1].ecc_uncorrected = 2  # a new reason: tell again
    clock.advance(15)
    agent.step()
    assert len(client.events) == 2 and "uncorrectable ECC errors" in client.events[1].message
    fake.gpus[1].temperature = 40
    fake.gpus[1].ecc_uncorrected = 0
    clock.advance(15)
    agent.step()
    assert client.events[-1].reason == REASON_HEALTHY and client.events[-1].type == "Normal"


def test_vanished_gpu_event(fake: FakeNvml) -> None:
    client, clock = FakeNodeClient(), Clock()
    agent = agent_for(client, clock)
    agent.step()
    fake.gpus.pop()
    clock.advance(15)
    assert agent.step().patched
    (ev,) = client.events
    assert ev.reason == REASON_MISSING and "GPU-0003" in ev.message
    assert len(published(client).gpus) == 3


def test_restart_with_same_content_does_not_repatch_or_reannounce(fake: FakeNvml) -> None:
    fake.gpus[0].temperature = 99
    client, clock = FakeNodeClient(), Clock()
    agent_for(client, clock).step()
    assert len(client.patches) == 1 and len(client.events) == 1
    clock.advance(30)
    agent_for(client, clock).step()  # a new process: learns from the Node's annotation
    assert len(client.patches) == 1 and len(client.events) == 1
    clock.advance(120)
    agent_for(client, clock).step()  # but refreshes an old timestamp
    assert len(client.patches) == 2


def test_restart_over_garbage_annotation_patches(fake: FakeNvml) -> None:
    client = FakeNodeClient(annotations={GPU_INVENTORY_ANNOTATION: "{broken"})
    agent_for(client, Clock()).step()
    assert len(client.patches) == 1
    assert len(published(client).gpus) == 4


def test_patch_failure_is_retried_and_counted(fake: FakeNvml) -> None:
    client, clock = FakeNodeClient(fail_patch=True), Clock()
    registry, collector = new_registry()
    agent = Agent(AgentConfig("gpu-1"), NvmlReader(), collector, client, clock)
    agent.start()
    fake.gpus[3].ecc_uncorrected = 1
    result = agent.step()  # must not raise
    assert not result.patched and client.events == []  # events wait for a successful patch
    client.fail_patch = False
    clock.advance(15)
    assert agent.step().patched
    assert [e.reason for e in client.events] == [REASON_UNHEALTHY]
    text = render(registry)
    assert 'wdrf_gpu_inventory_patches_total{result="error"} 1.0' in text
    assert 'wdrf_gpu_inventory_patches_total{result="ok"} 1.0' in text
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "wdrf_gpu_inventory_published_timestamp_seconds"
    ]
    assert family.samples[0].value == clock.now.timestamp()


def test_start_fails_clearly_when_node_unreadable(fake: FakeNvml) -> None:
    client = FakeNodeClient(fail_read=True)
    agent = Agent(AgentConfig("gpu-1"), NvmlReader(), new_registry()[1], client, Clock())
    with pytest.raises(KubeError, match="HTTP 403"):
        agent.start()


def test_annotation_patch_body_is_metadata_annotations_only() -> None:
    inv = AgentInventory(T0, (AgentGpu("G", 0, "m", 1),))
    body = annotation_patch(inv)
    assert body == {
        "metadata": {"annotations": {GPU_INVENTORY_ANNOTATION: encode_agent_inventory(inv)}}
    }


def test_kube_adapter_uses_merge_patch_and_node_events(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any, Any]] = []

    def patch_node(self: Any, name: str, body: Any, **kw: Any) -> None:
        calls.append(("patch", name, (body, kw)))

    def create_event(self: Any, namespace: str, body: Any, **kw: Any) -> None:
        calls.append(("event", namespace, body))

    monkeypatch.setattr(agent_kube.client.CoreV1Api, "patch_node", patch_node)
    monkeypatch.setattr(agent_kube.client.CoreV1Api, "create_namespaced_event", create_event)
    kc = agent_kube.KubeNodeClient(agent_kube.client.ApiClient(), event_namespace="wdrf-system")
    kc.patch_node_annotations("gpu-1", {GPU_INVENTORY_ANNOTATION: "{}"})
    kc.create_event(NodeEvent("gpu-1", "uid-1", "Warning", REASON_UNHEALTHY, "hot", T0))
    (_, name, (body, kw)), (_, ns, ev) = calls
    assert name == "gpu-1" and kw == {"_content_type": "application/merge-patch+json"}
    assert body == {"metadata": {"annotations": {GPU_INVENTORY_ANNOTATION: "{}"}}}
    assert ns == "wdrf-system"
    assert (ev.involved_object.kind, ev.involved_object.name, ev.involved_object.uid) == (
        "Node",
        "gpu-1",
        "uid-1",
    )
    assert ev.reason == REASON_UNHEALTHY and ev.type == "Warning" and ev.count == 1
    assert ev.metadata.name.startswith("gpu-1.")


def test_kube_adapter_turns_api_errors_into_kube_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def patch_node(self: Any, name: str, body: Any, **kw: Any) -> None:
        raise agent_kube.ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(agent_kube.client.CoreV1Api, "patch_node", patch_node)
    kc = agent_kube.KubeNodeClient(agent_kube.client.ApiClient())
    with pytest.raises(KubeError, match="patching node gpu-1: HTTP 403 Forbidden"):
        kc.patch_node_annotations("gpu-1", {"a": "b"})


def test_missing_kubeconfig_is_a_kube_error(tmp_path: Any) -> None:
    with pytest.raises(KubeError, match="cannot load Kubernetes credentials"):
        agent_kube.load_api_client(str(tmp_path / "nope.yaml"))


def test_json_is_what_inventory_decodes(fake: FakeNvml) -> None:
    fake.gpus[0].fail = {"nvmlDeviceGetName": pynvml.NVML_ERROR_GPU_IS_LOST}
    client = FakeNodeClient()
    agent_for(client, Clock()).step()
    raw = json.loads(client.annotations[GPU_INVENTORY_ANNOTATION])
    assert raw["gpus"][0]["reasons"] == ["NVML error reading name: GPU is lost"]
    assert raw["gpus"][0]["model"] == ""
