"""Discovery, the PriorityBoost gate, prompt-cycle triggers, history store, logs, HTTP."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from controller.accounting import UsageHistory
from controller.domain import URGENT_ANNOTATION, KueueApiVersion
from controller.live.api import CONFIG_MAPS, DEPLOYMENTS, path_class
from controller.live.discovery import (
    KueueNotServed,
    choose_kueue_version,
    gate_from_args,
    gate_from_manager_config,
    read_priority_boost_gate,
    resolve_mode,
)
from controller.live.history import HistoryStore
from controller.live.metrics import Health, HttpServer, Metrics
from controller.live.snapshot import needs_prompt_cycle
from controller.logs import JsonFormatter
from controller.plan import PriorityMode
from tests.support.fake import FakeApi


def test_version_choice_prefers_v1beta2_and_falls_back() -> None:
    assert choose_kueue_version(["v1beta1", "v1beta2"]) is KueueApiVersion.V1BETA2
    assert choose_kueue_version(["v1beta1"]) is KueueApiVersion.V1BETA1
    with pytest.raises(KueueNotServed):
        choose_kueue_version([])


def test_gate_from_manager_config() -> None:
    assert gate_from_manager_config("featureGates:\n  PriorityBoost: true\n") is True
    assert gate_from_manager_config("featureGates:\n  PriorityBoost: false\n") is False
    assert gate_from_manager_config("featureGates:\n  Other: true\n") is None
    assert gate_from_manager_config(": not yaml: [") is None


def test_gate_from_args_last_mention_wins() -> None:
    assert gate_from_args(["--zap", "--feature-gates=A=true,PriorityBoost=true"]) is True
    assert gate_from_args(["--feature-gates", "PriorityBoost=false"]) is False
    assert gate_from_args(["--feature-gates=PriorityBoost=true",
                           "--feature-gates=PriorityBoost=false"]) is False
    assert gate_from_args(["--config=/x"]) is None


def test_resolve_mode() -> None:
    assert resolve_mode(PriorityMode.AUTO, True, "cm").mode is PriorityMode.BOOST
    assert resolve_mode(PriorityMode.AUTO, False, "cm").mode is PriorityMode.SPEC
    assert resolve_mode(PriorityMode.AUTO, None, "cm").mode is PriorityMode.SPEC
    boost_off = resolve_mode(PriorityMode.BOOST, False, "cm")
    assert boost_off.mode is PriorityMode.BOOST and "WARNING" in boost_off.reason
    assert resolve_mode(PriorityMode.SPEC, True, "cm").mode is PriorityMode.SPEC


def test_gate_read_from_deployment_when_configmap_is_silent() -> None:
    api = FakeApi()
    api.put_object(DEPLOYMENTS.item("kueue-controller-manager", "kueue-system"), {
        "metadata": {"name": "kueue-controller-manager"},
        "spec": {"template": {"spec": {"containers": [
            {"name": "manager", "args": ["--feature-gates=PriorityBoost=true"]}]}}}})
    gate, where = read_priority_boost_gate(api, "kueue-system")
    assert gate is True and "Deployment" in where
    api.put_object(CONFIG_MAPS.item("kueue-manager-config", "kueue-system"), {
        "metadata": {"name": "kueue-manager-config"},
        "data": {"controller_manager_config.yaml": "featureGates: {PriorityBoost: false}"}})
    gate, where = read_priority_boost_gate(api, "kueue-system")
    assert gate is False and "ConfigMap" in where


def _wl(ann: dict[str, str] | None = None, owner: str | None = None) -> dict[str, object]:
    meta: dict[str, object] = {"name": "w", "namespace": "ns", "annotations": ann or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": owner,
                                    "controller": True}]
    return {"metadata": meta}


def test_prompt_cycle_rules() -> None:
    none = lambda _key: None  # noqa: E731
    urgent_job = {"metadata": {"annotations": {URGENT_ANNOTATION: "true"}}}
    assert needs_prompt_cycle("Workload", None, _wl({URGENT_ANNOTATION: "true"}), none)
    assert not needs_prompt_cycle("Workload", None, _wl(), none)
    assert needs_prompt_cycle("Workload", None, _wl(owner="j"),
                              lambda key: urgent_job if key == "ns/j" else None)
    assert needs_prompt_cycle("Job", _wl(), _wl({URGENT_ANNOTATION: "true"}), none)
    assert needs_prompt_cycle("Job", _wl({URGENT_ANNOTATION: "true"}), _wl(), none)
    assert not needs_prompt_cycle("Workload", _wl(), _wl(), none)  # status updates etc.
    assert not needs_prompt_cycle("Workload", _wl(), None, none)  # deletions
    admitted = {**_wl(), "status": {"conditions": [{"type": "QuotaReserved", "status": "True"}]}}
    pending = {**_wl(), "status": {"conditions": [{"type": "QuotaReserved", "status": "False"}]}}
    assert needs_prompt_cycle("Workload", pending, admitted, none)  # its guard, at once
    assert needs_prompt_cycle("Workload", _wl(), admitted, none)
    assert not needs_prompt_cycle("Workload", admitted, admitted, none)
    assert not needs_prompt_cycle("Workload", admitted, pending, none)


def test_history_store_roundtrip_and_rate_limit() -> None:
    api = FakeApi()
    t = [0.0]
    store = HistoryStore(api, "kueue-system", "hist", save_every=60, clock=lambda: t[0])
    assert store.load() is None
    h1 = UsageHistory().advance({"a": {"cpu": 2.0}}, datetime(2026, 1, 1, tzinfo=UTC), 3600)
    assert store.save(h1)
    h2 = h1.advance({"a": {"cpu": 4.0}}, datetime(2026, 1, 1, 0, 1, tzinfo=UTC), 3600)
    t[0] = 10
    assert not store.save(h2)  # not due yet
    assert store.save(h2, force=True)
    fresh = HistoryStore(api, "kueue-system", "hist").load()
    assert fresh is not None and fresh.to_json() == h2.to_json()
    writes = len(api.writes())
    assert not store.save(h2, force=True)  # unchanged: no write
    assert len(api.writes()) == writes


def test_invalid_history_is_ignored() -> None:
    api = FakeApi()
    api.put_object(CONFIG_MAPS.item("hist", "kueue-system"), {
        "metadata": {"name": "hist"}, "data": {"history.json": "{nope"}})
    assert HistoryStore(api, "kueue-system", "hist").load() is None


def test_json_logs_carry_extras() -> None:
    record = logging.LogRecord("x", logging.INFO, "f", 1, "cycle %d", (3,), None)
    record.results = {"applied": 2}
    doc = json.loads(JsonFormatter().format(record))
    assert doc["msg"] == "cycle 3" and doc["results"] == {"applied": 2} and doc["level"] == "INFO"


def test_path_class() -> None:
    assert path_class("PATCH", "/apis/kueue.x-k8s.io/v1beta2/namespaces/a/workloads/w") == (
        "PATCH workloads")
    assert path_class("GET", "/api/v1/nodes") == "GET nodes"


def test_http_endpoints() -> None:
    metrics = Metrics()
    t = [0.0]
    health = Health(stale_after=30, clock=lambda: t[0])
    metrics.patches.labels("Workload", "applied").inc()
    server = HttpServer(metrics, health, 0, host="127.0.0.1")
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        body = urllib.request.urlopen(base + "/metrics").read().decode()
        assert 'wdrf_patches_total{kind="Workload",result="applied"} 1.0' in body
        assert urllib.request.urlopen(base + "/healthz").status == 200
        with pytest.raises(urllib.error.HTTPError) as not_ready:
            urllib.request.urlopen(base + "/readyz")
        assert not_ready.value.code == 503
        health.set_ready(True)
        assert urllib.request.urlopen(base + "/readyz").status == 200
        t[0] = 31
        with pytest.raises(urllib.error.HTTPError) as dead:
            urllib.request.urlopen(base + "/healthz")
        assert dead.value.code == 503
    finally:
        server.stop()


def test_quota_check_from_kueue_config() -> None:
    from controller.live.discovery import QuotaCheck, quota_check_from_manager_config

    default = QuotaCheck()
    assert not default.accepts("nvidia.com/gpucores", {"cpu", "nvidia.com/gpu"})
    assert default.accepts("nvidia.com/gpucores", {"nvidia.com/gpucores"})
    ignore = quota_check_from_manager_config("resources:\n  quotaCheckStrategy: IgnoreUndeclared\n")
    assert ignore.accepts("nvidia.com/gpucores", set())
    transformed = quota_check_from_manager_config(
        "resources:\n  transformations:\n  - input: nvidia.com/gpucores\n    strategy: Replace\n"
        "  excludeResourcePrefixes: [nvidia.com/gpumem]\n")
    assert transformed.accepts("nvidia.com/gpucores", set())
    assert transformed.accepts("nvidia.com/gpumem-percentage", set())
    assert not transformed.accepts("example.com/other", set())


def test_probes_starting_until_the_first_cycle_then_stale_cache_is_not_ready() -> None:
    from controller.live.health import Probes

    t = {"now": 0.0}
    probes = Probes(stale_after=60, clock=lambda: t["now"])
    alive, why = probes.alive()
    assert not alive and why.startswith("starting")  # the startupProbe waits for this
    probes.set_ready(True)
    probes.beat()
    assert probes.alive()[0] and probes.ready()[0]
    probes.set_stale(("workloads 130s",))
    ok, why = probes.ready()
    assert not ok and "workloads 130s" in why and "writes paused" in why
    probes.set_stale(())
    t["now"] += 61
    assert not probes.alive()[0]


@pytest.mark.parametrize("timestamp,why", [
    ("2026-01-01T00:00:00", "no time zone"),  # naive: every cycle failed with a TypeError
    ("2099-01-01T00:00:00+00:00", "in the future"),  # froze a team's decayed usage
    ("not a time", "timestamp"),
    (5, "must be a string"),
])
def test_history_with_a_bad_timestamp_is_dropped_with_a_reason(timestamp: object,
                                                                 why: str) -> None:
    api = FakeApi()
    text = json.dumps({"version": 1, "timestamp": timestamp, "usage": {"p|a": {"cpu": 1.0}}})
    api.put_object(CONFIG_MAPS.item("hist", "kueue-system"), {
        "metadata": {"name": "hist"}, "data": {"history.json": text}})
    store = HistoryStore(api, "kueue-system", "hist")
    assert store.load(datetime(2026, 6, 1, tzinfo=UTC)) is None
    assert why in store.invalid
    # The next save replaces it with a valid one.
    h = UsageHistory().advance({"p|a": {"cpu": 2.0}}, datetime(2026, 6, 1, tzinfo=UTC), 3600)
    assert store.save(h)
    assert store.load(datetime(2026, 6, 1, tzinfo=UTC)) == h and store.invalid == ""


def test_history_advance_never_stays_ahead_of_now() -> None:
    """After the clock jumped ahead and back, decay resumes from now (was frozen until the
    clock caught up with the stored timestamp)."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ahead = UsageHistory().advance({"p|a": {"cpu": 8.0}}, t0 + timedelta(days=8), 60)
    back = ahead.advance({}, t0, 60)
    assert back.timestamp == t0
    later = back.advance({}, t0 + timedelta(seconds=60), 60)
    assert later.usage["p|a"]["cpu"] == pytest.approx(4.0)
