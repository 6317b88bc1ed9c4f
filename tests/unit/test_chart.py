"""The Helm chart (charts/wdrf-controller) cannot drift from manifests/: it is generated from
them by tools/gen_chart.py (this test fails when it is stale), and `helm template` renders, for
every switch, the same objects as `kubectl kustomize` of the matching folders (up to the Helm
labels, the config checksum and the ConfigMap's hash suffix). Every rendered built-in object
validates against the Kubernetes 1.36 schemas. helm comes from tools/bin (`make helm`).
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from controller.config import load_settings
from tools import gen_chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "wdrf-controller"
MANIFESTS = ROOT / "manifests"
HELM = ROOT / "tools" / "bin" / "helm"
K8S_VERSION = "1.36.0"
NS = "kueue-system"
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
ALL_ON = {"agent.enabled": "true", "history.enabled": "true", "serviceMonitor.enabled": "true",
          "prometheusRule.enabled": "true", "dashboard.enabled": "true"}

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> str:
    assert HELM.exists(), f"{HELM} is missing: `make helm` (or `make tools`) builds it"
    return str(HELM)


def template(helm: str, *sets: str, values: Path | None = None) -> list[Obj]:
    cmd = [helm, "template", "wdrf", str(CHART), "--namespace", NS, "--kube-version",
           K8S_VERSION]
    for s in sets:
        cmd += ["--set", s]
    if values:
        cmd += ["--values", str(values)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def normalize(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    out = {}
    for o in objs:
        o = copy.deepcopy(o)
        meta = o["metadata"]
        for label in HELM_LABELS:
            (meta.get("labels") or {}).pop(label, None)
        if meta["name"].startswith(gen_chart.CONFIG_MAP_PREFIX):
            meta["name"] = "wdrf-controller-config"
        if o["kind"] == "ConfigMap" and meta["name"] == "wdrf-controller-config":
            o["data"] = {"config.yaml": yaml.safe_load(o["data"]["config.yaml"])}
        if o["kind"] in ("Deployment", "DaemonSet"):
            pod = o["spec"]["template"]
            ann = pod["metadata"].get("annotations") or {}
            ann.pop("checksum/config", None)
            if not ann:
                pod["metadata"].pop("annotations", None)
            for v in pod["spec"].get("volumes") or []:
                if str((v.get("configMap") or {}).get("name", "")).startswith(
                        gen_chart.CONFIG_MAP_PREFIX):
                    v["configMap"]["name"] = "wdrf-controller-config"
        out[(o["kind"], meta["name"])] = o
    return out


def diff(chart: dict[tuple[str, str], Obj], kust: dict[tuple[str, str], Obj]) -> str:
    lines = [f"only in the chart: {sorted(set(chart) - set(kust))}",
             f"only in manifests/: {sorted(set(kust) - set(chart))}"]
    for k in sorted(set(chart) & set(kust)):
        if chart[k] != kust[k]:
            lines.append(f"{k} differs:\nchart: {json.dumps(chart[k], sort_keys=True)}\n"
                         f"kustomize: {json.dumps(kust[k], sort_keys=True)}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def renders() -> dict[str, list[Obj]]:
    return {
        "main": gen_chart.kustomize(MANIFESTS),
        "agent": gen_chart.kustomize(MANIFESTS / "agent"),
        "monitoring": gen_chart.kustomize(MANIFESTS / "overlays" / "prometheus"),
        "history": gen_chart.with_component(MANIFESTS / "components" / "usage-history"),
    }


def test_the_chart_is_generated_from_the_current_manifests(tmp_path: Path) -> None:
    assert gen_chart.main(["--check"]) == 0, (
        "charts/wdrf-controller is stale: run `make chart` (tools/gen_chart.py) and commit it")
    # and the generator is deterministic
    assert gen_chart.main(["--out", str(tmp_path)]) == 0
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert f.read_text() == (CHART / f.relative_to(tmp_path)).read_text(), f


@pytest.mark.tools
def test_default_values_render_exactly_manifests(helm: str, renders: dict[str, list[Obj]]) -> None:
    chart = normalize(template(helm))
    kust = normalize(renders["main"])
    assert chart == kust, diff(chart, kust)


@pytest.mark.tools
def test_every_switch_on_renders_every_folder(helm: str, renders: dict[str, list[Obj]]) -> None:
    chart = normalize(template(helm, *(f"{k}={v}" for k, v in ALL_ON.items())))
    expected = normalize(renders["history"] + renders["agent"] + renders["monitoring"])
    # the config file gets USAGE_HALF_LIFE from history.halfLife
    cfg = chart[("ConfigMap", "wdrf-controller-config")]["data"]["config.yaml"]
    assert cfg.pop("USAGE_HALF_LIFE") == "7d"
    expected[("ConfigMap", "wdrf-controller-config")]["data"]["config.yaml"].pop(
        "USAGE_HALF_LIFE")
    assert chart == expected, diff(chart, expected)


@pytest.mark.tools
def test_switches_off(helm: str, renders: dict[str, list[Obj]]) -> None:
    chart = normalize(template(helm, "admissionPolicy.enabled=false",
                               "networkPolicy.enabled=false", "agent.enabled=true"))
    kinds = {k for k, _ in chart}
    assert not kinds & {"ValidatingAdmissionPolicy", "NetworkPolicy"} - {
        k for k, n in normalize(renders["main"]) if n == "wdrf-controller-writes"}
    assert ("ValidatingAdmissionPolicy", "wdrf-class-annotations") not in chart
    assert ("ConfigMap", "wdrf-admission-params") not in chart
    assert ("DaemonSet", "wdrf-gpu-agent") in chart
    assert ("ValidatingAdmissionPolicy", "wdrf-controller-writes") in chart  # always: security


@pytest.mark.tools
def test_values_reach_the_objects(helm: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "image": {"repository": "registry.example.com/wdrf", "tag": "1.2.3",
                  "pullPolicy": "Always"},
        "replicas": 3,
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
        "config": {"LOOP_INTERVAL": "5s", "FAIRNESS_POINTS": 2000000},
        "admissionPolicy": {"params": {"adminGroups": "ops:admins"}},
        "agent": {"enabled": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    }))
    objs = normalize(template(helm, values=values))
    dep = objs[("Deployment", "wdrf-controller")]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "registry.example.com/wdrf:1.2.3" and c["imagePullPolicy"] == "Always"
    assert dep["spec"]["replicas"] == 3
    assert c["resources"]["requests"] == {"cpu": "250m", "memory": "256Mi"}  # limits kept
    agent = objs[("DaemonSet", "wdrf-gpu-agent")]["spec"]["template"]["spec"]["containers"][0]
    assert agent["image"] == "registry.example.com/wdrf:1.2.3"
    cfg = objs[("ConfigMap", "wdrf-controller-config")]["data"]["config.yaml"]
    assert cfg["LOOP_INTERVAL"] == "5s" and cfg["FAIRNESS_POINTS"] == 2000000  # not 2e+06
    assert cfg["AGING_STEP" if "AGING_STEP" in cfg else "MAX_AGING_TIME"]  # the rest is kept
    params = objs[("ConfigMap", "wdrf-admission-params")]["data"]
    assert params["adminGroups"] == "ops:admins"  # the other parameters keep their defaults
    sm = objs[("ServiceMonitor", "wdrf-controller")]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # default tag: the chart's appVersion
    default = normalize(template(helm))[("Deployment", "wdrf-controller")]
    chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert default["spec"]["template"]["spec"]["containers"][0]["image"].endswith(
        ":" + chart_meta["appVersion"])


@pytest.mark.tools
def test_history_off_with_a_half_life_fails_with_a_reason(helm: str) -> None:
    cmd = [str(HELM), "template", "wdrf", str(CHART), "--namespace", NS, "--kube-version",
           K8S_VERSION, "--set", "config.USAGE_HALF_LIFE=1h"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0 and "needs history.enabled=true" in out.stderr


@pytest.mark.tools
def test_the_rendered_config_is_a_valid_controller_config(helm: str, tmp_path: Path) -> None:
    for sets in ((), tuple(f"{k}={v}" for k, v in ALL_ON.items())):
        cm = next(o for o in template(helm, *sets) if o["kind"] == "ConfigMap"
                  and o["metadata"]["name"] == "wdrf-controller-config")
        path = tmp_path / "config.yaml"
        path.write_text(cm["data"]["config.yaml"])
        settings = load_settings(path, env={})
        top = load_settings(ROOT / "config.yaml", env={})
        if not sets:
            assert settings == top
        else:
            assert settings.usage_half_life == 7 * 86400


@pytest.mark.tools
def test_every_rendered_builtin_object_validates(helm: str) -> None:
    objs = template(helm, *(f"{k}={v}" for k, v in ALL_ON.items()))
    assert len(objs) > 20
    for o in objs:
        if o["kind"] in CRD_KINDS:
            assert o["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)
        ns = o["metadata"].get("namespace")
        assert ns in (NS, None, "default"), (o["kind"], ns)


@pytest.mark.tools
def test_helm_lint(helm: str) -> None:
    out = subprocess.run([helm, "lint", str(CHART), "--strict", "--kube-version", K8S_VERSION],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_kubectl_is_there_for_the_generator() -> None:
    assert shutil.which("kubectl"), "kubectl (kustomize) is needed by tools/gen_chart.py"


def test_the_readme_names_only_real_values() -> None:
    import re

    readme = (ROOT / "README.md").read_text()
    section = readme.split("### With Helm", 1)[1].split("\n#", 1)[0]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    named = set(re.findall(r"`([a-zA-Z]+(?:\.[a-zA-Z*<>A-Z_]+)+|replicas|resources)`", section))
    named |= set(re.findall(r"--set ([a-zA-Z.]+)=", section))
    named = {n for n in named if not n.endswith((".yaml", ".py", ".md"))}  # file names
    assert len(named) > 10, named
    for path in named:
        node: Any = values
        for part in path.split("."):
            if part in ("<KEY>", "*") or node == {}:  # a free-form map (labels)
                break
            assert isinstance(node, dict) and part in node, f"README names {path}"
            node = node[part]
