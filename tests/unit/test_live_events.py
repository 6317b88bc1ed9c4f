"""Events: created on the object, limited per object and overall, never fatal."""

from __future__ import annotations

from itertools import pairwise

from controller.domain import ObjectRef
from controller.live.api import EVENTS, ReadOnlyTransport
from controller.live.events import EventRecorder
from controller.live.metrics import Metrics
from controller.plan import change_is_eventful
from tests.support.fake import FakeApi

REF = ObjectRef("Workload", "wl", "team-a", "uid-1", "kueue.x-k8s.io/v1beta2")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def events(api: FakeApi) -> list[dict[str, object]]:
    return api.request("GET", EVENTS.collection("team-a"))["items"]  # type: ignore[no-any-return]


def test_event_names_the_object() -> None:
    api = FakeApi()
    rec = EventRecorder(api, Metrics(), per_object=10)
    assert rec.emit(REF, "InvalidAnnotation", "bad value", "Warning")
    (ev,) = events(api)
    assert ev["involvedObject"] == {"kind": "Workload", "name": "wl", "namespace": "team-a",
                                    "uid": "uid-1", "apiVersion": "kueue.x-k8s.io/v1beta2"}
    assert ev["type"] == "Warning" and ev["reason"] == "InvalidAnnotation"


def test_one_event_per_object_and_reason_per_interval_whatever_the_message() -> None:
    api, clock = FakeApi(), Clock()
    rec = EventRecorder(api, Metrics(), per_object=10, clock=clock)
    other = ObjectRef("Job", "job", "team-a", "uid-2", "batch/v1")
    assert rec.emit(REF, "PriorityChanged", "priority -> 1")
    assert not rec.emit(REF, "PriorityChanged", "priority -> 2")
    assert rec.emit(REF, "InvalidAnnotation", "bad value", "Warning")  # a refusal still tells
    assert not rec.emit(REF, "InvalidAnnotation", "another bad value", "Warning")
    assert rec.emit(other, "PriorityChanged", "another object")
    assert len(events(api)) == 3
    clock.t += 9.9
    assert not rec.emit(REF, "PriorityChanged", "still within the interval")
    clock.t += 0.2
    assert rec.emit(REF, "PriorityChanged", "a new interval")
    assert len(events(api)) == 4


def test_no_per_object_limit_when_the_interval_is_zero() -> None:
    api = FakeApi()
    rec = EventRecorder(api, Metrics(), per_object=0, qps=0)
    for i in range(5):
        assert rec.emit(REF, "PriorityChanged", f"priority -> {i}")
    assert len(events(api)) == 5


def test_overall_limit_drops_what_is_over_it_in_any_second() -> None:
    api, clock = FakeApi(), Clock()
    metrics = Metrics()
    rec = EventRecorder(api, metrics, per_object=3600, qps=10, clock=clock)
    refs = [ObjectRef("Workload", f"w{i}", "team-a", f"u{i}", "v1") for i in range(100)]
    sent = [rec.emit(ref, "PriorityChanged", "x") for ref in refs[:30]]
    assert sent == [True] * 10 + [False] * 20  # ten at once are fine (a Workload and its Job)
    assert metrics.events.labels("PriorityChanged", "throttled")._value.get() == 20
    clock.t += 0.99
    assert not rec.emit(refs[30], "PriorityChanged", "x")
    clock.t += 0.01
    assert [rec.emit(ref, "PriorityChanged", "x") for ref in refs[31:43]] == [True] * 10 + [
        False] * 2
    # a throttled object did not use its per-object allowance: it gets its Event later
    clock.t += 10
    assert rec.emit(refs[10], "PriorityChanged", "x")


def test_a_fractional_rate_spaces_events_out() -> None:
    api, clock = FakeApi(), Clock()
    rec = EventRecorder(api, Metrics(), per_object=0, qps=0.5, clock=clock)
    assert rec.emit(REF, "X", "y")
    clock.t += 1.9
    assert not rec.emit(REF, "X", "y")
    clock.t += 0.1
    assert rec.emit(REF, "X", "y")


def test_events_over_a_simulated_hour_stay_within_both_limits() -> None:
    """Many objects emitting every second for an hour: per object at most one per interval,
    in any window of 1/qps seconds at most one (a rate below one a second)."""
    api, clock = FakeApi(), Clock()
    rec = EventRecorder(api, Metrics(), per_object=600, qps=0.05, clock=clock)
    refs = [ObjectRef("Workload", f"w{i}", "team-a", f"u{i}", "v1") for i in range(50)]
    sent: dict[str, list[float]] = {}
    for second in range(3600):
        clock.t = float(second)
        for ref in refs[second % 7::7]:
            if rec.emit(ref, "PriorityChanged", "x"):
                sent.setdefault(ref.name, []).append(clock.t)
    times = sorted(t for ts in sent.values() for t in ts)
    assert len(times) == len(events(api))
    for ts in sent.values():
        assert all(b - a >= 600 for a, b in pairwise(ts))
    for start in range(0, 3600, 100):
        assert sum(start <= t < start + 100 for t in times) <= 0.05 * 100 + 1
    for t in times:  # at most one in any 20 s
        assert sum(t <= u < t + 20 for u in times) == 1
    assert 0.05 * 3600 - 2 <= len(times) <= 0.05 * 3600 + 1  # the overall limit binds


def test_failures_are_counted_not_raised() -> None:
    api = FakeApi()
    metrics = Metrics()
    api.fail("POST", "/events", 500)
    rec = EventRecorder(api, metrics, per_object=10)
    assert not rec.emit(REF, "X", "y")
    assert metrics.events.labels("X", "failed")._value.get() == 1
    assert rec.emit(REF, "X", "y")  # not remembered after a failure: retried


def test_dry_run_sends_no_event() -> None:
    api = FakeApi()
    rec = EventRecorder(ReadOnlyTransport(api), Metrics(), per_object=10)
    assert not rec.emit(REF, "X", "y")
    assert api.writes() == []


PENDING = ("v2 class=normal team=a pool=cq/q level=1/8 fair=100 since=2026-01-05T00:00:00Z "
           "ref=2026-01-05T00:00:00Z base=0 override=- priority=1000")


def terms(text: str, **change: str) -> str:
    words = dict(w.partition("=")[::2] for w in text.split()[1:])
    return " ".join(["v2", *(f"{k}={v}" for k, v in {**words, **change}.items())])


def test_encoding_changes_are_not_eventful() -> None:
    for change in ({"level": "3/8", "fair": "300"}, {"ref": "2026-01-12T00:00:00Z"},
                   {"priority": "5000"}, {"since": "2026-01-06T00:00:00Z"}, {"pool": "x"}):
        assert not change_is_eventful(PENDING, terms(PENDING, **change)), change


def test_class_override_and_reclaim_changes_are_eventful() -> None:
    for change in ({"class": "urgent"}, {"class": "approved"}, {"override": "7"},
                   {"state": "exposed", "for": "b"}):
        assert change_is_eventful(PENDING, terms(PENDING, **change)), change


def test_a_first_write_is_eventful_only_when_something_was_asked() -> None:
    assert not change_is_eventful(None, PENDING)
    assert not change_is_eventful("", PENDING)
    assert change_is_eventful(None, terms(PENDING, **{"class": "urgent"}))
    assert change_is_eventful(None, terms(PENDING, override="9"))
    guard = "v2 class=normal team=a pool=cq/q state=admitted override=- priority=9"
    assert not change_is_eventful(None, guard)  # admission is Kueue's news
    assert not change_is_eventful(PENDING, guard)
    assert change_is_eventful(guard, terms(guard, state="exposed", **{"for": "b"}))
