"""Lease leader election: one holder, takeover after expiry, release, renew deadline."""

from __future__ import annotations

import pytest

from controller.live.api import LEASES, GuardedTransport, WriteRefused
from tests.support.fake import FakeApi
from controller.live.leader import LeaderElector
from controller.live.metrics import Metrics


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
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    a.try_acquire_or_renew()
    a.release()
    # b read the released lease, then a re-acquired before b wrote: b's PUT carries a stale rv.
    original = api.request

    def racing(method: str, path: str, **kw: object) -> object:
        out = original(method, path, **kw)  # type: ignore[arg-type]
        if method == "GET" and "leases" in path:
            api.request = original  # type: ignore[method-assign]
            a.try_acquire_or_renew()
        return out

    api.request = racing  # type: ignore[method-assign]
    with pytest.raises(Exception, match="409"):
        b.try_acquire_or_renew()
    assert not b.is_leader() and a.is_leader()


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
