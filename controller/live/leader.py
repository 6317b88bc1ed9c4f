"""Leader election with a coordination.k8s.io/v1 Lease (the client-go algorithm), safe by
construction against two writers.

* A replica takes the Lease when it is free (no holder), or when the holder has not renewed
  it for `lease_duration` seconds *as observed locally* (monotonic clock, so clock skew
  between nodes does not matter).
* The leader renews every `retry_period`. A renewal is stamped with the monotonic time taken
  **before** its first request is sent: another replica can only have seen the renewal after
  that moment, so it cannot take the Lease before `stamp + lease_duration`.
* `is_leader()` holds only until `stamp + renew_deadline` (< `lease_duration`), and
  `write_time_left()` is the time left until then: every write carries it as a deadline
  (checked again right before the request goes on the wire, and used as its timeout), so no
  write of ours can be sent once another replica may hold the Lease, even when a request or
  the whole process hangs.
* Lease requests time out after `request_timeout` < `lease_duration - renew_deadline`, so a
  slow apiserver cannot keep a renewal pending across the hand-over window.
* Losing the Lease (renew deadline passed, or someone else holds it) is reported once through
  `on_change(False)`; the controller then exits and lets the Deployment restart it. A lost
  leadership is final for this elector: it never takes the Lease again (its writes in flight
  may still land, so only a fresh process, which starts as a follower, may lead again).
* `release()` (graceful shutdown, after the last write and the history save) empties the
  holder so another replica takes over at its next retry instead of waiting for expiry.
* Every update is a PUT carrying the resourceVersion read: a concurrent update gets 409.
* The Lease also carries annotations the leader wants every replica to agree on (the priority
  mode): `annotations()` is written on every acquire/renew, `observed_annotations` is what the
  last read found.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from controller.live.api import JSON, LEASES, ApiError, Transport
from controller.live.metrics import Metrics

log = logging.getLogger(__name__)


def micro_time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def lease_request_timeout(lease_duration: float, renew_deadline: float,
                          retry_period: float) -> float:
    """Below `lease_duration - renew_deadline` (and no longer than a retry period)."""
    return max(0.2, min(retry_period, 0.8 * (lease_duration - renew_deadline)))


class LeaderElector:
    def __init__(
        self,
        transport: Transport,
        namespace: str,
        name: str,
        identity: str,
        metrics: Metrics,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_change: Callable[[bool], None] | None = None,
        annotations: Callable[[], Mapping[str, str]] | None = None,
        request_timeout: float | None = None,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need RETRY_PERIOD < RENEW_DEADLINE < LEASE_DURATION")
        self._transport = transport
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._metrics = metrics
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.request_timeout = request_timeout or lease_request_timeout(
            lease_duration, renew_deadline, retry_period)
        if self.request_timeout >= lease_duration - renew_deadline:
            raise ValueError("the Lease request timeout must be below "
                             "LEASE_DURATION - RENEW_DEADLINE")
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._annotations = annotations
        self._lock = threading.Lock()
        self._last_renew: float | None = None  # monotonic stamp taken before the renewal
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._leading = False
        self._released = False
        self._lost = False  # leadership lost: never acquire again
        self._release_lock = threading.Lock()
        self.observed_annotations: dict[str, str] = {}
        self.acquired_at: float | None = None  # monotonic time we last became leader

    # -- state ----------------------------------------------------------------------------

    def write_time_left(self) -> float:
        """Seconds during which a write may still be sent (<= 0: not the leader)."""
        with self._lock:
            if not self._leading or self._last_renew is None:
                return 0.0
            return self._last_renew + self.renew_deadline - self._clock()

    def is_leader(self) -> bool:
        return self.write_time_left() > 0

    @property
    def leading(self) -> bool:
        """Leadership as last decided by the election loop (for reporting)."""
        return self._leading

    def _set_leading(self, leading: bool) -> None:
        with self._lock:
            changed = leading != self._leading
            self._leading = leading
            if not leading:
                self._last_renew = None
                self._lost = self._lost or changed
            elif changed:
                self.acquired_at = self._clock()
        self._metrics.is_leader.set(1 if leading else 0)
        if changed:
            log.info(
                "%s leadership of Lease %s/%s (%s)",
                "acquired" if leading else "lost", self.namespace, self.name, self.identity,
            )
            if self._on_change is not None:
                self._on_change(leading)

    # -- one attempt ----------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        return self._transport.request(method, path, body=body, timeout=self.request_timeout)

    def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, take or renew it if allowed. True if we hold it now."""
        if self._released or self._lost:
            return False
        stamp = self._clock()  # before anything is sent: see the module docstring
        path = LEASES.item(self.name, self.namespace)
        try:
            lease: JSON | None = self._request("GET", path)
        except ApiError as e:
            if e.status != 404:
                raise
            lease = None
        now = self._wall()
        if lease is None:
            body = self._new_lease(now)
            self._request("POST", LEASES.collection(self.namespace), body)
            self._renewed(stamp)
            return True
        meta: dict[str, Any] = lease.setdefault("metadata", {})
        self.observed_annotations = dict(meta.get("annotations") or {})
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self._observe(holder, str(spec.get("renewTime") or ""))
        if holder and holder != self.identity and not self._expired(spec):
            return False
        if holder == self.identity and not self._leading:
            # Our own identity from an earlier life of this object (a leadership we lost):
            # take it again like any other, as a transition.
            holder = ""
        new_spec = dict(spec)
        if holder != self.identity:
            new_spec["acquireTime"] = micro_time(now)
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        new_spec["holderIdentity"] = self.identity
        new_spec["leaseDurationSeconds"] = round(self.lease_duration)
        new_spec["renewTime"] = micro_time(now)
        lease["spec"] = new_spec
        wanted = dict(self._annotations() if self._annotations else {})
        if wanted and any(self.observed_annotations.get(k) != v for k, v in wanted.items()):
            meta["annotations"] = {**self.observed_annotations, **wanted}
        self._request("PUT", path, lease)  # carries resourceVersion: 409 on race
        self._renewed(stamp)
        return True

    def _new_lease(self, now: datetime) -> JSON:
        meta: JSON = {"name": self.name, "namespace": self.namespace}
        wanted = dict(self._annotations() if self._annotations else {})
        if wanted:
            meta["annotations"] = wanted
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": round(self.lease_duration),
                "acquireTime": micro_time(now),
                "renewTime": micro_time(now),
                "leaseTransitions": 0,
            },
        }

    def _observe(self, holder: str, renew_time: str) -> None:
        record = (holder, renew_time)
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()

    def _expired(self, spec: JSON) -> bool:
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        return self._clock() - self._observed_at > duration

    def _renewed(self, stamp: float) -> None:
        with self._lock:
            if self._released or self._lost:
                return
            self._last_renew = stamp
        self._set_leading(True)

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Acquire, then renew, until `stop`. Does not release: the owner calls `release()`
        once its last write is done (see the runner's shutdown)."""
        rng = random.Random()
        while not stop.is_set():
            try:
                held = self.try_acquire_or_renew()
            except ApiError as e:
                self._metrics.api_errors.labels(e.code_label).inc()
                log.warning("Lease %s/%s: %s", self.namespace, self.name, e)
                held = False
            if stop.is_set():
                break
            if not held and self._leading and not self.is_leader():
                self._set_leading(False)  # renew deadline passed
            elif not held and self._leading and self._observed and (
                self._observed[0] not in ("", self.identity)
            ):
                self._set_leading(False)  # someone else holds it now
            # client-go jitters the retry of non-leaders by up to 20 %.
            wait = self.retry_period * (1.0 if self._leading else rng.uniform(1.0, 1.2))
            if self._leading:
                # Never sleep past the renew deadline without noticing it.
                wait = max(0.05, min(wait, self.write_time_left()))
            stop.wait(wait)
            if self._leading and not self.is_leader() and not stop.is_set():
                self._set_leading(False)

    def release(self) -> bool:
        """Give the Lease up (graceful shutdown), so the next replica takes over at once.
        From the first line on, no write of ours passes the guard. True if released."""
        with self._release_lock:
            with self._lock:
                self._released = True
                was_leading = self._leading
                self._leading = False
                self._last_renew = None
            self._metrics.is_leader.set(0)
            if not was_leading:
                return False
            path = LEASES.item(self.name, self.namespace)
            for _ in range(3):  # a 409 means our own renew raced us: read again
                try:
                    lease: JSON = self._request("GET", path)
                    spec = lease.get("spec") or {}
                    if spec.get("holderIdentity") != self.identity:
                        return False
                    spec["holderIdentity"] = ""
                    spec["leaseDurationSeconds"] = 1
                    spec["renewTime"] = micro_time(self._wall())
                    lease["spec"] = spec
                    self._request("PUT", path, lease)
                    log.info("released Lease %s/%s", self.namespace, self.name)
                    return True
                except ApiError as e:
                    if e.status != 409:
                        log.warning("could not release Lease %s/%s: %s",
                                    self.namespace, self.name, e)
                        return False
            return False
