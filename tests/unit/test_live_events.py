"""Events: created on the object, rate-limited per interval, never fatal."""

from __future__ import annotations

from controller.domain import ObjectRef
from controller.live.api import EVENTS, ReadOnlyTransport
from controller.live.events import EventRecorder
from controller.live.metrics import Metrics
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
    rec = EventRecorder(api, Metrics(), ttl=10)
    assert rec.emit(REF, "InvalidAnnotation", "bad value", "Warning")
    (ev,) = events(api)
    assert ev["involvedObject"] == {"kind": "Workload", "name": "wl", "namespace": "team-a",
                                    "uid": "uid-1", "apiVersion": "kueue.x-k8s.io/v1beta2"}
    assert ev["type"] == "Warning" and ev["reason"] == "InvalidAnnotation"


def test_same_event_once_per_interval() -> None:
    api, clock = FakeApi(), Clock()
    rec = EventRecorder(api, Metrics(), ttl=10, clock=clock)
    for _ in range(5):
        rec.emit(REF, "InvalidAnnotation", "bad value", "Warning")
    assert len(events(api)) == 1
    rec.emit(REF, "InvalidAnnotation", "another bad value", "Warning")
    assert len(events(api)) == 2
    clock.t += 11
    rec.emit(REF, "InvalidAnnotation", "bad value", "Warning")
    assert len(events(api)) == 3


def test_dedupe_key_limits_changing_messages() -> None:
    api, clock = FakeApi(), Clock()
    rec = EventRecorder(api, Metrics(), ttl=10, clock=clock)
    for i in range(3):
        rec.emit(REF, "PriorityChanged", f"priority -> {i}", dedupe="priority")
    assert len(events(api)) == 1


def test_failures_are_counted_not_raised() -> None:
    api = FakeApi()
    metrics = Metrics()
    api.fail("POST", "/events", 500)
    rec = EventRecorder(api, metrics, ttl=10)
    assert not rec.emit(REF, "X", "y")
    assert metrics.events.labels("X", "failed")._value.get() == 1
    assert rec.emit(REF, "X", "y")  # not remembered after a failure: retried


def test_dry_run_sends_no_event() -> None:
    api = FakeApi()
    rec = EventRecorder(ReadOnlyTransport(api), Metrics(), ttl=10)
    assert not rec.emit(REF, "X", "y")
    assert api.writes() == []
