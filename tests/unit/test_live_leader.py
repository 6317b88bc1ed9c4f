"""Lease leader election: one holder, takeover after expiry, release, renew deadline."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from controller.live.api import LEASES, GuardedTransport, WriteRefused
from controller.live.leader import LeaderElector
from controller.live.metrics import Metrics
from tests.support.fake import FakeApi


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(api: FakeApi, ident: str, clock: Clock) -> LeaderElector:
    return LeaderElector(api, "kueue-system", "wdrf", ident, Metrics(), lease_duration=15,
                         renew_deadline=10, retry_period=2, clock=clock)


def test_first_replica_creates_the_lease_second_waits() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew() and a.is_leader()
    assert not b.try_acquire_or_renew() and not b.is_leader()
    lease = api.get_object(LEASES.item("wdrf", "kueue-system"))
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"


def test_takeover_only_after_the_lease_expired_as_observed_locally() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.t += 14  # a died; not expired yet for b
    assert not b.try_acquire_or_renew()
    clock.t += 2
    assert b.try_acquire_or_renew() and b.is_leader()
    # The old leader stopped considering itself leader long before (renew deadline 10 s).
    assert not a.is_leader()
    lease = api.get_object(LEASES.item("wdrf", "kueue-system"))
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1


def test_renewing_holder_keeps_the_lease() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    a.try_acquire_or_renew()
    for _ in range(20):
        clock.t += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert a.is_leader()


def test_release_hands_over_immediately() -> None:
    api, clock = FakeApi(), Clock()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader()
    assert b.try_acquire_or_renew()


def test_concurrent_takeover_loses_with_409() -> None:
    api, clock = FakeApi(), Clock()
    a, b, c = (elector(api, n, clock) for n in "abc")
    a.try_acquire_or_renew()
    a.release()
    assert not a.try_acquire_or_renew()  # released for good: this replica is shutting down
    # b read the released lease, then c acquired before b wrote: b's PUT carries a stale rv.
    original = api.request

    def racing(method: str, path: str, **kw: object) -> object:
        out = original(method, path, **kw)  # type: ignore[arg-type]
        if method == "GET" and "leases" in path:
            api.request = original  # type: ignore[method-assign]
            c.try_acquire_or_renew()
        return out

    api.request = racing  # type: ignore[method-assign]
    with pytest.raises(Exception, match="409"):
        b.try_acquire_or_renew()
    assert not b.is_leader() and c.is_leader()


def test_guarded_transport_writes_only_while_leader() -> None:
    api, clock = FakeApi(), Clock()
    a = elector(api, "a", clock)
    guarded = GuardedTransport(api, a.is_leader, "not the leader")
    with pytest.raises(WriteRefused):
        guarded.request("POST", "/api/v1/namespaces/ns/events", body={"metadata": {"name": "e"}})
    a.try_acquire_or_renew()
    guarded.request("POST", "/api/v1/namespaces/ns/events", body={"metadata": {"name": "e"}})
    clock.t += 11  # could not renew within the renew deadline
    with pytest.raises(WriteRefused):
        guarded.request("POST", "/api/v1/namespaces/ns/events", body={"metadata": {"name": "f"}})


def test_invalid_timing_is_rejected() -> None:
    with pytest.raises(ValueError):
        LeaderElector(FakeApi(), "ns", "l", "a", Metrics(), lease_duration=10,
                      renew_deadline=10, retry_period=2)


class SlowApi(FakeApi):
    """Answers Lease requests `delay` seconds (of the test clock) late."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.delay = 0.0
        self.timeouts: list[float | None] = []

    def request(self, method: str, path: str, **kw: Any) -> Any:
        self.timeouts.append(kw.get("timeout"))
        out = super().request(method, path, **kw)
        self.clock.t += self.delay
        return out


def test_renewal_is_stamped_before_it_is_sent_so_a_late_answer_cannot_extend_leadership() -> None:
    clock = Clock()
    api = SlowApi(clock)
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b saw the renewal at t0
    t0 = clock.t
    api.delay = 4.5  # the GET and the PUT each answered 4.5 s late: 9 s for the renewal
    assert a.try_acquire_or_renew()
    # Stamped when the renewal started (t0), not when it returned (t0 + 9): 1 s left, not 10.
    assert a.write_time_left() == pytest.approx(t0 + 10 - clock.t)
    clock.t = t0 + 10
    assert not a.is_leader()
    # Whenever b could take over (15 s after it last saw a renewal), a has long stopped.
    api.delay = 0.0
    assert a.write_time_left() <= 0


def test_lease_requests_time_out_before_the_handover_window() -> None:
    clock = Clock()
    api = SlowApi(clock)
    a = elector(api, "a", clock)
    a.try_acquire_or_renew()
    assert api.timeouts and all(t is not None and t < 15 - 10 for t in api.timeouts)
    with pytest.raises(ValueError):
        LeaderElector(FakeApi(), "ns", "l", "a", Metrics(), lease_duration=15,
                      renew_deadline=10, retry_period=2, request_timeout=5)


def test_writes_carry_the_time_left_as_deadline() -> None:
    from controller.live.api import WRITE_DEADLINE

    api, clock = FakeApi(), Clock()
    a = elector(api, "a", clock)
    seen: list[float | None] = []
    inner_request = api.request

    def spy(method: str, path: str, **kw: Any) -> Any:
        seen.append(kw.get("timeout"))
        assert WRITE_DEADLINE.get() is not None
        return inner_request(method, path, **kw)

    a.try_acquire_or_renew()
    api.request = spy  # type: ignore[method-assign]
    guarded = GuardedTransport(api, a.write_time_left, "not the leader")
    clock.t += 7  # renewed 7 s ago: 3 s left
    guarded.request("POST", "/api/v1/namespaces/ns/events", body={"metadata": {"name": "e"}})
    assert seen == [pytest.approx(3.0)]
    assert WRITE_DEADLINE.get() is None


def test_write_past_its_deadline_is_refused_at_the_bottom_of_the_stack() -> None:
    import time

    from controller.live.api import WRITE_DEADLINE, write_time_left

    token = WRITE_DEADLINE.set(time.monotonic() - 0.001)  # e.g. the process was paused
    try:
        with pytest.raises(WriteRefused, match="deadline"):
            write_time_left("PATCH", "/apis/x")
        assert write_time_left("GET", "/apis/x") is None  # reads are never refused
    finally:
        WRITE_DEADLINE.reset(token)


def test_losing_the_lease_is_reported_once_and_release_is_not_a_loss() -> None:
    api, clock = FakeApi(), Clock()
    changes: list[bool] = []
    a = LeaderElector(api, "kueue-system", "wdrf", "a", Metrics(), 15, 10, 2, clock=clock,
                      on_change=changes.append)
    stop = threading.Event()
    a.try_acquire_or_renew()
    api.fail("GET", "leases", 500, times=100)
    clock.t += 11  # no renewal within the renew deadline

    class OneRound(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            stop.set()
            return True

        def is_set(self) -> bool:
            return stop.is_set()

    a.run(OneRound())
    assert changes == [True, False]
    b = LeaderElector(FakeApi(), "kueue-system", "wdrf", "b", Metrics(), 15, 10, 2,
                      clock=clock, on_change=changes.append)
    b.try_acquire_or_renew()
    b.release()
    assert changes == [True, False, True]  # a release is not reported as a loss


def test_the_leader_records_annotations_on_the_lease_for_the_others() -> None:
    api, clock = FakeApi(), Clock()
    a = LeaderElector(api, "kueue-system", "wdrf", "a", Metrics(), 15, 10, 2, clock=clock,
                      annotations=lambda: {"wdrf.x-k8s.io/priority-mode": "boost"})
    b = elector(api, "b", clock)
    a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert b.observed_annotations == {"wdrf.x-k8s.io/priority-mode": "boost"}


def test_a_lost_leadership_is_never_reacquired_by_the_same_elector() -> None:
    """After an outage that cost the Lease (renew deadline passed), the apiserver answers
    again with our own identity still on the Lease: the elector does not take it back (its
    writes sent before the loss may still land), and its release writes nothing."""
    api, clock = FakeApi(), Clock()
    changes: list[bool] = []
    a = LeaderElector(api, "kueue-system", "wdrf", "a", Metrics(), 15, 10, 2, clock=clock,
                      on_change=changes.append)
    assert a.try_acquire_or_renew()
    api.fail("GET", "leases", 500, times=3)
    clock.t += 11
    rounds = iter(range(5))
    done = threading.Event()

    class FewRounds(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            clock.t += 2
            if next(rounds, None) is None:
                done.set()
            return done.is_set()

        def is_set(self) -> bool:
            return done.is_set()

    a.run(FewRounds())  # the apiserver is back after 3 rounds; 2 more rounds follow
    assert changes == [True, False]
    assert not a.try_acquire_or_renew() and not a.is_leader()
    lease = api.get_object(LEASES.item("wdrf", "kueue-system"))
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"  # as it was left
    version = lease["metadata"].get("resourceVersion")
    assert not a.release()
    lease = api.get_object(LEASES.item("wdrf", "kueue-system"))
    assert lease is not None and lease["metadata"].get("resourceVersion") == version
