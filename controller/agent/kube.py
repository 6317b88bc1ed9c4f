"""The only module of the agent that talks to Kubernetes (the ``kubernetes`` client).

Three calls, matching the agent's RBAC (manifests/agent/): get its Node, merge-patch the Node's
``metadata.annotations``, create core/v1 Events about the Node. Events about a cluster-scoped
object must live in the "default" namespace (API validation), so that is where they go.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from controller.agent.publish import COMPONENT, KubeError, NodeEvent, NodeInfo
from controller.live import kube as live_kube
from controller.live.api import MERGE_PATCH

EVENT_NAMESPACE = "default"  # the only namespace the API accepts for Events about Nodes


def _why(e: Exception) -> str:
    if isinstance(e, ApiException):
        return f"HTTP {e.status} {e.reason}".strip()
    return f"{type(e).__name__}: {e}"


def load_api_client(kubeconfig: str | None = None,
                    context: str | None = None) -> client.ApiClient:
    """`controller.live.kube.load_api_client`, its failures as the agent's `KubeError`."""
    try:
        api: client.ApiClient = live_kube.load_api_client(
            kubeconfig, context, hint="pass --kubeconfig PATH (or set KUBECONFIG)")
        return api
    except (ConfigException, OSError, RuntimeError) as e:
        where = kubeconfig or "in-cluster ServiceAccount"
        raise KubeError(f"cannot load Kubernetes credentials ({where}): {e}") from e


class KubeNodeClient:
    def __init__(self, api: client.ApiClient, event_namespace: str = EVENT_NAMESPACE) -> None:
        self.core = client.CoreV1Api(api)
        self.event_namespace = event_namespace

    def read_node(self, name: str) -> NodeInfo:
        try:
            node = self.core.read_node(name)
        except (ApiException, HTTPError) as e:
            raise KubeError(f"reading node {name}: {_why(e)}") from e
        meta = node.metadata or client.V1ObjectMeta()
        return NodeInfo(name=name, uid=meta.uid or "", annotations=dict(meta.annotations or {}))

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str]) -> None:
        body = {"metadata": {"annotations": dict(annotations)}}
        try:
            self.core.patch_node(name, body, _content_type=MERGE_PATCH)
        except (ApiException, HTTPError) as e:
            raise KubeError(f"patching node {name}: {_why(e)}") from e

    def create_event(self, event: NodeEvent) -> None:
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{event.node}.{uuid.uuid4().hex[:16]}", namespace=self.event_namespace
            ),
            involved_object=client.V1ObjectReference(
                api_version="v1", kind="Node", name=event.node, uid=event.node_uid or None
            ),
            type=event.type,
            reason=event.reason,
            message=event.message,
            source=client.V1EventSource(component=COMPONENT, host=event.node),
            reporting_component=COMPONENT,
            reporting_instance=event.node,
            first_timestamp=event.time,
            last_timestamp=event.time,
            count=1,
        )
        try:
            self.core.create_namespaced_event(self.event_namespace, body)
        except (ApiException, HTTPError) as e:
            raise KubeError(
                f"creating event {event.reason} for node {event.node}: {_why(e)}"
            ) from e
