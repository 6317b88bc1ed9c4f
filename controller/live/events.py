"""Kubernetes Events (core/v1) so `kubectl describe` answers "why this priority".

Which writes give an Event is decided elsewhere (`outcomes`: a class, override or reclaim
change, a refused value, a failed write; never an encoding change alone). Here: the limits,
and Event failures are logged and counted, never raised: an Event is never worth a failed
cycle.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from cachetools import TTLCache

from controller.domain import ObjectRef
from controller.live.api import EVENTS, ApiError, Transport, WriteRefused
from controller.live.metrics import Metrics

log = logging.getLogger(__name__)

COMPONENT = "wdrf-controller"
MAX_MESSAGE = 1024


def event_body(
    ref: ObjectRef, type_: str, reason: str, message: str, now: datetime, instance: str
) -> dict[str, object]:
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    namespace = ref.namespace or "default"
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{ref.name}.", "namespace": namespace},
        "involvedObject": {
            "kind": ref.kind,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
            "apiVersion": ref.api_version,
        },
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    """Sends Events under two limits, as client-go's event correlator does for Kubernetes'
    own components: a per-object one (at most one Event of a reason on an object per
    `per_object` seconds, whatever its message) and an overall one (at most `qps` Events in
    any one second, all at once if need be: a Workload's Event and its Job's come together).
    An Event over either limit is dropped and counted, never queued: the priority-terms
    annotation stays the per-Workload record, and findings seen every cycle come back."""

    def __init__(
        self,
        transport: Transport,
        metrics: Metrics,
        per_object: float,
        qps: float = 10.0,
        instance: str = COMPONENT,
        maxsize: int = 200_000,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._transport = transport
        self._metrics = metrics
        # An object leaves the cache when its interval is over: memory follows the objects
        # that had an Event in the last interval, not every object ever seen.
        self._sent: TTLCache[tuple[str, str], bool] | None = TTLCache(
            maxsize=maxsize, ttl=per_object, timer=clock) if per_object > 0 else None
        # The send times of the last `_window_events` Events: one more is allowed when the
        # oldest of them is a window ago.
        self._window_events = max(1, math.floor(qps)) if qps > 0 else 0
        self._window = self._window_events / qps if qps > 0 else 0.0
        self._recent: deque[float] = deque(maxlen=max(1, self._window_events))
        self._clock = clock
        self._lock = threading.Lock()
        self._instance = instance
        self._now = now

    def emit(self, ref: ObjectRef, reason: str, message: str, type_: str = "Normal") -> bool:
        """Create the Event unless a limit says no. True if sent."""
        key = (ref.uid or f"{ref.kind}/{ref.namespace}/{ref.name}", reason)
        with self._lock:
            if self._sent is not None and key in self._sent:
                self._metrics.events.labels(reason, "suppressed").inc()
                return False
            if not self._overall_allows():
                self._metrics.events.labels(reason, "throttled").inc()
                return False
            if self._sent is not None:  # claimed before sending: concurrent emits race here
                self._sent[key] = True
        body = event_body(ref, type_, reason, message, self._now(), self._instance)
        try:
            self._transport.request(
                "POST", EVENTS.collection(ref.namespace or "default"), body=body
            )
        except WriteRefused:
            self._forget(key)
            self._metrics.events.labels(reason, "refused").inc()
            return False
        except ApiError as e:
            self._forget(key)
            self._metrics.events.labels(reason, "failed").inc()
            self._metrics.api_errors.labels(e.code_label).inc()
            log.warning("could not record Event %s on %s: %s", reason, ref, e)
            return False
        self._metrics.events.labels(reason, "sent").inc()
        return True

    def _overall_allows(self) -> bool:
        """Take a place in the overall window (called with the lock held)."""
        if not self._window_events:
            return True
        now = self._clock()
        if len(self._recent) == self._window_events and now - self._recent[0] < self._window:
            return False
        self._recent.append(now)
        return True

    def _forget(self, key: tuple[str, str]) -> None:
        """An Event that was not created does not use the object's allowance."""
        with self._lock:
            if self._sent is not None:
                self._sent.pop(key, None)
