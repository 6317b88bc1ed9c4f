"""Offline checks of manifests/agent/: renders, validates against the Kubernetes 1.36 schemas,
grants exactly the agent's RBAC, runs locked down on GPU nodes. The admission policy itself is
exercised on the real control plane (tests/plane/test_agent_plane.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from controller.domain import GPU_INVENTORY_ANNOTATION
from tests.support.kube import render_kustomize

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "manifests" / "agent"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    return render_kustomize(AGENT)


def one(objs: list[Obj], kind: str) -> Obj:
    hits = [o for o in objs if o["kind"] == kind]
    assert len(hits) == 1, kind
    return hits[0]


def test_renders_the_expected_objects_and_validates(rendered: list[Obj]) -> None:
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in rendered) == [
        "ClusterRole/wdrf-gpu-agent",
        "ClusterRoleBinding/wdrf-gpu-agent",
        "DaemonSet/wdrf-gpu-agent",
        "NetworkPolicy/wdrf-gpu-agent",  # docs/security.md S8
        "Role/wdrf-gpu-agent-events",
        "RoleBinding/wdrf-gpu-agent-events",
        "ServiceAccount/wdrf-gpu-agent",
        "ValidatingAdmissionPolicy/wdrf-gpu-agent-own-node",
        "ValidatingAdmissionPolicyBinding/wdrf-gpu-agent-own-node",
    ]
    for o in rendered:
        kubernetes_validate.validate(o, "1.36.0", strict=True)
        cluster_scoped = o["kind"].startswith(("Cluster", "ValidatingAdmission"))
        assert ("namespace" in o["metadata"]) != cluster_scoped, o["kind"]
        if o["kind"] in ("ServiceAccount", "DaemonSet"):
            assert o["metadata"]["namespace"] == "kueue-system"


def test_rbac_is_minimal(rendered: list[Obj]) -> None:
    assert one(rendered, "ClusterRole")["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}
    ]
    assert one(rendered, "Role")["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
    ]
    # Events about Nodes are only accepted in "default"; the agent SA stays in kueue-system.
    assert one(rendered, "Role")["metadata"]["namespace"] == "default"
    assert one(rendered, "RoleBinding")["metadata"]["namespace"] == "default"
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        (subject,) = one(rendered, kind)["subjects"]
        assert subject == {
            "kind": "ServiceAccount",
            "name": "wdrf-gpu-agent",
            "namespace": "kueue-system",
        }


def test_admission_policy_binds_and_guards_the_annotation(rendered: list[Obj]) -> None:
    policy = one(rendered, "ValidatingAdmissionPolicy")
    binding = one(rendered, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    text = yaml.safe_dump(policy)
    assert "authentication.kubernetes.io/node-name" in text
    assert GPU_INVENTORY_ANNOTATION in text
    assert ":wdrf-gpu-agent" in text


def test_daemonset_runs_on_gpu_nodes_locked_down(rendered: list[Obj]) -> None:
    ds = one(rendered, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["serviceAccountName"] == "wdrf-gpu-agent"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["args"] == ["agent"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "nvidia.com/gpu" not in str(c["resources"])  # watches GPUs, takes none
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    port = env["AGENT_METRICS_PORT"]["value"]
    assert c["ports"] == [{"name": "metrics", "containerPort": int(port), "protocol": "TCP"}]


def test_every_env_var_is_an_agent_flag(rendered: list[Obj]) -> None:
    from controller.agent.cli import agent

    known = {
        e
        for p in agent.params
        for e in ([p.envvar] if isinstance(p.envvar, str) else (p.envvar or []))
    }
    (c,) = one(rendered, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    ours = {e["name"] for e in c["env"] if e["name"].startswith(("AGENT_", "NODE_", "POD_"))}
    assert ours <= known, ours - known
