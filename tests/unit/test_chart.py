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
        "config": {"loopInterval": "5s", "fairnessPoints": 2000000},
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


def _fails(*sets: str) -> str:
    cmd = [str(HELM), "template", "wdrf", str(CHART), "--namespace", NS, "--kube-version",
           K8S_VERSION]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0, out.stdout[:500]
    return out.stderr


@pytest.mark.tools
@pytest.mark.parametrize("key", ["usageHalfLife", "USAGE_HALF_LIFE"])
def test_history_off_with_a_half_life_fails_with_a_reason(helm: str, key: str) -> None:
    assert "needs history.enabled=true" in _fails(f"config.{key}=1h")


@pytest.mark.tools
def test_every_config_key_in_camel_case_reaches_the_config_file(helm: str) -> None:
    from controller.config import KEYS

    values = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    top = yaml.safe_load((ROOT / "config.yaml").read_text())
    assert list(values) == [gen_chart.camel(k) for k in top]  # config.yaml's order
    assert set(values) == {gen_chart.camel(k) for k in KEYS}
    # helm's snakecase|upper turns every camelCase key back into the controller's key
    sets = [f"config.{gen_chart.camel(k)}={v}" for k, v in (("LOOP_INTERVAL", "7s"),
            ("GPU_MEMORY_MIB", "81920"), ("CLIENT_QPS", "20"), ("KUBECONFIG_CONTEXT", "ctx"),
            ("HAMI_DEFAULT_GPU_POLICY", "spread"))]
    cm = next(o for o in template(helm, *sets) if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == "wdrf-controller-config")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert set(cfg) == set(KEYS)
    assert (cfg["LOOP_INTERVAL"], cfg["GPU_MEMORY_MIB"], cfg["CLIENT_QPS"],
            cfg["KUBECONFIG_CONTEXT"], cfg["HAMI_DEFAULT_GPU_POLICY"]) == (
        "7s", 81920, 20, "ctx", "spread")


@pytest.mark.parametrize(("sets", "says"), [
    (("config.loopIntervall=5s",), "loopIntervall"),
    (("replicas=0",), "replicas"),
    (("image.pullPolicy=Sometimes",), "pullPolicy"),
    (("agent.nodeSelektor.a=b",), "nodeSelektor"),
    (("multikueue.managerKubeconfigSecrett=x",), "managerKubeconfigSecrett"),
    (("multikueue.managerKubeconfigSecret={a,b}",), "managerKubeconfigSecret"),
    (("config.approvedPreemptsNormal=maybe",), "approvedPreemptsNormal"),
])
@pytest.mark.tools
def test_the_values_schema_refuses_typos_and_wrong_types(helm: str, sets: tuple[str, ...],
                                                         says: str) -> None:
    err = _fails(*sets)
    assert "values don't meet the specifications of the schema" in err and says in err, err


@pytest.mark.tools
def test_pod_values_reach_the_controller_and_the_agent(helm: str, tmp_path: Path) -> None:
    pod = {"imagePullSecrets": [{"name": "regcred"}], "nodeSelector": {"pool": "system"},
           "tolerations": [{"key": "dedicated", "operator": "Exists"}],
           "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
               "nodeSelectorTerms": [{"matchExpressions": [
                   {"key": "pool", "operator": "In", "values": ["system"]}]}]}}},
           "priorityClassName": "system-cluster-critical",
           "podAnnotations": {"example.com/team": "platform"}}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({**pod, "agent": {"enabled": True, **pod}}))
    objs = {(o["kind"], o["metadata"]["name"]): o for o in template(helm, values=values)}
    for k in (("Deployment", "wdrf-controller"), ("DaemonSet", "wdrf-gpu-agent")):
        spec = objs[k]["spec"]["template"]["spec"]
        for field in ("imagePullSecrets", "tolerations", "priorityClassName"):
            assert spec[field] == pod[field], (k, field)
        for field in ("nodeSelector", "affinity"):  # maps: Helm merges them with the defaults
            assert spec[field] | pod[field] == spec[field], (k, field)
        ann = objs[k]["spec"]["template"]["metadata"]["annotations"]
        assert ann["example.com/team"] == "platform"
        kubernetes_validate.validate(objs[k], K8S_VERSION, strict=True)
    dep_ann = objs[("Deployment", "wdrf-controller")]["spec"]["template"]["metadata"]
    assert "checksum/config" in dep_ann["annotations"]  # kept beside the user's


@pytest.mark.tools
def test_https_metrics_switch_renders_the_secure_metrics_overlay(
    helm: str, renders: dict[str, list[Obj]]
) -> None:
    chart = normalize(template(helm, "metrics.https.enabled=true"))
    kust = normalize(gen_chart.with_component(gen_chart.SECURE_METRICS))
    assert chart == kust, diff(chart, kust)
    objs = template(helm, "metrics.https.enabled=true", "metrics.https.secretName=my-tls")
    dep = next(o for o in objs if o["kind"] == "Deployment")
    secrets = [v["secret"]["secretName"] for v in dep["spec"]["template"]["spec"]["volumes"]
               if "secret" in v]
    assert secrets == ["my-tls"]
    # the ServiceMonitor follows: the https port of the Service, the token, the Secret's CA
    objs = template(helm, "metrics.https.enabled=true", "metrics.https.secretName=my-tls",
                    "serviceMonitor.enabled=true")
    (ep,) = next(o for o in objs if o["kind"] == "ServiceMonitor")["spec"]["endpoints"]
    svc = next(o for o in objs if o["kind"] == "Service")
    assert ep["port"] in [p["name"] for p in svc["spec"]["ports"]] and ep["scheme"] == "https"
    assert ep["tlsConfig"]["ca"]["secret"]["name"] == "my-tls"
    assert ep["tlsConfig"]["serverName"] == f"wdrf-controller-metrics.{NS}.svc"
    assert "bearerTokenFile" in ep


@pytest.mark.tools
def test_every_alert_has_a_runbook_url_to_a_section_of_operations_md(helm: str) -> None:
    import re

    docs = (ROOT / "docs" / "operations.md").read_text()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", docs, re.M)}
    rules = next(o for o in template(helm, "prometheusRule.enabled=true",
                                     "prometheusRule.runbookBaseUrl=https://docs.example/ops.md")
                 if o["kind"] == "PrometheusRule")
    alerts = [r for g in rules["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 12
    for r in alerts:
        url = r["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == "https://docs.example/ops.md" and anchor == r["alert"].lower(), url
        assert anchor in anchors, f"docs/operations.md has no section {r['alert']}"


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
        if o["kind"] == "WorkloadPriorityClass":  # Kueue's CRD: applied by the plane tests
            assert o["apiVersion"] == "kueue.x-k8s.io/v1beta2"
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
    named = {n for n in named if not n.endswith((".yaml", ".py", ".md", ".json"))}  # files
    assert len(named) > 10, named
    for path in named:
        node: Any = values
        for part in path.split("."):
            if part in ("<KEY>", "<key>", "*") or node == {}:  # a free-form map (labels)
                break
            assert isinstance(node, dict) and part in node, f"README names {path}"
            node = node[part]


MK_SECRET = "multikueue.managerKubeconfigSecret"


def _controller(objs: list[Obj]) -> Obj:
    return next(o for o in objs if gen_chart.key(o) == ("Deployment", "wdrf-controller"))


@pytest.mark.tools
def test_multikueue_secret_renders_the_multikueue_worker_component(
    helm: str, renders: dict[str, list[Obj]], tmp_path: Path
) -> None:
    component = gen_chart.with_component(gen_chart.MULTIKUEUE_WORKER)
    component_dep = _controller(component)["spec"]["template"]["spec"]
    secret = next(v for v in component_dep["volumes"] if "secret" in v)["secret"]["secretName"]
    chart = normalize(template(helm, f"{MK_SECRET}={secret}"))
    kust = normalize(component)
    assert chart == kust, diff(chart, kust)  # only the Deployment differs from the base
    assert chart[("Deployment", "wdrf-controller")] != normalize(renders["main"])[
        ("Deployment", "wdrf-controller")]
    # another Secret name reaches the volume, nothing else moves
    dep = _controller(template(helm, f"{MK_SECRET}=mk-reader"))
    kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
    pod = dep["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "mk-reader"
    assert volume["secret"]["items"] == [{"key": "kubeconfig", "path": "kubeconfig"}]
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    # the controller the chart configures reads the mounted kubeconfig, in boost mode
    cm = next(o for o in template(helm, f"{MK_SECRET}=mk-reader") if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == "wdrf-controller-config")
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    settings = load_settings(path, env={e["name"]: e["value"] for e in c["env"] if "value" in e})
    assert settings.multikueue_manager_kubeconfig == (
        f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}")
    assert settings.priority_mode.value == "boost"
    # with metrics over HTTPS too: both Components' volumes, mounts and settings
    both = _controller(template(helm, f"{MK_SECRET}=mk-reader", "metrics.https.enabled=true"))
    kubernetes_validate.validate(both, K8S_VERSION, strict=True)
    https = _controller(gen_chart.with_component(gen_chart.SECURE_METRICS))
    both_c, https_c = both["spec"]["template"]["spec"]["containers"][0], https["spec"][
        "template"]["spec"]["containers"][0]
    mk_env = [e for e in c["env"] if e["name"] in ("MULTIKUEUE_MANAGER_KUBECONFIG",
                                                     "PRIORITY_MODE")]
    assert both_c["env"] == mk_env + https_c["env"]
    assert both_c["volumeMounts"] == [mount] + https_c["volumeMounts"]
    assert [v["name"] for v in both["spec"]["template"]["spec"]["volumes"]] == [
        volume["name"]] + [v["name"] for v in https["spec"]["template"]["spec"]["volumes"]]


@pytest.mark.tools
def test_multikueue_is_off_by_default(helm: str) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["multikueue"] == {"managerKubeconfigSecret": ""}
    pod = _controller(template(helm))["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "secret" in v]
    assert not {"MULTIKUEUE_MANAGER_KUBECONFIG", "PRIORITY_MODE"} & {
        e["name"] for e in pod["containers"][0]["env"]}


@pytest.mark.tools
@pytest.mark.parametrize("setting", ["config.priorityMode=spec",
                                     "config.multikueueManagerKubeconfig=/etc/kube/manager"])
def test_multikueue_secret_with_a_contradicting_config_fails_with_a_reason(
    helm: str, setting: str
) -> None:
    err = _fails(f"{MK_SECRET}=mk-reader", setting)
    assert "leave config.multikueueManagerKubeconfig empty and config.priorityMode auto" in err
    template(helm, setting)  # alone it renders
