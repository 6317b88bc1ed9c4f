"""The one place the controller imports the `kubernetes` client.

It is used only for what it is good at: reading a kubeconfig or the in-cluster service
account, authentication headers (including token refresh), TLS and connection pooling.
Requests and answers stay plain JSON: no generated models, so 5,000 Workloads cost a dict
each, not a tree of model objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from controller.live.api import JSON, ApiError, write_time_left

DEFAULT_TIMEOUT = 30.0
STREAM_SILENCE = 120.0  # seconds without a byte on a watch: the connection is dead
POOL_SIZE = 32
# Requests that record a field manager in the objects they change (managedFields).
MANAGED_WRITES = frozenset({"POST", "PUT", "PATCH"})
MAX_FIELD_MANAGER = 128  # kube-apiserver refuses longer names


NO_CREDENTIALS_HINT = (
    "pass --kubeconfig PATH (or set KUBECONFIG or KUBECONFIG_PATH), or plan offline:"
    " python -m controller --from-file examples/cluster-snapshot.yaml"
)


def load_api_client(kubeconfig: str | None = None, context: str | None = None,
                    hint: str = NO_CREDENTIALS_HINT) -> Any:
    """An authenticated `kubernetes.client.ApiClient` (the controller's, the admin commands'
    and the node agent's).

    Order: an explicit kubeconfig, $KUBECONFIG / ~/.kube/config, then the in-cluster
    service account. Without any: RuntimeError saying so, then `hint`.
    """
    configuration = k8s_client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if kubeconfig or os.path.exists(path):
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration
        )
    else:
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except k8s_config.ConfigException as e:
            raise RuntimeError(
                f"no kubeconfig at {path} and not running in a cluster ({e}); {hint}"
            ) from e
    configuration.connection_pool_maxsize = POOL_SIZE
    return k8s_client.ApiClient(configuration)


def kubeconfig_namespace(kubeconfig: str | None = None,
                         context: str | None = None) -> str | None:
    """The namespace of the kubeconfig's context (``context`` or the current one), as kubectl
    defaults to it; None when there is no kubeconfig or it names no namespace."""
    path = (kubeconfig or os.environ.get("KUBECONFIG")
            or os.path.expanduser("~/.kube/config")).split(os.pathsep)[0]
    if not os.path.exists(path):
        return None
    contexts, active = k8s_config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
        config_file=path)
    chosen = next((c for c in contexts if c.get("name") == context), None) or active
    ns = ((chosen or {}).get("context") or {}).get("namespace")
    return str(ns) if ns else None


class KubeTransport:
    """`controller.live.api.Transport` over a `kubernetes` ApiClient."""

    def __init__(self, api_client: Any, user_agent: str = "wdrf-controller",
                 field_manager: str = "") -> None:
        self._api = api_client
        self._api.user_agent = user_agent
        # Without one the apiserver names the manager after the User-Agent up to its first
        # "/" ("wdrf-controller"), the same for every replica.
        self._field_manager = field_manager[:MAX_FIELD_MANAGER]
        self._streams: set[Any] = set()  # open watch responses, closed by `close()`
        self._lock = threading.Lock()

    @classmethod
    def from_config(
        cls, kubeconfig: str | None = None, context: str | None = None,
        user_agent: str = "wdrf-controller", field_manager: str = "",
    ) -> KubeTransport:
        return cls(load_api_client(kubeconfig, context), user_agent, field_manager)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str | None,
        timeout: Any,
    ) -> Any:
        headers: dict[str, str] = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        if self._field_manager and method in MANAGED_WRITES and "fieldManager" not in (
                query or {}):
            query = {**(query or {}), "fieldManager": self._field_manager}
        _, url, header_params, _, _ = self._api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        # The last moment before the request goes on the wire: a write whose deadline has
        # passed (the process was paused, or waited behind other requests) is refused here;
        # one that is sent may take at most the time left.
        left = write_time_left(method, path)
        if left is not None:
            timeout = left if not isinstance(timeout, (int, float)) else min(timeout, left)
        try:
            response = self._api.rest_client.request(
                method, url, headers=header_params, body=body, _request_timeout=timeout
            )
        except ApiException as e:
            raise ApiError(int(e.status or 0), str(e.reason), str(e.body or "")) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ApiError(0, type(e).__name__, str(e)) from e
        raw = response.response
        if not 200 <= response.status < 300:
            try:
                text = raw.data.decode("utf-8", "replace")
            except (urllib3.exceptions.HTTPError, OSError):
                text = ""
            finally:
                raw.release_conn()
            raise ApiError(int(response.status), str(response.reason), text)
        return raw

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        raw = self._send(method, path, query, body, content_type, timeout or DEFAULT_TIMEOUT)
        try:
            data = raw.data
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ApiError(0, type(e).__name__, str(e)) from e
        finally:
            raw.release_conn()
        return json.loads(data) if data else None

    def stream(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> Iterator[JSON]:
        # kube-apiserver sends a bookmark roughly every minute (and 2 s before the watch's
        # timeout): 2 minutes without a byte means a dead connection (no FIN) — end it.
        read_timeout = min((timeout or DEFAULT_TIMEOUT) + 15.0, STREAM_SILENCE)
        raw = self._send("GET", path, query, None, None, (5.0, read_timeout))
        with self._lock:
            self._streams.add(raw)
        return self._lines(raw)

    def close(self) -> None:
        """End every open watch now (shutdown): their readers get an error and see `stop`."""
        with self._lock:
            streams, self._streams = list(self._streams), set()
        for raw in streams:
            # A stream can end (its connection back in the pool) between the copy above and
            # its shutdown: urllib3 then raises RuntimeError/ValueError; it is closed already.
            with contextlib.suppress(urllib3.exceptions.HTTPError, OSError, RuntimeError,
                                     ValueError):
                if hasattr(raw, "shutdown"):
                    raw.shutdown()
                else:
                    raw.close()

    def _lines(self, raw: Any) -> Iterator[JSON]:
        try:
            yield from _lines(raw)
        finally:
            with self._lock:
                self._streams.discard(raw)


def _lines(raw: Any) -> Iterator[JSON]:
    pending = b""
    try:
        for chunk in raw.stream(16 * 1024, decode_content=True):
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    yield json.loads(line)
        if pending.strip():
            yield json.loads(pending)
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ApiError(0, type(e).__name__, str(e)) from e
    finally:
        raw.release_conn()
