"""Monitoring: the exported metrics pass `promtool check metrics`, the PrometheusRule's alerts pass
their `promtool test rules` unit tests (tests/unit/alerts_test.yaml), and every query of the
alerts and the Grafana dashboard names only metrics the code exports.

promtool comes from Debian's `prometheus` package; `make promtool` (part of `make test`)
installs it. Without it these tests fail and say so: they are never skipped.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.agent.health import HealthPolicy
from controller.agent.metrics import new_registry, render
from controller.agent.nvml import NvmlReader
from controller.agent.runner import Agent, AgentConfig
from controller.live.metrics import Metrics
from tests.support.fakenvml import FakeGpu, FakeMig, FakeNvml, h100s
from tests.support.kube import render_kustomize

ROOT = Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "manifests" / "overlays" / "prometheus"
RULE = OVERLAY / "prometheusrule.yaml"
DASHBOARD = OVERLAY / "dashboards" / "wdrf-controller.json"
RULE_TESTS = Path(__file__).with_name("alerts_test.yaml")
# Series Prometheus itself makes, allowed in queries besides the exported ones.
PROMETHEUS_OWN = {"up"}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, ("promtool is not installed: `make promtool` installs Debian's prometheus "
                  "package (apt-get install prometheus), which provides it")
    return path


def controller_metrics_text() -> str:
    """What the controller's /metrics serves, with a series in every metric and label."""
    metrics = Metrics()
    for attr in vars(metrics).values():
        if not isinstance(attr, Counter | Gauge | Histogram):
            continue
        names = attr._labelnames
        child = attr.labels(*[f"v{i}" for i in range(len(names))]) if names else attr
        if isinstance(child, Counter):
            child.inc()
        elif isinstance(child, Gauge):
            child.set(1)
        else:
            child.observe(0.3)
    return generate_latest(metrics.registry).decode()


def agent_metrics_text(monkeypatch: pytest.MonkeyPatch) -> str:
    """What the agent's /metrics serves for a node with whole GPUs, one MIG GPU and one XID."""
    fake = FakeNvml()
    fake.install(monkeypatch.setattr)
    fake.gpus = [*h100s(2), FakeGpu("GPU-mig", mig_mode=1, migs={0: FakeMig("MIG-0")})]
    fake.gpus[0].xids = [79]
    registry, collector = new_registry()
    agent = Agent(AgentConfig("gpu-node-1", health=HealthPolicy()), NvmlReader(), collector,
                  client=None)
    agent.start()
    agent.step()
    collector.update(dataclasses.replace(collector.state, last_publish=1.7e9,
                                         patches={"ok": 3, "error": 1}))
    return render(registry)


@pytest.fixture(scope="module")
def exported(request: pytest.FixtureRequest) -> Iterator[set[str]]:
    mp = pytest.MonkeyPatch()
    try:
        names: set[str] = set()
        for text in (controller_metrics_text(), agent_metrics_text(mp)):
            for family in text_string_to_metric_families(text):
                names.update(s.name for s in family.samples)
        yield names
    finally:
        mp.undo()


def check_metrics(promtool: str, text: str) -> None:
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), (
        proc.stdout + proc.stderr)


def test_controller_metrics_pass_promtool_check_metrics(promtool: str) -> None:
    text = controller_metrics_text()
    assert "wdrf_patches_total{" in text and "wdrf_cycle_duration_seconds_bucket{" in text
    check_metrics(promtool, text)


def test_agent_metrics_pass_promtool_check_metrics(
    promtool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = agent_metrics_text(monkeypatch)
    for name in ("wdrf_gpus 3.0", "wdrf_gpus_healthy ", "wdrf_gpu_mig_memory_total_bytes{",
                 "wdrf_gpu_xid_errors_total{", "wdrf_gpu_inventory_published_timestamp_seconds"):
        assert name in text, name
    check_metrics(promtool, text)


def test_promtool_check_metrics_catches_a_count_suffix(promtool: str) -> None:
    """The check has teeth: the names it rejected before the rename are rejected."""
    bad = "# HELP wdrf_gpu_count GPUs\n# TYPE wdrf_gpu_count gauge\nwdrf_gpu_count 1.0\n"
    proc = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and "_count" in proc.stdout + proc.stderr


def rule_spec() -> dict[str, Any]:
    doc = yaml.safe_load(RULE.read_text())
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    spec: dict[str, Any] = doc["spec"]
    return spec


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule_spec()["groups"] for r in g["rules"] if "alert" in r]


def test_alerts_pass_their_promtool_unit_tests(promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_spec()))
    shutil.copy(RULE_TESTS, tmp_path / "alerts_test.yaml")
    check = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert test.returncode == 0, test.stdout + test.stderr


def test_every_alert_is_unit_tested_firing_and_documented() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", [])
             if t.get("exp_alerts")}
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names))
    assert set(names) == fired
    for a in alerts():
        assert a["labels"]["severity"] in {"critical", "warning", "info"}, a["alert"]
        assert a["annotations"]["summary"] and a["annotations"]["description"], a["alert"]
    wanted = {"WdrfControllerDown", "WdrfNoLeader", "WdrfWriteErrors", "WdrfCacheStale",
              "WdrfWorkloadWaitingPastOvertakeWindow", "WdrfGpuUnhealthy", "WdrfGpuInventoryStale"}
    assert wanted <= set(names)


def metric_names(expr: str) -> set[str]:
    """The wdrf_* series names a PromQL expression reads (label values are quoted, so a
    regex over the unquoted text is enough for these queries)."""
    unquoted = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\bwdrf_[a-z0-9_]+", unquoted))


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


def test_queries_name_only_exported_metrics(exported: set[str]) -> None:
    exprs = [a["expr"] for a in alerts()] + dashboard_exprs()
    used = set().union(*(metric_names(e) for e in exprs))
    assert used, "no wdrf_* metric found in the queries"
    assert used <= exported, f"not exported by the code: {sorted(used - exported)}"
    others = set()
    for e in exprs:
        if re.search(r"\bup\{", e):
            others.add("up")
    assert others <= PROMETHEUS_OWN
    # the dashboard covers what the issue asks for
    dash = " ".join(dashboard_exprs())
    for name in ("wdrf_team_dominant_share", "wdrf_team_usage_over_entitlement",
                 "wdrf_pending_workloads",
                 "wdrf_oldest_pending_wait_seconds", "wdrf_patches_total", "wdrf_is_leader"):
        assert name in dash, name


def test_entitlement_panel_reads_the_exported_ratio_not_an_equal_weights_guess() -> None:
    """Usage over entitlement needs W, the sum of the weights of the teams active in a pool:
    the controller exports it (wdrf_team_usage_over_entitlement); the dashboard must not
    rebuild it from the weighted share and a count of teams (exact only for equal weights)."""
    doc = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in doc["panels"] if "entitlement" in p["title"].lower()]
    exprs = [t["expr"] for t in panel["targets"]]
    assert set().union(*(metric_names(e) for e in exprs)) == {"wdrf_team_usage_over_entitlement"}
    assert all("pool" in e for e in exprs)  # one series per team and pool


def test_the_metric_name_check_has_teeth(exported: set[str]) -> None:
    assert metric_names('sum(rate(wdrf_gpu_count[5m])) > 0 and wdrf_x{a="wdrf_y"}') == {
        "wdrf_gpu_count", "wdrf_x"}
    assert "wdrf_gpu_count" not in exported


def test_dashboard_is_grafana_json_on_a_datasource_variable() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "wdrf-controller" and doc["title"]
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for p in doc["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]


def test_overlay_ships_rule_podmonitor_and_dashboard_configmap() -> None:
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render_kustomize(OVERLAY)}
    assert ("PrometheusRule", "wdrf-controller") in objs
    pm = objs[("PodMonitor", "wdrf-gpu-agent")]
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"]
    cm = objs[("ConfigMap", "wdrf-controller-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["wdrf-controller.json"]) == json.loads(DASHBOARD.read_text())
    for obj in objs.values():
        assert obj["metadata"]["namespace"] == "kueue-system"
