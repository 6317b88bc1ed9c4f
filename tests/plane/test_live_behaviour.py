"""Proof on the real plane: aging, dry run, invalid annotations, Kueue restarts, apiserver
outages. Each test has its own namespaces, queues, Lease and history ConfigMap."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from controller.domain import (
    APPLIED_PRIORITY_ANNOTATION,
    BASE_PRIORITY_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    URGENT_ANNOTATION,
)
from controller.live.api import WORKLOADS
from controller.live.apply import APPLIED
from controller.live.cache import Informer, WatchSpec
from controller.live.kube import KubeTransport
from controller.live.metrics import Metrics
from controller.live.runner import LiveController
from tests.plane import live_helpers as h
from tests.support import kube
from tests.support.plane import Plane

pytestmark = pytest.mark.plane


def _queue_with_pending(
    api: k8s.ApiClient, ns: str, jobs: list[tuple[str, dict[str, str]]], quota: int = 0,
    labels: dict[str, str] | None = None,
) -> tuple[str, dict[str, str]]:
    """A fresh ClusterQueue for `ns` with `quota` cpu, and Jobs that stay pending."""
    cq, _ = kube.create_queues(api, ns, {"cpu": quota})
    names: dict[str, str] = {}
    for job, ann in jobs:
        h.create_job(api, ns, job, "lq", annotations=ann, labels=labels)
        names[job] = h.job_workload(api, ns, job)
        h.wait_pending(api, ns, names[job])
    return cq, names


def _owned(api: k8s.ApiClient, ns: str) -> dict[str, Any]:
    """What the controller may write on each Workload (Kueue keeps writing status, so the
    resourceVersion is no evidence): annotations and spec.priority."""
    return {w["metadata"]["name"]: (w["metadata"].get("annotations"), w["spec"].get("priority"))
            for w in kube.list_workloads(api, ns)}


# -- aging --------------------------------------------------------------------------------------


def test_aging_lets_an_old_workload_of_a_heavy_team_overtake(
    api: k8s.ApiClient, kubeconfig: Path
) -> None:
    heavy, light = kube.create_namespace(api), kube.create_namespace(api)
    cq = kube.unique_name("cq-aging")
    kube.create_cluster_queue(api, cq, {"cpu": 2}, namespace_selector={})
    try:
        for ns in (heavy, light):
            kube.create_local_queue(api, ns, "lq", cq)
        h.create_job(api, heavy, "run-0", "lq")
        h.create_job(api, heavy, "run-1", "lq")
        running = [h.job_workload(api, heavy, j) for j in ("run-0", "run-1")]
        for wl in running:
            kube.wait_for_workload_condition(api, heavy, wl, "QuotaReserved")
        h.create_job(api, heavy, "old", "lq")
        old = h.job_workload(api, heavy, "old")
        h.wait_pending(api, heavy, old)
        time.sleep(6)  # the heavy team's Workload waits; then lighter work arrives
        h.create_job(api, light, "new", "lq")
        new = h.job_workload(api, light, "new")
        h.wait_pending(api, light, new)

        # 6 s of waiting (x 2000 points/s = 12000) outweighs the whole fairness range (5000).
        settings = h.live_settings(AGING_COEFFICIENT="2000", PRIORITY_REBASE_PERIOD="1h",
                                   MAX_AGING_TIME="60s", FAIRNESS_POINTS="5000")
        c = h.new_controller(kubeconfig, settings)
        with h.started(c):
            report = h.converge(c)
            plan = {d.key: d for d in h.planned_in(report, cq)}
            d_old, d_new = plan[f"{heavy}/{old}"], plan[f"{light}/{new}"]
            assert d_old.breakdown is not None and d_new.breakdown is not None
            # The heavy team is behind on fairness, but has waited long enough to lead.
            assert d_old.breakdown.fairness_term < d_new.breakdown.fairness_term
            assert d_old.breakdown.aging_term > d_new.breakdown.aging_term
            assert d_old.rank == 0 and d_new.rank == 1, (d_old.breakdown, d_new.breakdown)
            time.sleep(1.0)
            h.release(api, heavy, running[0])
            got = h.next_admitted(api, {f"{heavy}/{old}": heavy, f"{light}/{new}": light})
            assert got == f"{heavy}/{old}"
    finally:
        h.cleanup(api, [heavy, light], [cq])


# -- dry run ------------------------------------------------------------------------------------


def test_dry_run_against_the_live_plane_writes_nothing(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    cq, names = _queue_with_pending(api, namespace, [
        ("plain", {}), ("hot", {URGENT_ANNOTATION: "true"}), ("bad", {URGENT_ANNOTATION: "YES"})])
    try:
        before = _owned(api, namespace)
        settings = h.live_settings(LEADER_ELECTION="true", USAGE_HALF_LIFE="1h")
        transport = KubeTransport.from_config(str(kubeconfig))
        below = h.MethodCounter(transport)  # counts at urllib3, below every controller wrapper
        c = LiveController(settings, transport, dry_run=True)
        with h.started(c):
            reports = [c.run_cycle() for _ in range(3)]
            time.sleep(0.5)
        assert below.methods, "the counter saw no requests at all"
        assert below.writes() == [], below.writes()
        assert _owned(api, namespace) == before
        assert h.events_for(api, namespace, names["bad"]) == []
        assert h.lease_holder(api, settings.controller_namespace, settings.lease_name) == ""
        # ... although a live run would have written: the dry run reports it.
        would = {ch.ref.name for ch in reports[0].refused()}
        assert {names["plain"], names["hot"]} <= would
        assert names["bad"] not in would

        # The CLI path, as a separate process: same result, and it prints the writes.
        out = subprocess.run(
            [sys.executable, "-m", "controller", "--dry-run", "--once", "--set",
             "METRICS_PORT=0", "--set", "CAPACITY_SOURCE=quota"],
            cwd=h.REPO, env=h.controller_env(kubeconfig), capture_output=True, text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "Writes a live run would make" in out.stdout
        assert names["hot"] in out.stdout
        assert _owned(api, namespace) == before
    finally:
        h.cleanup(api, [namespace], [cq])


# -- invalid annotation ----------------------------------------------------------------------


def test_invalid_annotation_gives_an_event_and_the_rest_is_processed(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    cq, names = _queue_with_pending(api, namespace, [
        ("ok-1", {}), ("broken", {URGENT_ANNOTATION: "True "}), ("ok-2", {})])
    try:
        c = h.new_controller(kubeconfig, h.live_settings())
        with h.started(c):
            h.converge(c)
            h.converge(c)  # a second pass must not repeat the Event (rate limit)
        events = h.events_for(api, namespace, "broken", "InvalidAnnotation")
        assert len(events) == 1, events
        assert events[0]["type"] == "Warning" and events[0]["involvedObject"]["kind"] == "Job"
        assert URGENT_ANNOTATION in events[0]["message"]
        broken = kube.get_workload(api, namespace, names["broken"])
        assert KUEUE_PRIORITY_BOOST_ANNOTATION not in (broken["metadata"].get("annotations") or {})
        for ok in ("ok-1", "ok-2"):
            wl = kube.get_workload(api, namespace, names[ok])
            assert int(wl["metadata"]["annotations"][KUEUE_PRIORITY_BOOST_ANNOTATION]) > 0
            # a normal Workload's first priority is encoding, not news: no Event
            assert not h.events_for(api, namespace, names[ok], "PriorityChanged")
    finally:
        h.cleanup(api, [namespace], [cq])


# -- Kueue restart in spec mode ----------------------------------------------------------------


def test_kueue_restart_resets_spec_priority_and_one_cycle_restores_it(
    plane: Plane, api: k8s.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    wpc = kube.unique_name("wpc-low")
    kube.request(api, "POST", kube.kueue_path("workloadpriorityclasses"), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
        "metadata": {"name": wpc}, "value": 10})
    cq, names = _queue_with_pending(api, namespace, [("w1", {}), ("w2", {})],
                                    labels={"kueue.x-k8s.io/priority-class": wpc})
    try:
        for wl in names.values():
            assert kube.get_workload(api, namespace, wl)["spec"]["priority"] == 10
        settings = h.live_settings(PRIORITY_MODE="spec", LOOP_INTERVAL="2")
        c = h.new_controller(kubeconfig, settings)
        # Our own watch of the namespace records every spec.priority value, with the number of
        # cycles the controller had finished when it was seen.
        seen: dict[str, list[tuple[int, Any]]] = {n: [] for n in names.values()}
        lock = threading.Lock()

        def record(kind: str, old: Any, new: Any) -> None:
            if new is not None and new["metadata"]["name"] in seen:
                with lock:
                    seen[new["metadata"]["name"]].append((c.cycles, new["spec"].get("priority")))

        spy = Informer(KubeTransport.from_config(str(kubeconfig)),
                       WatchSpec(WORKLOADS, namespace=namespace), Metrics(), on_event=record)
        stop = threading.Event()
        threading.Thread(target=spy.run, args=(stop,), daemon=True).start()
        with h.started(c, loop=True):
            targets = kube.wait_for(lambda: _all_raised(api, namespace, names), 60,
                                    "controller raised spec.priority")
            plane.restart_kueue()
            kube.wait_for(lambda: all(_reset_then_restored(seen[n], targets[n]) for n in seen),
                          90, "Kueue reset and controller restore", lambda: str(seen))
        stop.set()
        for n, history in seen.items():
            reset_at = next(i for i, (_, p) in enumerate(history) if p == 10 and i > 0)
            restored = next(cyc for cyc, p in history[reset_at:] if p == targets[n])
            # Restored by the first cycle that started after the reset was visible: the cycle
            # counter advanced by at most two (the one running when the reset arrived, the next).
            assert restored - history[reset_at][0] <= 2, history
            wl = kube.get_workload(api, namespace, n)
            assert wl["metadata"]["annotations"][BASE_PRIORITY_ANNOTATION] == "10"
    finally:
        h.cleanup(api, [namespace], [cq])
        kube.request(api, "DELETE", kube.kueue_path("workloadpriorityclasses", wpc))


def test_spec_priority_changed_by_someone_else_becomes_the_new_base(
    api: k8s.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    wpc = kube.unique_name("wpc-low")
    kube.request(api, "POST", kube.kueue_path("workloadpriorityclasses"), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
        "metadata": {"name": wpc}, "value": 10})
    cq, names = _queue_with_pending(api, namespace, [("w", {})],
                                    labels={"kueue.x-k8s.io/priority-class": wpc})
    wl = names["w"]
    key = f"{namespace}/{wl}"
    try:
        c = h.new_controller(kubeconfig, h.live_settings(PRIORITY_MODE="spec"))
        with h.started(c):
            h.converge(c)
            obj = kube.get_workload(api, namespace, wl)
            ann = obj["metadata"]["annotations"]
            assert ann[BASE_PRIORITY_ANNOTATION] == "10", ann
            assert ann[APPLIED_PRIORITY_ANNOTATION] == str(obj["spec"]["priority"]), ann
            assert obj["spec"]["priority"] > 10
            # A class change (or an admin): spec.priority is now neither base nor ours.
            kube.set_priority(api, namespace, wl, 40)
            # The first cycle whose cache holds the new value takes it as the base.
            deadline = time.monotonic() + 30
            while True:
                report = c.run_cycle()
                d = next(x for x in report.plan.decisions if x.key == key)
                if d.current_priority == 40:
                    break
                assert time.monotonic() < deadline, "the controller never saw spec.priority 40"
                time.sleep(0.2)
            assert d.base_priority == 40 and d.target_priority == 40 + d.target_boost, d
            assert report.applied is not None
            assert [o.result for o in report.applied.outcomes
                    if o.change.ref.name == wl] == [APPLIED], report.applied.outcomes
            obj = kube.get_workload(api, namespace, wl)
            ann = obj["metadata"]["annotations"]
            assert ann[BASE_PRIORITY_ANNOTATION] == "40", ann
            assert obj["spec"]["priority"] == 40 + d.target_boost, obj["spec"]
            assert ann[APPLIED_PRIORITY_ANNOTATION] == str(obj["spec"]["priority"]), ann
            # And it stays there: the next cycles find nothing to write.
            steady = h.converge(c)
            d = next(x for x in steady.plan.decisions if x.key == key)
            assert d.base_priority == 40, d
    finally:
        h.cleanup(api, [namespace], [cq])
        kube.request(api, "DELETE", kube.kueue_path("workloadpriorityclasses", wpc))


def _all_raised(api: k8s.ApiClient, ns: str, names: dict[str, str]) -> dict[str, int] | None:
    out = {}
    for wl in names.values():
        p = kube.get_workload(api, ns, wl)["spec"]["priority"]
        if p == 10:
            return None
        out[wl] = p
    return out


def _reset_then_restored(history: list[tuple[int, Any]], target: int) -> bool:
    values = [p for _, p in history]
    if 10 not in values[1:]:
        return False
    after = values[values.index(10, 1):]
    return target in after


def test_health_check_on_the_live_plane(kubeconfig: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "controller", "--health-check"], cwd=h.REPO,
        env=h.controller_env(kubeconfig), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "[OK  ] Kueue API served: using kueue.x-k8s.io/v1beta2" in out.stdout
    assert "RBAC patch workloads.kueue.x-k8s.io (cluster-wide)" in out.stdout
    assert "priority mode" in out.stdout and "HEALTHY" in out.stdout


def test_patch_results_are_counted(api: k8s.ApiClient, kubeconfig: Path,
                                   namespace: str) -> None:
    cq, _ = _queue_with_pending(api, namespace, [("x", {})])
    try:
        c = h.new_controller(kubeconfig, h.live_settings())
        with h.started(c):
            h.converge(c)
        assert c.metrics.patches.labels("Workload", APPLIED)._value.get() >= 1
    finally:
        h.cleanup(api, [namespace], [cq])


# -- apiserver outage -----------------------------------------------------------------------------


def test_apiserver_outage_controller_recovers_to_the_same_state(
    plane: Plane, api: k8s.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    cq, names = _queue_with_pending(api, namespace, [("before-1", {}), ("before-2", {})])
    try:
        settings = h.live_settings(LOOP_INTERVAL="2")
        c = h.new_controller(kubeconfig, settings)
        with h.started(c, loop=True):
            kube.wait_for(lambda: all(
                KUEUE_PRIORITY_BOOST_ANNOTATION in (kube.get_workload(api, namespace, n)[
                    "metadata"].get("annotations") or {}) for n in names.values()), 60,
                "first boosts")
            # A change the controller has not acted on yet, then 20 s without an apiserver.
            kube.request(api, "PATCH", f"/apis/batch/v1/namespaces/{namespace}/jobs/before-2",
                         {"metadata": {"annotations": {URGENT_ANNOTATION: "true"}}})
            plane.stop_apiserver()
            cycles_at_stop = c.cycles
            time.sleep(20)
            plane.start_apiserver()
            kube.wait_for(lambda: c.cycles > cycles_at_stop + 3, 120, "cycles after outage")
            restarts = sum(c.metrics.watch_restarts.labels(n, "error")._value.get()
                           for n in c.informers)
            errors = c.metrics.api_errors.labels("connection")._value.get()
            kube.wait_for(lambda: _urgent_boosted(api, namespace, names["before-2"]), 60,
                          "urgent boost after the outage")
            alive = c.health.alive()[0]
        assert restarts > 0 and errors > 0 and alive
        # Same end state as a controller that never saw an outage: a fresh one (dry run) finds
        # nothing to write, and nothing is half-written.
        fresh = h.new_controller(kubeconfig, settings, dry_run=True)
        with h.started(fresh):
            report = fresh.run_cycle()
        assert [ch.summary for ch in report.refused()
                if ch.ref.namespace == namespace] == []
    finally:
        h.cleanup(api, [namespace], [cq])
        # Leave a healthy plane for later tests: Kueue's own watches went through the outage.
        plane.restart_kueue()


def _urgent_boosted(api: k8s.ApiClient, ns: str, name: str) -> bool:
    ann = kube.get_workload(api, ns, name)["metadata"].get("annotations") or {}
    return int(ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION, "0")) >= 100_000
