"""The live controller end to end against the in-memory apiserver (real parse + policy)."""

from __future__ import annotations

import itertools
import logging
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from controller.domain import (
    BASE_PRIORITY_ANNOTATION,
    HAMI_GPU_POLICY_ANNOTATION,
    KUEUE_PRIORITY_BOOST_ANNOTATION,
    PRIORITY_TERMS_ANNOTATION,
    URGENT_ANNOTATION,
    PriorityClass,
    pool_key,
)
from controller.encoding import guard_terms
from controller.live.api import (
    CLUSTER_QUEUES,
    CONFIG_MAPS,
    EVENTS,
    JOBS,
    LEASES,
    LOCAL_QUEUES,
    WORKLOADS,
)
from controller.live.runner import LiveController
from controller.plan import PriorityMode
from tests.support.fake import FakeApi
from tests.support.fake_cluster import (
    KUEUE_GROUP_DOC,
    NOW,
    admitted_workload,
    cluster,
    controller,
    owner_job,
    resync,
    stored,
    workload,
)
from tests.support.fake_cluster import live_settings as settings


def test_boost_mode_writes_boosts_then_steady_cycle_writes_nothing() -> None:
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "a1")
    workload(api, "team-b", "b1", annotations={URGENT_ANNOTATION: "true"})
    c = controller(api, settings())
    report = c.run_cycle(NOW)
    assert report.applied is not None and report.applied.counts() == {"applied": 2}
    a1 = stored(api, "team-a", "a1")["metadata"]["annotations"]
    b1 = stored(api, "team-b", "b1")["metadata"]["annotations"]
    assert int(b1[KUEUE_PRIORITY_BOOST_ANNOTATION]) > int(a1[KUEUE_PRIORITY_BOOST_ANNOTATION]) > 0
    assert [d.key for d in report.plan.decisions] == ["team-b/b1", "team-a/a1"]
    resync(c)
    before = c.counting.writes()
    again = c.run_cycle(NOW)
    assert again.changes == [] and c.counting.writes() == before


def test_steady_cycle_reparses_nothing() -> None:
    api = FakeApi()
    cluster(api)
    for i in range(5):
        workload(api, "team-a", f"w{i}")
    c = controller(api, settings())
    c.run_cycle(NOW)
    resync(c)
    c.run_cycle(NOW)
    parsed = c.builder.parse_count
    c.run_cycle(NOW)
    assert c.builder.parse_count == parsed


def test_a_cycle_replans_only_the_pools_whose_inputs_changed() -> None:
    api = FakeApi()
    cluster(api)
    api.put_object(CLUSTER_QUEUES.item("other"), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "other"},
        "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "2"}]}]}]}})
    api.put_object(LOCAL_QUEUES.item("lq", "team-c"), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": "lq", "namespace": "team-c"}, "spec": {"clusterQueue": "other"}})
    workload(api, "team-a", "a1")
    c1 = workload(api, "team-c", "c1")
    c = controller(api, settings())
    c.run_cycle(NOW)
    resync(c)
    c.run_cycle(NOW)  # reads its own writes back: both pools changed
    resync(c)
    steady = c.run_cycle(NOW + timedelta(minutes=5))
    assert steady.changes == [] and c.planner.replanned == () and c.planner.pools == 2
    c1 = stored(api, "team-c", "c1")
    c1["metadata"]["annotations"][URGENT_ANNOTATION] = "true"
    api.put_object(WORKLOADS.item("c1", "team-c"), c1)
    resync(c)
    report = c.run_cycle(NOW + timedelta(minutes=6))
    assert c.planner.replanned == ("cq/other",)
    assert [ch.decision.key for ch in report.changes] == ["team-c/c1"]
    sample = c.metrics.registry.get_sample_value
    assert sample("wdrf_plan_pools_total", {"planned": "reused"}) == 2 + 1
    assert sample("wdrf_plan_pools_total", {"planned": "replanned"}) == 2 + 2 + 1


def test_workload_info_is_built_once_per_resource_version() -> None:
    """The snapshot builder keeps each Workload's observed object and parsed value until its
    resourceVersion changes; the diff computes writes against that very object."""
    api = FakeApi()
    cluster(api)
    for name in ("w0", "w1"):
        workload(api, "team-a", name)
    c = controller(api, settings())
    c.run_cycle(NOW)
    resync(c)
    first = c.snapshot().infos
    assert first.keys() == {"team-a/w0", "team-a/w1"}
    assert all(c.snapshot().infos[k] is first[k] for k in first)
    wl = stored(api, "team-a", "w0")
    wl["metadata"].setdefault("labels", {})["x"] = "y"
    api.put_object(WORKLOADS.item("w0", "team-a"), wl)
    parsed = c.builder.parse_count
    resync(c)  # a relist: every object read again, w1 unchanged
    after = c.snapshot().infos
    assert c.builder.parse_count == parsed + 1
    assert after["team-a/w0"].workload.labels["x"] == "y"
    assert after["team-a/w1"].workload is first["team-a/w1"].workload
    # the informer's object, not the copy read before the relist
    for key in first:
        assert after[key].obj is c.informers["workloads"].get(key)


def test_spec_mode_reasserts_after_kueue_resets_priority() -> None:
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "a1", priority=5)
    c = controller(api, settings(PRIORITY_MODE="spec"))
    c.run_cycle(NOW)
    wl = stored(api, "team-a", "a1")
    target = wl["spec"]["priority"]
    assert target > 5 and wl["metadata"]["annotations"][BASE_PRIORITY_ANNOTATION] == "5"
    # Kueue restarts and resets spec.priority to the class value; the annotation stays.
    wl["spec"]["priority"] = 5
    api.put_object(WORKLOADS.item("a1", "team-a"), wl)
    resync(c)
    c.run_cycle(NOW)
    assert stored(api, "team-a", "a1")["spec"]["priority"] == target


def test_auto_mode_follows_kueue_gate() -> None:
    for gate, mode in ((True, PriorityMode.BOOST), (False, PriorityMode.SPEC),
                       (None, PriorityMode.SPEC)):
        api = FakeApi()
        cluster(api, gate=gate)
        c = controller(api, settings(PRIORITY_MODE="auto"))
        assert c.mode is not None and c.mode.mode is mode


def test_dry_run_writes_nothing_and_reports_what_it_would_write() -> None:
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "a1", annotations={URGENT_ANNOTATION: "maybe"})
    workload(api, "team-b", "b1")
    c = controller(api, settings(LEADER_ELECTION="true", USAGE_HALF_LIFE="1h"), dry_run=True)
    report = c.run_cycle(NOW)
    c.shutdown()
    assert api.writes() == [] and c.counting.writes() == 0
    assert [ch.ref.name for ch in report.refused()] == ["b1"]
    assert c.metrics.events.labels("InvalidAnnotation", "refused")._value.get() == 1


def test_invalid_annotation_gives_an_event_and_others_proceed() -> None:
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "bad", annotations={URGENT_ANNOTATION: "yes"})
    workload(api, "team-b", "good")
    c = controller(api, settings())
    c.run_cycle(NOW)
    events = api.request("GET", EVENTS.collection("team-a"))["items"]
    invalid = [e for e in events if e["reason"] == "InvalidAnnotation"]
    assert len(invalid) == 1 and invalid[0]["involvedObject"]["name"] == "bad"
    assert KUEUE_PRIORITY_BOOST_ANNOTATION not in stored(api, "team-a", "bad")["metadata"][
        "annotations"]
    assert KUEUE_PRIORITY_BOOST_ANNOTATION in stored(api, "team-b", "good")["metadata"][
        "annotations"]
    # the next cycles do not repeat the Event within EVENT_RATE_LIMIT
    resync(c)
    c.run_cycle(NOW)
    c.run_cycle(NOW)
    events = api.request("GET", EVENTS.collection("team-a"))["items"]
    assert len([e for e in events if e["reason"] == "InvalidAnnotation"]) == 1


def test_priority_change_event_on_workload_and_owner_job() -> None:
    api = FakeApi()
    cluster(api)
    owner_job(api)
    workload(api, "team-a", "job-train-abcde", owner="train",
             annotations={URGENT_ANNOTATION: "true"})
    c = controller(api, settings())
    c.run_cycle(NOW)
    events = api.request("GET", EVENTS.collection("team-a"))["items"]
    kinds = sorted(e["involvedObject"]["kind"] for e in events if e["reason"] == "PriorityChanged")
    assert kinds == ["Job", "Workload"]
    messages = {e["message"] for e in events if e["reason"] == "PriorityChanged"}
    assert all(m.endswith("(position 1 in ClusterQueue cq)") for m in messages), messages


def test_first_start_gives_events_only_for_what_people_asked_for() -> None:
    """Every pending Workload gets its first priority; only the urgent one is news (the class
    its owner asked for). The normal ones' encoding is in the priority-terms annotation."""
    api = FakeApi()
    cluster(api)
    for i in range(5):
        workload(api, "team-a", f"n{i}")
    workload(api, "team-a", "hot", annotations={URGENT_ANNOTATION: "true"})
    c = controller(api, settings(EVENT_RATE_LIMIT="0"))  # no per-object limit hides one
    report = c.run_cycle(NOW)
    assert report.applied is not None and report.applied.counts() == {"applied": 6}
    events = api.request("GET", EVENTS.collection("team-a"))["items"]
    assert [(e["reason"], e["involvedObject"]["name"]) for e in events] == [
        ("PriorityChanged", "hot")]


def test_class_change_gives_one_event_per_object_per_interval() -> None:
    """A class change is news, but two within EVENT_RATE_LIMIT give one Event."""
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "w")
    c = controller(api, settings(EVENT_RATE_LIMIT="1h"))
    c.run_cycle(NOW)
    assert api.request("GET", EVENTS.collection("team-a"))["items"] == []
    wl = stored(api, "team-a", "w")
    wl["metadata"]["annotations"][URGENT_ANNOTATION] = "true"
    api.put_object(WORKLOADS.item("w", "team-a"), wl)
    resync(c)
    c.run_cycle(NOW)
    events = api.request("GET", EVENTS.collection("team-a"))["items"]
    assert [e["reason"] for e in events] == ["PriorityChanged"]
    assert "urgent" in events[0]["message"]
    wl = stored(api, "team-a", "w")
    del wl["metadata"]["annotations"][URGENT_ANNOTATION]
    api.put_object(WORKLOADS.item("w", "team-a"), wl)
    resync(c)
    report = c.run_cycle(NOW)
    assert report.applied is not None and report.applied.counts() == {"applied": 1}
    assert len(api.request("GET", EVENTS.collection("team-a"))["items"]) == 1
    assert c.metrics.events.labels("PriorityChanged", "suppressed")._value.get() == 1


def test_hami_annotations_go_on_the_suspended_owner_job() -> None:
    api = FakeApi()
    cluster(api)
    owner_job(api)
    workload(api, "team-a", "job-train-abcde", owner="train", gpu=True)
    c = controller(api, settings(HAMI_DEFAULT_GPU_POLICY="spread"))
    c.run_cycle(NOW)
    job = api.get_object(JOBS.item("train", "team-a"))
    assert job is not None
    assert job["spec"]["template"]["metadata"]["annotations"][HAMI_GPU_POLICY_ANNOTATION] == (
        "spread")


def test_follower_writes_nothing_leader_writes() -> None:
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "a1")
    s = settings(LEADER_ELECTION="true")
    leader = controller(api, s, identity="one")
    follower = controller(api, s, identity="two")
    assert leader.elector is not None and follower.elector is not None
    assert leader.elector.try_acquire_or_renew()
    assert not follower.elector.try_acquire_or_renew()
    writes = len(api.writes())
    report = follower.run_cycle(NOW)
    assert not report.leader and len(api.writes()) == writes
    leader.run_cycle(NOW)
    assert len(api.writes()) > writes
    assert api.get_object(LEASES.item("wdrf-controller", "kueue-system")) is not None


def test_usage_history_survives_a_restart() -> None:
    api = FakeApi()
    cluster(api)
    admitted_workload(api, "team-a", "running", cpu="2")
    workload(api, "team-a", "waiting")
    s = settings(USAGE_HALF_LIFE="1h")
    first = controller(api, s)
    first.run_cycle(NOW)
    first.shutdown()
    assert first.history is not None and first.history.usage
    second = controller(api, s)
    assert second.history is not None
    assert dict(second.history.usage) == dict(first.history.usage)


def test_trigger_on_new_urgent_workload() -> None:
    api = FakeApi()
    cluster(api)
    c = controller(api, settings())
    c.trigger.clear()
    workload(api, "team-a", "plain")
    c.informers["workloads"].relist()
    assert not c.trigger.is_set()
    workload(api, "team-a", "hot", annotations={URGENT_ANNOTATION: "true"})
    c.informers["workloads"].relist()
    assert c.trigger.is_set()


def test_the_plans_warnings_are_logged_when_they_appear_not_every_cycle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The runner logs the plan's own warnings (one source with --dry-run): a
    LowerOrNewerEqualPriority ClusterQueue is named once, not again next cycle; a plain
    LowerPriority one gets no warning (guards make it safe)."""
    api = FakeApi()
    cluster(api)
    for name, within in (("lone", "LowerOrNewerEqualPriority"), ("plain", "LowerPriority")):
        api.put_object(CLUSTER_QUEUES.item(name), {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {"preemption": {"withinClusterQueue": within},
                     "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                         {"name": "default",
                          "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}})
    workload(api, "team-a", "w")
    c = controller(api, settings())
    with caplog.at_level(logging.WARNING, logger="controller.live.runner"):
        c.run_cycle(NOW)
        c.run_cycle(NOW + timedelta(seconds=10))
    lines = [r.getMessage() for r in caplog.records if "ClusterQueue" in r.getMessage()]
    assert len([m for m in lines if "lone" in m and "LowerOrNewerEqualPriority" in m]) == 1
    assert not [m for m in lines if "plain" in m]


@pytest.mark.parametrize("denied,code", [(set(), 0), ({"patch workloads"}, 1)])
def test_health_check(denied: set[str], code: int) -> None:
    from controller.live.health import run_health_check

    api = FakeApi()
    api.static["/version"] = {"gitVersion": "v1.36.0"}
    api.static["/apis/kueue.x-k8s.io"] = KUEUE_GROUP_DOC
    api.static["/apis/kueue.x-k8s.io/v1beta2"] = {"resources": [
        {"name": n} for n in ("workloads", "clusterqueues", "localqueues")]}
    api.denied = denied
    out: list[str] = []
    assert run_health_check(settings(), api, echo=out.append) == code
    text = "\n".join(out)
    assert ("UNHEALTHY" in text) == bool(code)
    if denied:
        assert "[FAIL] RBAC patch workloads.kueue.x-k8s.io" in text


@pytest.mark.parametrize("denied,code", [(set(), 0), ({"watch jobs"}, 1)])
def test_health_check_of_a_multikueue_worker_reviews_its_reads_on_the_manager(
        denied: set[str], code: int) -> None:
    """With MULTIKUEUE_MANAGER_KUBECONFIG the manager must answer and allow the reads the
    controller makes there (SelfSubjectAccessReviews on the manager, not on this cluster)."""
    from controller.live.health import run_health_check
    from controller.live.rbac import manager_permissions

    api, manager = FakeApi(), FakeApi()
    api.static["/version"] = manager.static["/version"] = {"gitVersion": "v1.36.0"}
    api.static["/apis/kueue.x-k8s.io"] = KUEUE_GROUP_DOC
    api.static["/apis/kueue.x-k8s.io/v1beta2"] = {"resources": [
        {"name": n} for n in ("workloads", "clusterqueues", "localqueues")]}
    manager.denied = denied
    out: list[str] = []
    s = settings(MULTIKUEUE_MANAGER_KUBECONFIG="/etc/wdrf/manager/kubeconfig")
    assert run_health_check(s, api, echo=out.append, manager=manager) == code
    text = "\n".join(out)
    reviewed = [line for line in out[0].splitlines() if "manager RBAC" in line]
    assert len(reviewed) == len(manager_permissions(s)), text
    assert "[OK  ] MultiKueue manager reachable: v1.36.0" in text
    if denied:
        assert "[FAIL] manager RBAC watch jobs.batch (cluster-wide): denied" in text
    else:
        assert "HEALTHY" in text and "UNHEALTHY" not in text
    mgr_reviews = [r for r in manager.requests if "selfsubjectaccessreviews" in r[1]]
    assert len(mgr_reviews) == len(reviewed)


def test_health_check_apiserver_down() -> None:
    from controller.live.health import run_health_check

    api = FakeApi()
    api.fail("GET", "/version", 0, message="connection refused")
    out: list[str] = []
    assert run_health_check(settings(), api, echo=out.append) == 1


def test_gpu_fraction_is_not_written_when_the_queue_would_then_block_the_workload() -> None:
    from controller.domain import GPU_FRACTION_ANNOTATION, GPUCORES

    api = FakeApi()
    cluster(api)  # the ClusterQueue covers cpu only; Kueue's default is BlockUndeclared
    owner_job(api, annotations={GPU_FRACTION_ANNOTATION: "0.5"})
    workload(api, "team-a", "job-train-abcde", owner="train", gpu=True)
    c = controller(api, settings())
    report = c.run_cycle(NOW)
    job = api.get_object(JOBS.item("train", "team-a"))
    assert job is not None
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert GPUCORES not in limits
    assert [n.reason for n in report.notices] == ["GpuFractionNotApplied"]
    assert "does not cover nvidia.com/gpucores" in report.notices[0].message


# -- issue 12: mode discovery, stale caches, shutdown order, --once bound; issue 10.6 budget --


def test_unreadable_kueue_config_keeps_the_mode_recorded_on_the_lease() -> None:
    from controller.live.discovery import MODE_ANNOTATION

    api = FakeApi()
    cluster(api, gate=True)
    s = settings(PRIORITY_MODE="auto", LEADER_ELECTION="true")
    leader = controller(api, s, identity="one")
    assert leader.mode is not None and leader.mode.mode is PriorityMode.BOOST
    assert leader.elector is not None and leader.elector.try_acquire_or_renew()
    lease = api.get_object(LEASES.item("wdrf-controller", "kueue-system"))
    assert lease is not None and lease["metadata"]["annotations"][MODE_ANNOTATION] == "boost"
    # Kueue's configuration now answers 500 (or 429, 403): not "gate off".
    api.fail("GET", "kueue-manager-config", 500, times=100)
    follower = controller(api, s, identity="two")
    assert follower.mode is not None and follower.mode.mode is PriorityMode.BOOST
    assert "recorded on Lease" in follower.mode.reason


def test_unreadable_kueue_config_without_a_recorded_mode_is_retried_not_spec() -> None:
    import time

    from controller.live.api import ApiError

    api = FakeApi()
    cluster(api, gate=True)
    api.fail("GET", "kueue-manager-config", 503, times=100)
    c = LiveController(settings(PRIORITY_MODE="auto"), api, identity="me")
    with pytest.raises(ApiError):
        c.discover(deadline=time.monotonic() + 1.5)
    assert c.mode is None
    # Only a 404 means "not configured there": then Kueue's default (gate off) -> spec.
    api2 = FakeApi()
    cluster(api2)
    c2 = controller(api2, settings(PRIORITY_MODE="auto"))
    assert c2.mode is not None and c2.mode.mode is PriorityMode.SPEC


def test_stale_workload_cache_pauses_writes_and_readiness() -> None:
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "a1")
    c = controller(api, settings(CACHE_MAX_STALENESS="30s"))
    c.max_staleness = 30.0
    clock = {"t": 1000.0}
    inf = c.informers["workloads"]
    inf._clock = lambda: clock["t"]
    inf._fresh_at = 1000.0
    clock["t"] += 31  # no list, event or healthy stream for 31 s
    writes = len(api.writes())
    report = c.run_cycle(NOW)
    assert report.leader and report.paused.startswith("stale cache: workloads")
    assert len(api.writes()) == writes
    ok, why = c.health.ready()
    assert not ok and "workloads" in why
    inf._fresh_at = clock["t"]  # a healthy stream again
    report = c.run_cycle(NOW)
    assert not report.paused and len(api.writes()) > writes
    assert c.health.ready()[0]


def test_write_budget_defers_the_rest_to_the_next_cycle() -> None:
    api = FakeApi()
    cluster(api)
    for i in range(5):
        workload(api, "team-a", f"w{i}")
    c = controller(api, settings())
    c.cycle_writer.budget = 2
    report = c.run_cycle(NOW)
    assert report.applied is not None
    assert report.applied.counts() == {"applied": 2, "deferred": 3}
    resync(c)
    assert c.run_cycle(NOW).applied.counts() == {"applied": 2, "deferred": 1}  # type: ignore[union-attr]


def test_client_qps_limit_spaces_requests() -> None:
    from controller.live.api import TokenBucket

    t = {"now": 0.0}
    slept: list[float] = []

    def sleep(d: float) -> None:
        slept.append(d)
        t["now"] += d

    bucket = TokenBucket(qps=10, burst=3, clock=lambda: t["now"], sleep=sleep)
    for _ in range(8):
        bucket.take()
    assert slept[:1] == [pytest.approx(0.1)] and len(slept) == 5  # burst of 3, then 10/s
    assert t["now"] == pytest.approx(0.5)


def test_shutdown_saves_history_before_releasing_the_lease_and_writes_nothing_after() -> None:
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "a1")
    c = controller(api, settings(LEADER_ELECTION="true", USAGE_HALF_LIFE="1h"))
    assert c.elector is not None and c.elector.try_acquire_or_renew()
    c.run_cycle(NOW)
    c.history_store._last_text = None  # force a save at shutdown
    before = len(api.requests)
    c.shutdown(grace=5)
    after = [r for r in api.requests[before:] if r[0] != "GET"]
    assert [m for m, _ in after] == ["PUT", "PUT"]
    assert "configmaps" in after[0][1] and "leases" in after[1][1]  # history, then Lease
    lease = api.get_object(LEASES.item("wdrf-controller", "kueue-system"))
    assert lease is not None and lease["spec"]["holderIdentity"] == ""
    writes = len(api.writes())
    workload(api, "team-a", "late")
    resync(c)
    c.run_cycle(NOW)
    assert len(api.writes()) == writes  # nothing by the controller after the release


def test_once_is_bounded_and_says_why_in_one_line() -> None:
    import threading
    import time

    from controller.live.main import LiveError, bounded

    stop = threading.Event()
    started = time.monotonic()
    with pytest.raises(LiveError, match="no result within 1s"):
        bounded("--once", 1.0, stop, lambda: stop.wait(30))
    assert time.monotonic() - started < 3 and stop.is_set()
    with pytest.raises(LiveError, match="--once failed: boom"):
        bounded("--once", 5.0, stop, lambda: (_ for _ in ()).throw(RuntimeError("boom")))


def test_no_priority_event_when_only_the_aging_reference_moved() -> None:
    """A weekly rebase rewrites every pending Workload (its values rise by a x period) but the
    order did not change: no PriorityChanged Event for those writes."""
    from controller.encoding import next_rebase

    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "a1", annotations={URGENT_ANNOTATION: "true"})
    workload(api, "team-a", "a2", annotations={URGENT_ANNOTATION: "true"})
    c = controller(api, settings(EVENT_RATE_LIMIT="0"))  # no rate limit hides an Event
    first = c.run_cycle(NOW)
    assert first.applied is not None and first.applied.counts() == {"applied": 2}
    events = [e for e in api.writes() if "/events" in e[1]]
    assert events  # a first priority is worth an Event
    resync(c)
    after_rebase = next_rebase(NOW, c.settings.rebase_period) + timedelta(seconds=1)
    report = c.run_cycle(after_rebase)
    assert report.applied is not None and report.applied.counts() == {"applied": 2}
    assert [e for e in api.writes() if "/events" in e[1]] == events


def test_the_queues_head_is_written_first_when_the_budget_is_short() -> None:
    """Four Workloads of one queue, none written; w3 is urgent (the plan's head) and w2 the
    longest queued (Kueue's head now): with a budget of 2 those two are written."""
    api = FakeApi()
    cluster(api)
    for i in range(3):
        workload(api, "team-a", f"w{i}", minutes_ago=10 + i)
    workload(api, "team-a", "w3", minutes_ago=1, annotations={URGENT_ANNOTATION: "true"})
    c = controller(api, settings())
    c.cycle_writer.budget = 2
    report = c.run_cycle(NOW)
    assert report.applied is not None
    applied = sorted(o.change.ref.name for o in report.applied.outcomes if o.result == "applied")
    assert applied == ["w2", "w3"]


def test_convergence_per_cluster_queue_metric_and_log(caplog: pytest.LogCaptureFixture) -> None:
    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "old", minutes_ago=30)
    workload(api, "team-b", "hot", minutes_ago=1, annotations={URGENT_ANNOTATION: "true"})
    c = controller(api, settings())
    m = c.metrics
    c.run_cycle(NOW)  # Kueue's order now: old (queued first), hot; the plan's: hot, old
    assert m.positions_right.labels("cq")._value.get() == 0
    assert m.order_converged.labels("cq")._value.get() == 0
    assert m.head_unconverged._value.get() == 1
    resync(c)
    with caplog.at_level(logging.INFO, logger="controller.live.writer"):
        report = c.run_cycle(NOW + timedelta(seconds=10))
    assert report.changes == []
    assert m.positions_right.labels("cq")._value.get() == 2
    assert m.order_converged.labels("cq")._value.get() == 1
    assert m.head_unconverged._value.get() == 0
    (line,) = [r.getMessage() for r in caplog.records if "converged" in r.getMessage()]
    assert line.startswith("ClusterQueue cq converged: its 2 pending Workloads are in the "
                           "plan's order ("), line


def test_class_annotations_on_a_served_jobset_owner_are_read() -> None:
    """The cluster serves JobSets: the controller watches the Kueue-managed ones and an urgent
    JobSet makes its Workload urgent; kinds the cluster does not serve are not watched."""
    from tests.support.fake_cluster import urgent_jobset

    api = FakeApi()
    cluster(api)
    urgent_jobset(api)
    wl = workload(api, "team-a", "jobset-train")
    wl["metadata"]["ownerReferences"] = [{"apiVersion": "jobset.x-k8s.io/v1alpha2",
                                          "kind": "JobSet", "name": "train", "uid": "uid-js",
                                          "controller": True}]
    api.put_object(WORKLOADS.item("jobset-train", "team-a"), wl)
    workload(api, "team-b", "plain", minutes_ago=60)
    c = controller(api, settings())
    assert [r.plural for r in c.owner_resources] == ["jobsets"]
    assert sorted(c.informers) == ["admissionchecks", "clusterqueues", "jobs", "localqueues",
                                   "owners-jobsets", "pods", "workloads"]
    plan = c.run_cycle(NOW).plan
    d = next(d for d in plan.decisions if d.key == "team-a/jobset-train")
    assert d.breakdown is not None and d.breakdown.priority_class.value == "urgent"
    assert plan.decisions[0].key == "team-a/jobset-train"


def test_with_a_certificate_metrics_are_https_and_need_a_token(tmp_path: Any) -> None:
    """METRICS_CERT_FILE/KEY_FILE: the controller serves /metrics over TLS and refuses a scrape
    without a bearer token (401) before asking the apiserver anything; health stays plain HTTP
    on HEALTH_PORT."""
    import ssl
    import urllib.error
    import urllib.request

    from tests.support.certs import make_pki
    from tests.support.procs import free_port

    pki = make_pki(tmp_path / "pki")
    metrics_port, health_port = free_port(), free_port()
    api = FakeApi()
    cluster(api)
    c = LiveController(settings(METRICS_PORT=str(metrics_port), HEALTH_PORT=str(health_port),
                                METRICS_CERT_FILE=str(pki.serving_crt),
                                METRICS_KEY_FILE=str(pki.serving_key)), api, identity="me")
    c.start(serve_http=True)
    try:
        ctx = ssl.create_default_context(cafile=str(pki.ca_crt))
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"https://127.0.0.1:{metrics_port}/metrics", context=ctx,
                                   timeout=10)
        assert denied.value.code == 401
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP there
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
        try:
            code = urllib.request.urlopen(f"http://127.0.0.1:{health_port}/livez",
                                          timeout=10).status
        except urllib.error.HTTPError as e:
            code = e.code
        assert code in (200, 503)  # answered, plain, without a token
        assert not any("tokenreviews" in path for _, path in api.requests)
    finally:
        c.shutdown()


@pytest.mark.parametrize(("strategy", "wait"), [(None, 60.0), ("Creation", 600.0),
                                                ("Eviction", 60.0)])
def test_waits_follow_kueues_requeuing_timestamp(strategy: str | None, wait: float) -> None:
    """A Workload created 10 min ago and evicted 1 min ago waits from its eviction, unless
    Kueue's manager config says requeuingStrategy.timestamp: Creation."""
    api = FakeApi()
    cluster(api)
    if strategy is not None:
        api.put_object(CONFIG_MAPS.item("kueue-manager-config", "kueue-system"), {
            "metadata": {"name": "kueue-manager-config"},
            "data": {"controller_manager_config.yaml":
                     "waitForPodsReady:\n  enable: true\n  requeuingStrategy:\n"
                     f"    timestamp: {strategy}\n"}})
    wl = workload(api, "team-a", "back", minutes_ago=10)
    wl["status"] = {"conditions": [{
        "type": "Evicted", "status": "True", "reason": "PodsReadyTimeout",
        "lastTransitionTime": (NOW - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}]}
    api.put_object(WORKLOADS.item("back", "team-a"), wl)
    c = controller(api, settings())
    [d] = c.run_cycle(NOW).plan.decisions
    assert d.breakdown is not None and d.breakdown.wait_seconds(NOW) == wait


def preempting_cluster(api: FakeApi) -> None:
    """`cluster` with a ClusterQueue whose preemption reaches admitted work, one admitted
    Workload in team-a and one pending in team-b (both normal): the plan guards the first
    and raises the second in the same cycle."""
    preempting_queue(api)
    admitted_workload(api, "team-a", "running", cpu="1")
    workload(api, "team-b", "waiting")


def preempting_queue(api: FakeApi) -> None:
    """`cluster` with ClusterQueue `cq` (4 cores) preempting within itself (LowerPriority)."""
    cluster(api)
    api.put_object(CLUSTER_QUEUES.item("cq"), {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": "cq"},
        "spec": {"preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                     {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "4"}]}]}]}})


class SlowGuardApi(FakeApi):
    """Records when each Workload PATCH starts and ends; the PATCH of `slow` (the guard) is
    slow, so a write sent concurrently would start (and end) before it."""

    def __init__(self) -> None:
        super().__init__()
        self.timeline: list[tuple[str, str]] = []
        self.slow = "running"

    def request(self, method: str, path: str, **kw: Any) -> Any:
        patch = method == "PATCH" and "/workloads/" in path
        name = path.rsplit("/", 1)[-1]
        if patch:
            self.timeline.append(("start", name))
            if name == self.slow:
                time.sleep(0.3)
        try:
            return super().request(method, path, **kw)
        finally:
            if patch:
                self.timeline.append(("end", name))


def test_guards_land_before_any_raise_of_the_cycle_even_with_concurrent_writers() -> None:
    api = SlowGuardApi()
    preempting_cluster(api)
    c = controller(api, settings())
    report = c.run_cycle(NOW)
    assert report.applied is not None and report.applied.counts() == {"applied": 2}
    timeline = api.timeline
    assert timeline.index(("end", "running")) < timeline.index(("start", "waiting")), timeline
    guard = int(stored(api, "team-a", "running")["metadata"]["annotations"][
        KUEUE_PRIORITY_BOOST_ANNOTATION])
    raised = int(stored(api, "team-b", "waiting")["metadata"]["annotations"][
        KUEUE_PRIORITY_BOOST_ANNOTATION])
    assert guard > raised > 0


def test_a_guard_that_does_not_land_holds_its_pools_raises_for_the_next_cycle() -> None:
    api = FakeApi()
    preempting_cluster(api)
    c = controller(api, settings())
    api.fail("PATCH", "/workloads/running", 403, message="denied")
    report = c.run_cycle(NOW)
    assert report.applied is not None and report.applied.counts() == {
        "failed": 1, "deferred": 1}
    ann = stored(api, "team-b", "waiting")["metadata"].get("annotations") or {}
    assert KUEUE_PRIORITY_BOOST_ANNOTATION not in ann  # not raised past an unguarded one
    resync(c)
    report = c.run_cycle(NOW + timedelta(seconds=10))
    assert report.applied is not None and report.applied.counts() == {"applied": 2}


def reclaim_cluster(api: FakeApi) -> int:
    """`preempting_queue` held by four team-a Workloads that started 2 h ago, team-b's `b0`
    waiting, and team-a's `back`: evicted while it carried its guard (PodsReadyTimeout),
    pending again with that value. With reclaim the plan lowers `back`, exposes team-a's last
    started Workload (`a3`) to team-b, guards the others and raises `b0`. Returns the
    guard."""
    preempting_queue(api)
    started = (NOW - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    for i in range(4):
        wl = workload(api, "team-a", f"a{i}", minutes_ago=130 - i)
        wl["status"] = {
            "conditions": [{"type": "QuotaReserved", "status": "True",
                            "lastTransitionTime": started}],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "main", "count": 1, "resourceUsage": {"cpu": "1"}, "flavors": {}}]}}
        api.put_object(WORKLOADS.item(f"a{i}", "team-a"), wl)
    workload(api, "team-b", "b0")
    guard = RECLAIM_SETTINGS.guard(PriorityClass.NORMAL)
    back = workload(api, "team-a", "back", minutes_ago=200, annotations={
        KUEUE_PRIORITY_BOOST_ANNOTATION: str(guard),
        PRIORITY_TERMS_ANNOTATION: guard_terms(PriorityClass.NORMAL, "team-a", pool_key("cq"),
                                               None, guard)})
    back["status"] = {"conditions": [{
        "type": "Evicted", "status": "True", "reason": "PodsReadyTimeout",
        "lastTransitionTime": (NOW - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")}]}
    api.put_object(WORKLOADS.item("back", "team-a"), back)
    return guard


RECLAIM_ENV = {"RECLAIM_ENABLED": "true"}
RECLAIM_SETTINGS = settings(**RECLAIM_ENV)


def boost_of(api: FakeApi, ns: str, name: str) -> int:
    ann = stored(api, ns, name)["metadata"].get("annotations") or {}
    return int(ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION, "0"))


def test_a_value_written_while_admitted_is_lowered_before_guards_and_exposures() -> None:
    api = SlowGuardApi()
    api.slow = "back"
    guard = reclaim_cluster(api)
    c = controller(api, RECLAIM_SETTINGS)
    report = c.run_cycle(NOW)
    exposures = [d.key for d in report.plan.decisions
                 if d.admitted and d.breakdown is not None and d.breakdown.exposure is not None]
    assert exposures == ["team-a/a3"]
    assert report.applied is not None and report.applied.counts() == {"applied": 6}
    timeline = api.timeline
    done = timeline.index(("end", "back"))
    assert all(timeline.index(("start", name)) > done
               for name in ("a0", "a1", "a2", "a3", "b0")), timeline
    # LowerPriority: a3 at back's new value is safe from it, and below b0
    assert boost_of(api, "team-a", "back") <= boost_of(api, "team-a", "a3") < guard
    assert boost_of(api, "team-b", "b0") > boost_of(api, "team-a", "a3")


def test_a_lowering_that_does_not_land_holds_its_pools_exposures_for_the_next_cycle() -> None:
    api = FakeApi()
    guard = reclaim_cluster(api)
    c = controller(api, RECLAIM_SETTINGS)
    api.fail("PATCH", "/workloads/back", 403, message="denied")
    report = c.run_cycle(NOW)
    assert report.applied is not None
    results = {o.change.name: o.result for o in report.applied.outcomes}
    # the guards go (they only protect); the exposure, and the raise it was for, wait
    assert results == {"back": "failed", "a0": "applied", "a1": "applied", "a2": "applied",
                       "a3": "deferred", "b0": "deferred"}
    assert boost_of(api, "team-a", "a3") == 0 and boost_of(api, "team-b", "b0") == 0
    assert boost_of(api, "team-a", "back") == guard
    resync(c)
    report = c.run_cycle(NOW + timedelta(seconds=10))
    assert report.applied is not None and report.applied.counts() == {"applied": 3}
    assert boost_of(api, "team-a", "back") <= boost_of(api, "team-a", "a3") < guard


def test_a_short_budget_writes_the_lowering_first_and_holds_the_exposure() -> None:
    api = FakeApi()
    reclaim_cluster(api)
    c = controller(api, settings(**RECLAIM_ENV, WRITE_BUDGET="1"))
    report = c.run_cycle(NOW)
    assert report.applied is not None
    results = {o.change.name: o.result for o in report.applied.outcomes}
    assert results["back"] == "applied" and results["a3"] == "deferred"


def test_a_cycle_longer_than_the_interval_still_leaves_a_pause() -> None:
    from controller.live.runner import MIN_TRIGGER_GAP

    c = LiveController(settings(LOOP_INTERVAL="1"), FakeApi(), identity="me")
    spans: list[tuple[float, float]] = []

    def slow_cycle() -> None:  # each cycle takes longer than LOOP_INTERVAL
        start = time.monotonic()
        time.sleep(1.2)
        spans.append((start, time.monotonic()))
        if len(spans) == 3:
            c.stop_event.set()

    c.run_cycle = slow_cycle  # type: ignore[method-assign]
    c.loop()
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(spans)]
    assert len(gaps) == 2 and all(g >= MIN_TRIGGER_GAP * 0.9 for g in gaps), gaps


def test_a_bad_usage_history_is_reset_with_an_event_and_the_cycle_still_writes() -> None:
    """A timestamp without a time zone in the stored history (anyone who can edit the
    ConfigMap): the cycle plans and writes from current usage, says so on the ConfigMap, and
    the next save replaces the bad content."""
    api = FakeApi()
    cluster(api)
    admitted_workload(api, "team-a", "running", cpu="2")
    workload(api, "team-a", "waiting")
    s = settings(USAGE_HALF_LIFE="1h")
    path = CONFIG_MAPS.item(s.history_config_map, s.controller_namespace)
    api.put_object(path, {"metadata": {"name": s.history_config_map,
                                       "namespace": s.controller_namespace},
                          "data": {"history.json": '{"version": 1, "timestamp": '
                                   '"2026-01-01T00:00:00", "usage": {}}'}})
    c = controller(api, s)
    report = c.run_cycle(NOW)
    assert report.applied is not None and report.applied.counts().get("applied", 0) >= 1
    events = api.request("GET", EVENTS.collection(s.controller_namespace))["items"]
    [reset] = [e for e in events if e["reason"] == "UsageHistoryReset"]
    assert "no time zone" in reset["message"]
    assert reset["involvedObject"]["name"] == s.history_config_map
    c.shutdown()
    saved = api.get_object(path)
    assert saved is not None and "+00:00" in saved["data"]["history.json"]


def test_a_failing_dry_run_cycle_is_one_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    from controller.live.main import _dry_run_loop

    api = FakeApi()
    cluster(api)
    c = controller(api, settings(LOOP_INTERVAL="1"), dry_run=True)
    calls = []

    def broken(now: datetime | None = None) -> Any:
        calls.append(now)
        if len(calls) == 2:
            c.stop_event.set()
        raise TypeError("can't subtract offset-naive and offset-aware datetimes")

    c.run_cycle = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR):
        _dry_run_loop(c, "table")
    assert len(calls) == 2  # the loop went on
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and all(r.exc_info is None for r in errors)
    assert "TypeError: can't subtract" in errors[0].getMessage()
    assert "Traceback" not in capsys.readouterr().err


def test_the_plan_runs_with_automatic_collection_paused_and_the_loop_collects_after() -> None:
    import gc

    api = FakeApi()
    cluster(api)
    workload(api, "team-a", "a1")
    c = controller(api, settings())
    during: list[bool] = []
    plan = c.planner.plan

    def planning(*args: Any, **kwargs: Any) -> Any:
        during.append(gc.isenabled())
        return plan(*args, **kwargs)

    c.planner.plan = planning  # type: ignore[method-assign]
    run = c.run_cycle

    def once(now: datetime | None = None) -> Any:
        report = run(now)
        c.stop_event.set()
        return report

    c.run_cycle = once  # type: ignore[method-assign]
    try:
        c.loop()
        assert during == [False] and gc.isenabled()
        assert gc.get_freeze_count() > 0  # collected and frozen after the cycle
    finally:
        gc.unfreeze()
