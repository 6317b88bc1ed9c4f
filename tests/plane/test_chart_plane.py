"""Proof on a real plane of its own (the session plane already holds manifests/'s objects):
`helm install` of charts/wdrf-controller against kube-apiserver, then the controller run
exactly as the installed Deployment would run it - its args and env, the installed ConfigMap
as its config file, the chart's ServiceAccount token - passes --health-check and writes a
priority in one cycle; `helm upgrade` changes the Deployment; `helm uninstall` removes
everything, and `reset` then clears what the controller wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.config import KEYS
from controller.domain import KUEUE_PRIORITY_BOOST_ANNOTATION
from tests.support import kube
from tests.support.plane import Plane

pytestmark = pytest.mark.plane

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "wdrf-controller"
HELM = ROOT / "tools" / "bin" / "helm"
NS = "kueue-system"
SA = "wdrf-controller"
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def own_plane() -> Iterator[Plane]:
    assert HELM.exists(), f"{HELM} is missing: `make helm` (or `make tools`) builds it"
    with Plane.temporary() as plane:
        yield plane


def helm(plane: Plane, *args: str) -> str:
    out = subprocess.run([str(HELM), *args, "--kubeconfig", str(plane.kubeconfig),
                          "--namespace", NS], capture_output=True, text=True, timeout=180,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def sa_kubeconfig(plane: Plane, token: str, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "plane", "cluster": {
            "server": plane.server, "certificate-authority": str(plane.pki.ca_crt)}}],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "plane", "user": SA}}]}))
    return path


def run_as_deployment(api: k8s.ApiClient, kubeconfig: Path, tmp_path: Path,
                      *extra: str) -> subprocess.CompletedProcess[str]:
    """`python -m controller` (the image's entrypoint) with the installed Deployment's args
    and env, its ConfigMap's config file mounted where the args say."""
    dep = kube.request(api, "GET", f"/apis/apps/v1/namespaces/{NS}/deployments/wdrf-controller")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == "config")
    cm = kube.request(api, "GET", f"/api/v1/namespaces/{NS}/configmaps/{cm_name}")
    mount = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "config")
    config_dir = tmp_path / "config"
    config_dir.mkdir(exist_ok=True)
    for name, text in cm["data"].items():
        (config_dir / name).write_text(text)
    args = [a.replace(mount, str(config_dir)) for a in c.get("args", [])]
    fields = {"metadata.namespace": NS, "metadata.name": "wdrf-controller-chart-pod"}
    env = {k: v for k, v in os.environ.items() if k not in KEYS}
    for e in c.get("env", []):
        env[e["name"]] = e.get("value") or fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    env.update({"KUBECONFIG": str(kubeconfig), "METRICS_PORT": "0"})
    return subprocess.run([sys.executable, "-m", "controller", *args, *extra], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180, check=False)


def test_helm_install_run_upgrade_uninstall_reset(own_plane: Plane, tmp_path: Path) -> None:
    api = own_plane.api_client()
    out = helm(own_plane, "install", "wdrf", str(CHART), "--set", "history.enabled=true",
               "--set", "agent.enabled=true", "--set", "image.tag=9.9.9")
    assert "STATUS: deployed" in out and "Usage history: on" in out, out
    manifest = [d for d in yaml.safe_load_all(helm(own_plane, "get", "manifest", "wdrf")) if d]
    kinds = {(o["kind"], o["metadata"]["name"]) for o in manifest}
    assert {("Deployment", "wdrf-controller"), ("DaemonSet", "wdrf-gpu-agent"),
            ("ValidatingAdmissionPolicy", "wdrf-class-annotations"),
            ("Role", "wdrf-controller-usage-history")} <= kinds
    for kind, name in kinds:  # every object exists on the server
        path = {"Deployment": f"/apis/apps/v1/namespaces/{NS}/deployments/{name}",
                "ClusterRole": f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}"}.get(kind)
        if path:
            kube.request(api, "GET", path)
    dep = kube.request(api, "GET", f"/apis/apps/v1/namespaces/{NS}/deployments/wdrf-controller")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":9.9.9")

    # something to prioritise
    ns = kube.create_namespace(api)
    _, lq = kube.create_queues(api, ns, {"cpu": 1})
    kube.create_job(api, ns, "run", lq)
    kube.wait_for_workload_condition(
        api, ns, kube.workload_for_job(api, ns, "run")["metadata"]["name"], "QuotaReserved")
    kube.create_job(api, ns, "wait", lq)
    wl = kube.workload_for_job(api, ns, "wait")["metadata"]["name"]
    kube.wait_for_workload_condition(api, ns, wl, "QuotaReserved", "False")

    token = kube.service_account_token(api, NS, SA)
    sa = sa_kubeconfig(own_plane, token, tmp_path / "sa.kubeconfig")
    health = run_as_deployment(api, sa, tmp_path, "--health-check")
    assert health.returncode == 0, health.stdout + health.stderr[-3000:]
    assert "HEALTHY" in health.stdout
    once = run_as_deployment(api, sa, tmp_path, "--once")
    assert once.returncode == 0, once.stdout[-3000:] + once.stderr[-3000:]
    assert "Forbidden" not in once.stdout + once.stderr
    ann = kube.get_workload(api, ns, wl)["metadata"].get("annotations") or {}
    assert int(ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION, 0)) > 0, (  # the plane's Kueue: boost
        ann, once.stdout[-3000:], once.stderr[-3000:])

    helm(own_plane, "upgrade", "wdrf", str(CHART), "--reuse-values", "--set", "replicas=1")
    dep = kube.request(api, "GET", f"/apis/apps/v1/namespaces/{NS}/deployments/wdrf-controller")
    assert dep["spec"]["replicas"] == 1

    helm(own_plane, "uninstall", "wdrf", "--wait", "--timeout", "60s")
    for path in (f"/apis/apps/v1/namespaces/{NS}/deployments/wdrf-controller",
                 "/apis/rbac.authorization.k8s.io/v1/clusterroles/wdrf-controller",
                 "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"
                 "wdrf-class-annotations"):
        with pytest.raises(ApiException) as gone:
            kube.request(api, "GET", path)
        assert gone.value.status == 404, path

    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBECONFIG")}
    env["KUBECONFIG"] = str(own_plane.kubeconfig)
    reset = subprocess.run([sys.executable, "-m", "controller", "reset", "--yes"], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120, check=False)
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert f"{ns}/{wl}: remove {KUEUE_PRIORITY_BOOST_ANNOTATION}" in reset.stdout, reset.stdout
    ann = kube.get_workload(api, ns, wl)["metadata"].get("annotations") or {}
    assert KUEUE_PRIORITY_BOOST_ANNOTATION not in ann, ann
