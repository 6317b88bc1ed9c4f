"""The Kubernetes client adapter's start-up errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.live.kube import load_api_client


def test_no_kubeconfig_outside_a_cluster_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError) as err:
        load_api_client()
    assert "not running in a cluster" in str(err.value)
    assert "--from-file" in str(err.value)
