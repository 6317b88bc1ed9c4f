"""The applier: conflicts re-read, transient errors back off, one failure never stops others."""

from __future__ import annotations

import time
from typing import Any

import pytest

from controller.domain import KUEUE_PRIORITY_BOOST_ANNOTATION
from controller.live.api import (
    EVENTS,
    JOBS,
    WORKLOADS,
    ApiError,
    CountingTransport,
    ReadOnlyTransport,
)
from controller.live.apply import (
    APPLIED,
    CONFLICT,
    DEFERRED,
    FAILED,
    NOOP,
    REFUSED,
    UNSUPPORTED,
    Applier,
    Outcome,
)
from controller.live.backoff import Backoff
from controller.live.diff import GPU_FRACTION, diff_job_hami, diff_priority
from controller.live.events import EventRecorder
from controller.live.metrics import Metrics
from controller.live.outcomes import outcome_events
from controller.plan import HamiDecision, PriorityMode, WorkloadDecision
from tests.support.fake import FakeApi


def decision(name: str, base: int = 10, boost: int = 100,
             hami: HamiDecision | None = None) -> WorkloadDecision:
    return WorkloadDecision(
        key=f"ns/{name}", uid=name, cluster_queue="cq", team="ns", rank=0, base_priority=base,
        current_priority=base, current_boost=None, target_boost=boost,
        target_priority=base + boost, breakdown=None, hami=hami,
    )


def seed(api: FakeApi, name: str, priority: int = 10, boost: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if boost is not None:
        meta["annotations"] = {KUEUE_PRIORITY_BOOST_ANNOTATION: boost}
    return api.put_object(WORKLOADS.item(name, "ns"), {"metadata": meta,
                                                        "spec": {"priority": priority}})


def sleeps() -> tuple[list[float], Any]:
    slept: list[float] = []
    return slept, slept.append


def test_applies_and_counts_metrics() -> None:
    api, metrics = FakeApi(), Metrics()
    wl = seed(api, "a")
    change = diff_priority(decision("a"), wl, WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    report = Applier(api, metrics).apply([change])
    assert report.counts() == {APPLIED: 1}
    stored = api.get_object(WORKLOADS.item("a", "ns"))
    assert stored is not None
    assert stored["metadata"]["annotations"][KUEUE_PRIORITY_BOOST_ANNOTATION] == "100"
    assert metrics.patches.labels("Workload", APPLIED)._value.get() == 1


@pytest.mark.parametrize("mode", [PriorityMode.SPEC, PriorityMode.BOOST])
def test_a_stale_write_is_a_conflict_counted_and_never_resent(mode: PriorityMode) -> None:
    """Changed after our read (Kueue, a user, a newer leader): the compare-and-swap fails,
    the write is not recomputed from the stale decision and sent again; the next cycle plans
    from the fresh object."""
    api = FakeApi()
    stale = seed(api, "a", priority=10)
    change = diff_priority(decision("a"), stale, WORKLOADS, mode)
    assert change is not None
    if mode is PriorityMode.SPEC:
        seed(api, "a", priority=50)
    else:
        seed(api, "a", priority=10, boost="777")
    metrics = Metrics()
    report = Applier(api, metrics).apply([change])
    assert report.counts() == {CONFLICT: 1}
    stored = api.get_object(WORKLOADS.item("a", "ns"))
    assert stored is not None
    if mode is PriorityMode.SPEC:
        assert stored["spec"]["priority"] == 50
    else:
        assert stored["metadata"]["annotations"][KUEUE_PRIORITY_BOOST_ANNOTATION] == "777"
    assert [m for m, _ in api.requests].count("PATCH") == 1
    assert [m for m, _ in api.requests].count("GET") == 1  # one re-read, to classify it
    assert metrics.patches.labels("Workload", CONFLICT)._value.get() == 1


def test_conflict_that_resolves_itself_is_noop() -> None:
    api = FakeApi()
    stale = seed(api, "a", priority=10)
    change = diff_priority(decision("a"), stale, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    api.put_object(WORKLOADS.item("a", "ns"), {
        "metadata": {"name": "a", "namespace": "ns",
                     "annotations": {"wdrf.x-k8s.io/base-priority": "10",
                                     "wdrf.x-k8s.io/applied-priority": "110"}},
        "spec": {"priority": 110}})
    report = Applier(api, Metrics()).apply([change])
    assert report.counts() == {NOOP: 1}


def test_409_rereads() -> None:
    api = FakeApi()
    wl = seed(api, "a")
    change = diff_priority(decision("a"), wl, WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    api.fail("PATCH", "/workloads/a", 409, times=2)
    report = Applier(api, Metrics()).apply([change])
    assert report.counts() == {APPLIED: 1}
    assert [m for m, _ in api.requests].count("GET") == 2


def test_transient_errors_back_off_with_growing_delays() -> None:
    api = FakeApi()
    wl = seed(api, "a")
    change = diff_priority(decision("a"), wl, WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    api.fail("PATCH", "/workloads/a", 503, times=3)
    slept, sleep = sleeps()
    metrics = Metrics()
    applier = Applier(api, metrics, max_attempts=5, retry_budget=100,
                      backoff=lambda: Backoff(initial=1.0, cap=100.0), sleep=sleep)
    assert applier.apply([change]).counts() == {APPLIED: 1}
    assert len(slept) == 3
    assert slept[0] <= 1.0 and slept[2] >= 2.0  # exponential: 3rd ceiling is 4, floor 2
    assert metrics.api_errors.labels("503")._value.get() == 3


def test_retry_budget_bounds_sleeping_per_cycle() -> None:
    api = FakeApi()
    changes = []
    for name in ("a", "b", "c"):
        wl = seed(api, name)
        c = diff_priority(decision(name), wl, WORKLOADS, PriorityMode.BOOST)
        assert c is not None
        changes.append(c)
    api.fail("PATCH", "/workloads/", 429, times=100)
    slept, sleep = sleeps()
    applier = Applier(api, Metrics(), max_attempts=10, retry_budget=3.0,
                      backoff=lambda: Backoff(initial=1.0, cap=10.0), sleep=sleep)
    report = applier.apply(changes)
    assert sum(slept) <= 3.0 + 1e-9
    assert report.counts() == {DEFERRED: 3}


def test_one_failing_object_does_not_stop_the_others() -> None:
    api = FakeApi()
    changes = []
    for name in ("a", "b", "c"):
        wl = seed(api, name)
        c = diff_priority(decision(name), wl, WORKLOADS, PriorityMode.BOOST)
        assert c is not None
        changes.append(c)
    api.fail("PATCH", "/workloads/b", 400, times=10, message="bad")
    report = Applier(api, Metrics()).apply(changes)
    assert [o.result for o in report.outcomes] == [APPLIED, FAILED, APPLIED]


def test_unreachable_apiserver_defers_the_rest_of_the_cycle() -> None:
    api = FakeApi()
    changes = []
    for i in range(6):
        wl = seed(api, f"w{i}")
        c = diff_priority(decision(f"w{i}"), wl, WORKLOADS, PriorityMode.BOOST)
        assert c is not None
        changes.append(c)
    api.fail("PATCH", "/workloads/", 0, times=100)
    report = Applier(api, Metrics(), retry_budget=0.0).apply(changes)
    assert report.counts() == {DEFERRED: 6}
    assert len(api.writes()) == 3  # stopped sending after three connection failures


def test_dry_run_transport_refuses_before_sending() -> None:
    api = FakeApi()
    counting = CountingTransport(api)
    wl = seed(api, "a")
    change = diff_priority(decision("a"), wl, WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    report = Applier(ReadOnlyTransport(counting), Metrics()).apply([change])
    assert report.counts() == {REFUSED: 1}
    assert counting.writes() == 0 and api.writes() == []


def _job(api: FakeApi, name: str, suspend: bool = True) -> dict[str, Any]:
    return api.put_object(JOBS.item(name, "ns"), {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"suspend": suspend, "template": {"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})


def test_fraction_422_marks_only_that_job_and_reports_unsupported() -> None:
    api = FakeApi()
    j, other = _job(api, "j"), _job(api, "k")
    d = diff_job_hami(decision("a", hami=HamiDecision(gpucores=50)), j, JOBS, None)
    (change,) = d.changes
    assert change.what == GPU_FRACTION
    api.fail("PATCH", "/jobs/j", 422, message="spec.template: Invalid value: field is immutable")
    applier = Applier(api, Metrics())
    assert applier.apply([change]).counts() == {UNSUPPORTED: 1}
    uid = j["metadata"]["uid"]
    assert applier.refused_fraction(uid) and not applier.refused_fraction(other["metadata"]["uid"])
    # the next diff of that Job turns it into an Event instead of a write...
    again = diff_job_hami(decision("a", hami=HamiDecision(gpucores=50)), j, JOBS, False)
    assert again.changes == () and [n.reason for n in again.notices] == ["GpuFractionNotApplied"]
    # ...while another Job still gets its fraction written.
    d2 = diff_job_hami(decision("b", hami=HamiDecision(gpucores=50)), other, JOBS, None)
    assert applier.apply(list(d2.changes)).counts() == {APPLIED: 1}


def test_fraction_on_a_job_kueue_just_unsuspended_is_dropped_not_a_global_switch_off() -> None:
    api = FakeApi()
    j = _job(api, "j")
    (change,) = diff_job_hami(decision("a", hami=HamiDecision(gpucores=50)), j, JOBS,
                              None).changes
    _job(api, "j", suspend=False)  # Kueue admitted it between our read and our patch
    applier = Applier(api, Metrics())
    assert applier.apply([change]).counts() == {NOOP: 1}  # failed test /spec/suspend, re-read
    assert not applier.fraction_refused
    stored = api.get_object(JOBS.item("j", "ns"))
    assert stored is not None
    assert "nvidia.com/gpucores" not in stored["spec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]


def test_patch_for_a_deleted_workload_never_lands_on_a_new_one_with_the_same_name() -> None:
    api = FakeApi()
    old = seed(api, "a")
    change = diff_priority(decision("a"), old, WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    api.request("DELETE", WORKLOADS.item("a", "ns"))
    api.put_object(WORKLOADS.item("a", "ns"), {  # Kueue recreates it: same name, new UID
        "metadata": {"name": "a", "namespace": "ns"}, "spec": {"priority": 10}})
    assert Applier(api, Metrics()).apply([change]).counts() == {NOOP: 1}
    fresh = api.get_object(WORKLOADS.item("a", "ns"))
    assert fresh is not None and "annotations" not in fresh["metadata"]


def test_after_stop_no_new_write_starts() -> None:
    api = FakeApi()
    changes = [diff_priority(decision(f"w{i}"), seed(api, f"w{i}"), WORKLOADS,
                             PriorityMode.BOOST) for i in range(3)]
    stopping = {"now": False}

    def after(_o: Any) -> None:
        stopping["now"] = True  # SIGTERM arrives after the first write

    applier = Applier(api, Metrics(), stopping=lambda: stopping["now"])
    report = applier.apply([c for c in changes if c is not None], after)
    assert report.counts() == {APPLIED: 1, DEFERRED: 2}


def test_422_on_json_patch_that_is_not_a_failed_test_is_a_failure_not_a_loop() -> None:
    api = FakeApi()
    wl = seed(api, "a", priority=10)
    change = diff_priority(decision("a"), wl, WORKLOADS, PriorityMode.SPEC)
    assert change is not None
    api.fail("PATCH", "/workloads/a", 422, times=1, message="spec.priority: Invalid value")
    report = Applier(api, Metrics()).apply([change])
    assert report.counts() == {FAILED: 1}
    assert len(api.writes()) == 1  # re-read showed the test would hold: no blind retries


def test_concurrent_workers_apply_everything_and_report_each_outcome() -> None:
    api = FakeApi()
    changes = []
    for i in range(20):
        wl = seed(api, f"w{i}")
        c = diff_priority(decision(f"w{i}"), wl, WORKLOADS, PriorityMode.BOOST)
        assert c is not None
        changes.append(c)
    api.fail("PATCH", "/workloads/w7", 400, times=10)
    seen: list[str] = []
    report = Applier(api, Metrics(), workers=4).apply(changes, lambda o: seen.append(o.result))
    assert [o.change.ref.name for o in report.outcomes] == [f"w{i}" for i in range(20)]
    assert report.counts() == {APPLIED: 19, FAILED: 1}
    assert sorted(seen) == sorted(o.result for o in report.outcomes)


class _SlowFirst(FakeApi):
    """Each PATCH of workload wN takes longer the smaller N is, so that sent side by side
    the later ones land first; `landed` is the order they were stored in."""

    def __init__(self) -> None:
        super().__init__()
        self.landed: list[str] = []

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if method.upper() == "PATCH":
            n = int(path.rsplit("/w", 1)[1])
            time.sleep(0.1 * (6 - n))
        out = super().request(method, path, **kw)
        if method.upper() == "PATCH":
            self.landed.append(path.rsplit("/", 1)[1])
        return out


@pytest.mark.parametrize("chained", [True, False])
def test_a_chain_lands_in_order_while_other_changes_go_side_by_side(chained: bool) -> None:
    """Writes with one chain key (the writer's: a ClusterQueue's pending Workloads) land one
    after another in the order given; unchained, the same writes land as they finish."""
    api = _SlowFirst()
    changes = []
    for i in range(6):
        c = diff_priority(decision(f"w{i}"), seed(api, f"w{i}"), WORKLOADS, PriorityMode.BOOST)
        assert c is not None
        changes.append(c)
    queue = {"w0": "a", "w2": "a", "w4": "a", "w1": "b", "w3": "b"}  # w5: no chain
    report = Applier(api, Metrics(), workers=6).apply(
        changes, chain=(lambda c: queue.get(c.ref.name)) if chained else None)
    assert [o.change.ref.name for o in report.outcomes] == [f"w{i}" for i in range(6)]
    assert report.counts() == {APPLIED: 6}
    in_a = [n for n in api.landed if queue.get(n) == "a"]
    in_b = [n for n in api.landed if queue.get(n) == "b"]
    if chained:
        assert (in_a, in_b) == (["w0", "w2", "w4"], ["w1", "w3"])
        assert api.landed.index("w5") < api.landed.index("w4")  # not behind a chain
    else:
        assert in_a == ["w4", "w2", "w0"]  # what the chain prevents


def test_a_conflict_gives_no_event_a_failed_write_does() -> None:
    """A stale write is planned again from the fresh object next cycle: logged and counted,
    not a Warning Event on an object nothing is wrong with; a refused one is."""
    api = FakeApi()
    stale = seed(api, "a", priority=10)
    change = diff_priority(decision("a"), stale, WORKLOADS, PriorityMode.BOOST)
    assert change is not None
    seed(api, "a", priority=10, boost="777")
    report = Applier(api, Metrics()).apply([change])
    assert report.counts() == {CONFLICT: 1}
    recorder = EventRecorder(api, Metrics(), per_object=3600)
    outcome_events(recorder, report.outcomes[0], None)
    assert api.request("GET", EVENTS.collection("ns"))["items"] == []
    outcome_events(recorder, Outcome(change, FAILED, ApiError(422, "Invalid", "x")), None)
    events = api.request("GET", EVENTS.collection("ns"))["items"]
    assert [e["reason"] for e in events] == ["PatchFailed"]
