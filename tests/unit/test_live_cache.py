"""Informers: one LIST, then WATCH from the last resourceVersion; relist only on 410."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import pytest

from controller.live.api import WORKLOADS, ApiError, CountingTransport
from controller.live.backoff import Backoff
from controller.live.cache import Gone, Informer, Shared, WatchSpec, slim
from controller.live.metrics import Metrics
from tests.support.builders import workload_dict
from tests.support.fake import FakeApi


def wl(name: str, ns: str = "ns", **labels: str) -> dict[str, Any]:
    """A Workload (tests/support/builders.py) with managedFields, which the cache drops."""
    obj = workload_dict(name, ns, labels=labels)
    obj["metadata"]["managedFields"] = [{"manager": "x"}]
    return obj


def setup(n: int = 3, page: int = 2) -> tuple[FakeApi, CountingTransport, Informer, list[Any]]:
    api = FakeApi()
    for i in range(n):
        api.put_object(WORKLOADS.item(f"w{i}", "ns"), wl(f"w{i}"))
    seen: list[Any] = []
    counting = CountingTransport(api)
    # Watches of the fake stay open until their timeout (1 s here), like the apiserver's.
    inf = Informer(counting, WatchSpec(WORKLOADS), Metrics(),
                   on_event=lambda kind, old, new: seen.append((kind, old, new)), page_size=page,
                   watch_timeout=0.6)
    return api, counting, inf, seen


def test_relist_paginates_and_strips_managed_fields() -> None:
    _, counting, inf, seen = setup(n=5, page=2)
    inf.relist()
    assert len(inf) == 5 and inf.synced
    assert counting.snapshot()["GET workloads"] == 3  # 2 + 2 + 1
    assert all("managedFields" not in o["metadata"] for o in inf.items())
    assert len(seen) == 5 and all(old is None for _, old, _ in seen)


def test_watch_resumes_from_last_resource_version_without_relisting() -> None:
    api, counting, inf, seen = setup()
    inf.relist()
    seen.clear()
    api.put_object(WORKLOADS.item("w9", "ns"), wl("w9"))
    api.request("DELETE", WORKLOADS.item("w0", "ns"))
    inf.watch_once(threading.Event())
    assert inf.get("ns/w9") is not None and inf.get("ns/w0") is None
    assert [(old is None, new is None) for _, old, new in seen] == [(True, False), (False, True)]
    rv = inf.resource_version
    inf.watch_once(threading.Event())  # nothing new: no events, rv kept
    assert inf.resource_version == rv
    assert counting.snapshot()["GET workloads"] == 2  # only the initial LIST pages


def test_410_gone_raises_for_relist() -> None:
    api, _, inf, _ = setup()
    inf.relist()
    api.put_object(WORKLOADS.item("w9", "ns"), wl("w9"))
    api.compact()
    with pytest.raises(Gone):
        inf.watch_once(threading.Event())


def test_relist_reports_what_changed_during_an_outage() -> None:
    api, _, inf, seen = setup()
    inf.relist()
    seen.clear()
    api.put_object(WORKLOADS.item("w1", "ns"), {**wl("w1"), "spec": {"priority": 5}})
    api.request("DELETE", WORKLOADS.item("w2", "ns"))
    inf.relist()
    changed = sorted((new or old)["metadata"]["name"] for _, old, new in seen)
    assert changed == ["w1", "w2"]


def test_label_selector_is_sent() -> None:
    api = FakeApi()
    api.put_object(WORKLOADS.item("a", "ns"), wl("a", q="x"))
    api.put_object(WORKLOADS.item("b", "ns"), wl("b"))
    inf = Informer(api, WatchSpec(WORKLOADS, label_selector="q"), Metrics())
    inf.relist()
    assert [o["metadata"]["name"] for o in inf.items()] == ["a"]


def test_run_loop_recovers_from_errors_and_gone_counting_restarts() -> None:
    api, counting, _, _ = setup()
    metrics = Metrics()
    stop = threading.Event()
    waits: list[float] = []

    class Stopper(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout or 0.0)
            return stop.is_set()

        def is_set(self) -> bool:
            return stop.is_set()

    inf = Informer(counting, WatchSpec(WORKLOADS), metrics,
                   backoff=Backoff(initial=0.01, cap=0.02))
    api.fail("GET", "/workloads", 500, times=1)  # the first LIST fails
    calls = {"n": 0}
    real_watch = inf.watch_once

    def watch(s: threading.Event) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            api.put_object(WORKLOADS.item("late", "ns"), wl("late"))
            api.compact()  # the informer's resourceVersion is now too old
            real_watch(s)
        elif calls["n"] == 2:
            raise ApiError(0, "ConnectionRefused")
        else:
            stop.set()

    inf.watch_once = watch  # type: ignore[method-assign]
    inf.run(Stopper())
    assert inf.get("ns/late") is not None
    restarts = {
        reason: metrics.watch_restarts.labels("workloads", reason)._value.get()
        for reason in ("error", "gone", "closed")
    }
    assert restarts["gone"] == 1 and restarts["error"] == 2
    assert metrics.relists.labels("workloads")._value.get() == 2
    assert len(waits) == 3  # a delay before every re-watch: after each error and the 410


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_every_rewatch_waits_and_the_backoff_resets_only_after_a_healthy_stream() -> None:
    api = FakeApi()
    clock = Clock()
    waits: list[float] = []
    stop = threading.Event()
    lengths = iter([0.0] * 6 + [10.0] + [0.0] * 2)  # how long each stream stays open

    class Recorder(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout or 0.0)
            return stop.is_set()

        def is_set(self) -> bool:
            return stop.is_set()

    inf = Informer(api, WatchSpec(WORKLOADS), Metrics(), clock=clock, healthy_after=5.0,
                   backoff=Backoff(initial=1.0, cap=30.0))

    def watch(_s: threading.Event) -> None:
        length = next(lengths, None)
        if length is None:
            stop.set()
            return
        clock.t += length  # the server closed the stream cleanly after `length` seconds

    inf.watch_once = watch  # type: ignore[method-assign]
    inf.run(Recorder())
    assert len(waits) == 9  # a delay before every re-watch, also after clean closes
    assert all(w > 0 for w in waits)
    # Growing while streams end at once (1, 2, 4, 8, 16, 30 s ceilings, jittered >= half)...
    assert waits[5] >= 15
    # ...reset after the healthy 10 s stream, then growing again.
    assert waits[6] <= 1.0 and waits[7] <= 2.0


def test_age_counts_from_the_last_list_event_or_healthy_stream() -> None:
    import math

    api = FakeApi()
    clock = Clock()
    inf = Informer(api, WatchSpec(WORKLOADS), Metrics(), clock=clock, healthy_after=5.0)
    assert inf.age() == math.inf  # never listed
    inf.relist()
    clock.t += 30
    assert inf.age() == 30
    inf.apply_event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "1"}}})
    # apply_event alone does not prove freshness; a stream does. Streams that end at once:
    inf._stream_since = inf._last_data = clock.t  # a stream opened now
    clock.t += 1
    assert inf.age() == 31  # not proven healthy yet
    clock.t += 5
    assert inf.age() == 0  # open for 6 s: current
    clock.t += 100  # ...but silent for 106 s (no bookmark; kube-apiserver sends one a minute)
    assert inf.age() == 106
    inf._last_data = clock.t  # a bookmark
    assert inf.age() == 0


def test_fake_watch_stays_open_until_its_timeout_and_ends_on_close() -> None:
    import time

    api = FakeApi(bookmark_every=0.05)
    events = api.stream(WORKLOADS.collection(), query={
        "watch": "1", "resourceVersion": "0", "timeoutSeconds": "1",
        "allowWatchBookmarks": "true"})
    started = time.monotonic()
    kinds = [e["type"] for e in events]
    assert time.monotonic() - started >= 0.9
    assert kinds and set(kinds) == {"BOOKMARK"}
    other = api.stream(WORKLOADS.collection(), query={"watch": "1", "timeoutSeconds": "60"})
    threading.Timer(0.2, api.close).start()
    started = time.monotonic()
    assert list(other) == []
    assert time.monotonic() - started < 5


def decoded(text: str) -> Any:
    """An object as the client hands it over: decoded from its own JSON document."""
    return json.loads(text)


def test_slim_shares_keys_and_short_strings_between_separately_decoded_objects() -> None:
    text = json.dumps(wl("w0"))
    a, b = slim(decoded(text), WORKLOADS, Shared()), slim(decoded(text), WORKLOADS, Shared())
    expected = decoded(text)
    del expected["metadata"]["managedFields"]
    assert a == b == expected  # equal content: only the strings' identity changes
    key_a = next(k for k in a["metadata"] if k == "namespace")
    key_b = next(k for k in b["metadata"] if k == "namespace")
    assert key_a is key_b
    assert a["spec"]["queueName"] is b["spec"]["queueName"]
    assert a["kind"] is b["kind"]
    # Separately decoded documents share nothing without slim.
    c, d = decoded(text), decoded(text)
    assert c["spec"]["queueName"] is not d["spec"]["queueName"]


def test_slim_keeps_long_strings_as_they_came() -> None:
    obj = wl("w0")
    obj["metadata"].setdefault("annotations", {})["note"] = "x" * 200
    text = json.dumps(obj)
    a, b = slim(decoded(text), WORKLOADS, Shared()), slim(decoded(text), WORKLOADS, Shared())
    assert a["metadata"]["annotations"]["note"] == "x" * 200
    assert a["metadata"]["annotations"]["note"] is not b["metadata"]["annotations"]["note"]


def test_slim_keeps_an_object_nested_deeper_than_the_recursion_limit() -> None:
    obj = wl("w0")
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(sys.getrecursionlimit() + 100):
        inner["a"] = {}
        inner = inner["a"]
    obj["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"] = deep
    out = slim(obj, WORKLOADS, Shared())
    assert out is obj  # cached as it came
    assert "managedFields" not in out["metadata"]
    assert out["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"] is deep
