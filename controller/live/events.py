"""Kubernetes Events (core/v1) so `kubectl describe` answers "why this priority".

Rate-limited with a TTL cache: the same (object, reason, key) gives at most one Event per
`ttl` seconds, so a bad annotation that is seen every cycle is reported once per interval.
Event failures are logged and counted, never raised: an Event is never worth a failed cycle.
"""

from __future__ import annotations

import logging
import threading
import time
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
    def __init__(
        self,
        transport: Transport,
        metrics: Metrics,
        ttl: float,
        instance: str = COMPONENT,
        maxsize: int = 50_000,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._transport = transport
        self._metrics = metrics
        self._seen: TTLCache[tuple[str, str, str], bool] = TTLCache(
            maxsize=maxsize, ttl=max(ttl, 0.001), timer=clock
        )
        self._lock = threading.Lock()
        self._instance = instance
        self._now = now

    def emit(
        self,
        ref: ObjectRef,
        reason: str,
        message: str,
        type_: str = "Normal",
        dedupe: str | None = None,
    ) -> bool:
        """Create the Event unless an equal one was sent within the TTL. True if sent.

        `dedupe` replaces the message in the rate-limit key (e.g. one "PriorityChanged" per
        interval whatever the values)."""
        key = (ref.uid or f"{ref.kind}/{ref.namespace}/{ref.name}", reason,
               message if dedupe is None else dedupe)
        with self._lock:
            if key in self._seen:
                self._metrics.events.labels(reason, "suppressed").inc()
                return False
        body = event_body(ref, type_, reason, message, self._now(), self._instance)
        try:
            self._transport.request(
                "POST", EVENTS.collection(ref.namespace or "default"), body=body
            )
        except WriteRefused:
            self._metrics.events.labels(reason, "refused").inc()
            return False
        except ApiError as e:
            self._metrics.events.labels(reason, "failed").inc()
            self._metrics.api_errors.labels(e.code_label).inc()
            log.warning("could not record Event %s on %s: %s", reason, ref, e)
            return False
        with self._lock:
            self._seen[key] = True
        self._metrics.events.labels(reason, "sent").inc()
        return True
