"""Leader election with a coordination.k8s.io/v1 Lease (the client-go algorithm, simplified).

* A replica takes the Lease when it is free (no holder), or when the holder has not renewed
  it for `lease_duration` seconds *as observed locally* (monotonic clock, so clock skew
  between nodes does not matter).
* The leader renews every `retry_period`. `is_leader()` is true only while the last successful
  renew is younger than `renew_deadline` (< `lease_duration`): a leader cut off from the
  apiserver stops writing before anyone else may take over, so two replicas never write at
  once.
* `release()` on graceful shutdown empties the holder so another replica takes over at its
  next retry instead of waiting for the Lease to expire.
* Every update is a PUT carrying the resourceVersion read: a concurrent update gets 409.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from controller.live.api import JSON, LEASES, ApiError, Transport
from controller.live.metrics import Metrics

log = logging.getLogger(__name__)


def micro_time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


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
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._lock = threading.Lock()
        self._last_renew: float | None = None  # monotonic time of our last successful write
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._leading = False
        self._release_lock = threading.Lock()

    # -- state ----------------------------------------------------------------------------

    def is_leader(self) -> bool:
        with self._lock:
            return (
                self._leading
                and self._last_renew is not None
                and self._clock() - self._last_renew < self.renew_deadline
            )

    def _set_leading(self, leading: bool) -> None:
        with self._lock:
            changed = leading != self._leading
            self._leading = leading
            if not leading:
                self._last_renew = None
        self._metrics.is_leader.set(1 if leading else 0)
        if changed:
            log.info(
                "%s leadership of Lease %s/%s (%s)",
                "acquired" if leading else "lost", self.namespace, self.name, self.identity,
            )
            if self._on_change is not None:
                self._on_change(leading)

    # -- one attempt ----------------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, take or renew it if allowed. True if we hold it now."""
        path = LEASES.item(self.name, self.namespace)
        try:
            lease: JSON | None = self._transport.request("GET", path)
        except ApiError as e:
            if e.status != 404:
                raise
            lease = None
        now = self._wall()
        if lease is None:
            self._transport.request(
                "POST", LEASES.collection(self.namespace), body=self._new_lease(now)
            )
            self._renewed()
            return True
        spec: dict[str, Any] = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self._observe(holder, str(spec.get("renewTime") or ""))
        if holder and holder != self.identity and not self._expired(spec):
            return False
        new_spec = dict(spec)
        if holder != self.identity:
            new_spec["acquireTime"] = micro_time(now)
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        new_spec["holderIdentity"] = self.identity
        new_spec["leaseDurationSeconds"] = round(self.lease_duration)
        new_spec["renewTime"] = micro_time(now)
        lease["spec"] = new_spec
        self._transport.request("PUT", path, body=lease)  # carries resourceVersion: 409 on race
        self._renewed()
        return True

    def _new_lease(self, now: datetime) -> JSON:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
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

    def _renewed(self) -> None:
        with self._lock:
            self._last_renew = self._clock()
        self._set_leading(True)

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Acquire, then renew, until `stop`; then release if leading."""
        rng = random.Random()
        while not stop.is_set():
            try:
                held = self.try_acquire_or_renew()
            except ApiError as e:
                self._metrics.api_errors.labels(e.code_label).inc()
                log.warning("Lease %s/%s: %s", self.namespace, self.name, e)
                held = False
            if not held and self._leading and not self.is_leader():
                self._set_leading(False)  # renew deadline passed
            elif not held and self._leading and self._observed and (
                self._observed[0] not in ("", self.identity)
            ):
                self._set_leading(False)  # someone else holds it now
            # client-go jitters the retry of non-leaders by up to 20 %.
            wait = self.retry_period * (1.0 if self._leading else rng.uniform(1.0, 1.2))
            stop.wait(wait)
        self.release()

    def release(self) -> None:
        """Give the Lease up (graceful shutdown), so the next replica takes over at once."""
        with self._release_lock:
            if not self._leading:
                return
            # Stop writing first: from here on `is_leader()` is false.
            self._set_leading(False)
            path = LEASES.item(self.name, self.namespace)
            for _ in range(3):  # a 409 means our own renew raced us: read again
                try:
                    lease: JSON = self._transport.request("GET", path)
                    spec = lease.get("spec") or {}
                    if spec.get("holderIdentity") != self.identity:
                        return
                    spec["holderIdentity"] = ""
                    spec["leaseDurationSeconds"] = 1
                    spec["renewTime"] = micro_time(self._wall())
                    lease["spec"] = spec
                    self._transport.request("PUT", path, body=lease)
                    log.info("released Lease %s/%s", self.namespace, self.name)
                    return
                except ApiError as e:
                    if e.status != 409:
                        log.warning("could not release Lease %s/%s: %s",
                                    self.namespace, self.name, e)
                        return
