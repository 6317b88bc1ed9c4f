"""Publishing the inventory on the agent's own Node: the annotation and the Events.

The annotation is patched only when its content (everything but the timestamp) changed, or
when the last patch is older than the refresh interval, so the controller can tell a live agent
from a dead one (``controller.inventory`` ignores inventories older than its max age).
The Kubernetes calls sit behind ``NodeClient``; ``controller.agent.kube`` implements it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Protocol

from controller.domain import GPU_INVENTORY_ANNOTATION
from controller.inventory import (
    AgentGpu,
    AgentInventory,
    InventoryFormatError,
    decode_agent_inventory,
    encode_agent_inventory,
)

log = logging.getLogger(__name__)

COMPONENT = "wdrf-gpu-agent"
REASON_UNHEALTHY = "GpuUnhealthy"
REASON_HEALTHY = "GpuHealthy"
REASON_MISSING = "GpuMissing"


def _no_annotations() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    uid: str = ""
    annotations: Mapping[str, str] = field(default_factory=_no_annotations)


@dataclass(frozen=True, slots=True)
class NodeEvent:
    node: str
    node_uid: str
    type: str  # "Warning" | "Normal"
    reason: str
    message: str
    time: datetime


class NodeClient(Protocol):
    def read_node(self, name: str) -> NodeInfo: ...

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str]) -> None: ...

    def create_event(self, event: NodeEvent) -> None: ...


class KubeError(RuntimeError):
    """A Kubernetes call failed; the message says which and why (no traceback needed)."""


def annotation_patch(inventory: AgentInventory) -> dict[str, object]:
    """The JSON merge patch body: metadata.annotations only, nothing else."""
    return {
        "metadata": {"annotations": {GPU_INVENTORY_ANNOTATION: encode_agent_inventory(inventory)}}
    }


def needs_patch(
    last_key: str | None,
    last_published: datetime | None,
    inventory: AgentInventory,
    refresh: timedelta,
) -> bool:
    if last_key is None or last_published is None:
        return True
    if inventory.content_key() != last_key:
        return True
    return inventory.observed - last_published >= refresh


def _describe(g: AgentGpu) -> str:
    return f"GPU {g.index} ({g.uuid}, {g.model or 'unknown model'})"


def health_events(
    node: NodeInfo,
    before: Mapping[str, AgentGpu],
    after: Sequence[AgentGpu],
    now: datetime,
) -> list[NodeEvent]:
    """Events for GPUs that became unhealthy (or gained new reasons), recovered, or vanished."""
    out: list[NodeEvent] = []

    def event(kind: str, reason: str, message: str) -> None:
        out.append(NodeEvent(node.name, node.uid, kind, reason, message, now))

    for g in after:
        prev = before.get(g.uuid)
        if not g.healthy:
            new_reasons = set(g.reasons) - set(prev.reasons if prev and not prev.healthy else ())
            if prev is None or prev.healthy or new_reasons:
                event(
                    "Warning",
                    REASON_UNHEALTHY,
                    f"{_describe(g)} is unhealthy: {'; '.join(g.reasons)}; "
                    "left out of WDRF GPU capacity",
                )
        elif prev is not None and not prev.healthy:
            event("Normal", REASON_HEALTHY, f"{_describe(g)} is healthy again")
    seen = {g.uuid for g in after}
    for uuid, g in sorted(before.items()):
        if uuid not in seen:
            event(
                "Warning",
                REASON_MISSING,
                f"{_describe(g)} is no longer reported by NVML; left out of WDRF GPU capacity",
            )
    return out


class Publisher:
    """Keeps the Node's annotation in step with the inventory and reports health changes."""

    def __init__(self, client: NodeClient, node_name: str, refresh: timedelta) -> None:
        self.client = client
        self.node = NodeInfo(node_name)
        self.refresh = refresh
        self.last_key: str | None = None
        self.last_published: datetime | None = None
        self.known: dict[str, AgentGpu] = {}  # GPU health as last published
        self.patches: dict[str, int] = {"ok": 0, "error": 0}

    def start(self) -> None:
        """Learn the Node's UID and what an earlier agent published (so a restart does not
        re-patch or re-announce). Raises ``KubeError`` when the Node cannot be read."""
        self.node = self.client.read_node(self.node.name)
        text = self.node.annotations.get(GPU_INVENTORY_ANNOTATION)
        if text is None:
            return
        try:
            previous = decode_agent_inventory(text)
        except InventoryFormatError as e:
            log.warning("ignoring the unreadable inventory already on the node: %s", e)
            return
        self.last_key = previous.content_key()
        self.last_published = previous.observed
        self.known = {g.uuid: g for g in previous.gpus}

    def publish(self, inventory: AgentInventory) -> bool:
        """Patch when needed and send Events; True when the annotation was patched.

        Failures are logged and retried on the next call; never raised.
        """
        events = health_events(self.node, self.known, inventory.gpus, inventory.observed)
        patched = False
        if needs_patch(self.last_key, self.last_published, inventory, self.refresh):
            try:
                text = encode_agent_inventory(inventory)
                self.client.patch_node_annotations(self.node.name, {GPU_INVENTORY_ANNOTATION: text})
            except KubeError as e:
                self.patches["error"] += 1
                log.warning("%s", e)
                return False
            self.patches["ok"] += 1
            self.last_key = inventory.content_key()
            self.last_published = inventory.observed
            patched = True
        self.known = {g.uuid: g for g in inventory.gpus}
        for ev in events:
            try:
                self.client.create_event(ev)
            except KubeError as e:
                log.warning("%s", e)
        return patched
