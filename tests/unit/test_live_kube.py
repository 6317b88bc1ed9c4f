"""The Kubernetes client adapter: start-up errors, what its writes carry."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client as k8s_client

from controller.live.kube import KubeTransport, load_api_client


def test_no_kubeconfig_outside_a_cluster_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError) as err:
        load_api_client()
    assert "not running in a cluster" in str(err.value)
    assert "--from-file" in str(err.value)


class _Answer:
    status = 200
    reason = "OK"

    def __init__(self) -> None:
        self.response = self

    data = b"{}"

    def release_conn(self) -> None:
        pass


@pytest.mark.parametrize(("method", "query", "sent"), [
    ("PATCH", None, "wdrf-controller/pod-1_ab"),
    ("PUT", {"x": "1"}, "wdrf-controller/pod-1_ab"),
    ("POST", None, "wdrf-controller/pod-1_ab"),
    ("PATCH", {"fieldManager": "mine"}, "mine"),  # a caller's own name wins
    ("GET", None, None),
    ("DELETE", None, None),
])
def test_writes_name_the_replica_as_their_field_manager(
    method: str, query: dict[str, str] | None, sent: str | None
) -> None:
    """Each replica's writes carry its own field manager, so the managedFields of what it
    changed say which replica did (the apiserver's default, the User-Agent up to its "/",
    is the same for every replica)."""
    configuration = k8s_client.Configuration()
    configuration.host = "http://127.0.0.1:1"
    api = k8s_client.ApiClient(configuration)
    urls: list[str] = []

    def request(method_: str, url: str, **_: object) -> _Answer:
        urls.append(url)
        return _Answer()

    api.rest_client.request = request
    t = KubeTransport(api, "wdrf-controller/pod-1_ab", "wdrf-controller/pod-1_ab")
    t.request(method, "/api/v1/namespaces/x/configmaps/y", query=query,
              body=None if method in ("GET", "DELETE") else {})
    managers = parse_qs(urlsplit(urls[0]).query).get("fieldManager")
    assert managers == ([sent] if sent else None)


def test_a_transport_without_a_field_manager_leaves_it_to_the_apiserver() -> None:
    configuration = k8s_client.Configuration()
    configuration.host = "http://127.0.0.1:1"
    api = k8s_client.ApiClient(configuration)
    urls: list[str] = []
    api.rest_client.request = lambda m, url, **_: urls.append(url) or _Answer()
    KubeTransport(api).request("PATCH", "/api/v1/namespaces/x/configmaps/y", body=[])
    assert "fieldManager" not in urls[0]
