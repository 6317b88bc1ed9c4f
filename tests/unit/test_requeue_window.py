"""Kueue's batched requeue after a release: the window in which the controller's pending
writes would hand the released quota to the Workload written, and the writer's hold."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controller.config import load_settings
from controller.domain import PRIORITY_TERMS_ANNOTATION
from controller.live.api import WORKLOADS
from controller.live.apply import APPLIED, DEFERRED, Applier
from controller.live.diff import Diff, diff_priority
from controller.live.events import EventRecorder
from controller.live.metrics import Metrics
from controller.live.requeue import ReleaseWindows, released_queue
from controller.live.writer import CycleWriter
from controller.plan import Plan, PriorityMode
from tests.support.fake import FakeApi
from tests.unit.test_write_order import dec

REPO = Path(__file__).resolve().parents[2]


def wl(cq: str | None, reserved: bool) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [
        {"type": "QuotaReserved", "status": "True" if reserved else "False"}]}
    if cq is not None:
        status["admission"] = {"clusterQueue": cq}
    return {"metadata": {"name": "w", "namespace": "ns"}, "status": status}


def test_a_release_is_quota_lost_by_a_workload_that_held_it() -> None:
    assert released_queue("Workload", wl("a", True), wl(None, False)) == "a"
    assert released_queue("Workload", wl("a", True), None) == "a"  # deleted while holding
    assert released_queue("Workload", wl("a", True), wl("a", True)) is None
    assert released_queue("Workload", wl(None, False), wl("a", True)) is None  # admitted
    assert released_queue("Workload", None, wl("a", True)) is None
    assert released_queue("Job", wl("a", True), None) is None
    assert released_queue("Workload", wl(None, True), None) is None  # no admission to name


def test_the_window_opens_at_the_first_release_and_closes_a_period_later() -> None:
    t = [100.0]
    w = ReleaseWindows(window=1.5, clock=lambda: t[0])
    w.observe("Workload", wl("a", True), None)
    assert w.open() == {"a": 101.5}
    t[0] = 101.0
    w.observe("Workload", wl("a", True), None)  # joins Kueue's open batch: no extension
    w.observe("Workload", wl("b", True), wl(None, False))
    assert w.open() == {"a": 101.5, "b": 102.5}
    t[0] = 101.5
    assert w.open() == {"b": 102.5}
    t[0] = 103.0
    assert w.open() == {}
    off = ReleaseWindows(window=0.0, clock=lambda: t[0])  # KUEUE_REQUEUE_WINDOW: 0
    off.observe("Workload", wl("a", True), None)
    assert off.open() == {}


def test_the_setting_sets_the_window() -> None:
    assert load_settings(REPO / "config.yaml", env={}).requeue_window == 1.5
    s = load_settings(REPO / "config.yaml", env={"KUEUE_REQUEUE_WINDOW": "10.5s"})
    assert s.requeue_window == 10.5


def test_pending_writes_of_a_pool_with_a_release_wait_once_guards_and_other_pools_not() -> None:
    api = FakeApi()
    plan_decisions = [dec("a0", "a", 0, target=10, pool="p"), dec("a1", "a", 1, target=9,
                                                                  pool="p"),
                      dec("b0", "b", 0, target=10, pool="p"),
                      dec("c0", "c", 0, target=10, pool="q"),
                      dec("n0", "a", 2, target=8, pool="p"),
                      dec("g", "a", 0, admitted=True, target=50, pool="p")]
    valued = {PRIORITY_TERMS_ANNOTATION: "v2 class=normal team=t pool=p priority=1"}
    changes = []
    for d in plan_decisions:
        name = d.key
        meta = {"name": name, "namespace": "ns", "annotations": {} if name == "n0" else valued}
        obj = api.put_object(WORKLOADS.item(name, "ns"), {"metadata": meta,
                                                          "spec": {"priority": 0}})
        c = diff_priority(d, obj, WORKLOADS, PriorityMode.SPEC)
        assert c is not None
        changes.append(c)
    metrics = Metrics()
    writer = CycleWriter(Applier(api, metrics, workers=4),
                         EventRecorder(api, metrics, per_object=0), metrics, budget=100,
                         stopping=lambda: False)
    plan = Plan(now=datetime(2026, 1, 5, tzinfo=UTC), decisions=tuple(plan_decisions))
    report = writer.write(plan, Diff(tuple(changes)), {}, releasing={"b"})
    result = {o.change.decision.key: o.result for o in report.outcomes}
    # b's release frees quota for its cohort: a's pending Workloads wait too; the guard goes,
    # and so does n0's first value (held, lower-class work could pass it and be preempted)
    assert result == {"a0": DEFERRED, "a1": DEFERRED, "b0": DEFERRED, "c0": APPLIED,
                      "n0": APPLIED, "g": APPLIED}
    assert writer.waited == 3
    # still releasing in the next cycle (Workloads finish every second): they wait no more
    report = writer.write(plan, Diff(tuple(changes)), {}, releasing={"b"})
    assert writer.waited == 0
    result = {o.change.decision.key: o.result for o in report.outcomes}
    assert [result[k] for k in ("a0", "a1", "b0")] == [APPLIED] * 3  # written once it closed
