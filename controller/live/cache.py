"""Informer-style caches: one LIST, then a WATCH that resumes from the last resourceVersion.

* The LIST is paginated and happens at start-up and after `410 Gone` (or when a watch cannot
  resume), never once per cycle.
* Watches ask for bookmarks, so the resourceVersion to resume from stays fresh.
* Every re-watch waits a backoff delay with jitter (also after a watch the server closed
  cleanly: a stream that ends at once must not become a request loop); the backoff is reset
  only after a healthy stream (one that stayed open `healthy_after` seconds). Every restart is
  counted in `wdrf_watch_restarts_total{resource,reason}`.
* `age()`: seconds since the cache was last known to be current: a LIST, or a watch stream
  that has stayed open `healthy_after` seconds (an event on a stream that then breaks proves
  nothing about what came after it) and is not silent: kube-apiserver sends a bookmark
  roughly every minute, so a stream with no event or bookmark for `silent_after` (90 s) counts
  as current only up to its last one (a connection that died without a FIN). The runner
  pauses writes and reports not-ready when the Workload or ClusterQueue cache is older than
  CACHE_MAX_STALENESS.
* `managedFields` are dropped on arrival: they are most of a Workload's bytes and unused.
* Keys and short string values of every cached object are interned: each object arrives in its
  own JSON document, so without it every Workload holds its own copy of every key and of
  values most Workloads share (kinds, queue and flavor names, condition types, timestamps);
  at 50,000 Workloads that halves the cache (about 220 to 110 MiB).
* Every change is reported to `on_event(kind, old, new)` (old None = added, new None =
  deleted), so the runner can start a cycle promptly after an urgent arrival.
"""

from __future__ import annotations

import logging
import math
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from controller.live.api import JSON, ApiError, Resource, Transport
from controller.live.backoff import Backoff
from controller.live.metrics import Metrics

log = logging.getLogger(__name__)

EventHandler = Callable[[str, JSON | None, JSON | None], None]


class Gone(Exception):
    """The resourceVersion we resume from is too old: relist."""


@dataclass(frozen=True, slots=True)
class WatchSpec:
    resource: Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    def query(self) -> dict[str, str]:
        q: dict[str, str] = {}
        if self.label_selector:
            q["labelSelector"] = self.label_selector
        if self.field_selector:
            q["fieldSelector"] = self.field_selector
        return q


def object_key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def resource_version(obj: JSON | None) -> str:
    if not obj:
        return ""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


# Longer strings (messages, annotations' payloads) are rarely shared between objects.
_SHARED_STRING_MAX = 64


def _shared(value: Any) -> Any:
    """`value` with its dict keys and short strings interned (equal content, new containers)."""
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: _shared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shared(v) for v in value]
    if isinstance(value, str) and len(value) <= _SHARED_STRING_MAX:
        return sys.intern(value)
    return value


def slim(obj: JSON, resource: Resource | None = None) -> JSON:
    """Drop what the controller never reads and what costs the most memory; name the kind;
    share repeated strings with the other cached objects.

    Items of a LIST of built-in types carry no apiVersion/kind: set them from the resource.
    """
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    if resource is not None:
        obj.setdefault("apiVersion", resource.api_version)
        obj.setdefault("kind", resource.kind)
        if resource.kind == "Node" and isinstance(obj.get("status"), dict):
            obj["status"].pop("images", None)
    try:
        shared: JSON = _shared(obj)
    except RecursionError:  # nested deeper than the interpreter allows: keep it as it came
        return obj
    return shared


class Informer:
    """A LIST + WATCH kept cache of one resource (optionally one namespace / selector)."""

    def __init__(
        self,
        transport: Transport,
        spec: WatchSpec,
        metrics: Metrics,
        on_event: EventHandler | None = None,
        page_size: int = 500,
        watch_timeout: float = 300.0,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        healthy_after: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        silent_after: float = 90.0,
    ) -> None:
        self._transport = transport
        self.spec = spec
        self._metrics = metrics
        self._on_event = on_event
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._backoff = backoff or Backoff(initial=0.5, cap=30.0)
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._items: dict[str, JSON] = {}
        self._synced = threading.Event()
        self.resource_version = ""
        self.name = spec.resource.plural
        self._healthy_after = healthy_after
        self._clock = clock
        self._fresh_at: float | None = None  # last LIST, or end of a healthy stream
        self._stream_since: float | None = None  # when the open watch stream started
        self._last_data = 0.0  # last event or bookmark on the open stream (or its start)
        self._silent_after = silent_after

    # -- reading --------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        return self._synced.wait(timeout)

    def age(self) -> float:
        """Seconds since this cache was last known to be current (inf before the first
        LIST). 0 while a watch stream has been open for `healthy_after` seconds."""
        now = self._clock()
        with self._lock:
            since = self._stream_since
            if since is not None and now - since >= self._healthy_after:
                silent = now - self._last_data
                # Current up to its last event or bookmark when it has gone silent.
                return 0.0 if silent <= self._silent_after else silent
            return math.inf if self._fresh_at is None else max(0.0, now - self._fresh_at)

    def items(self) -> list[JSON]:
        with self._lock:
            return list(self._items.values())

    def get(self, key: str) -> JSON | None:
        with self._lock:
            return self._items.get(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """LIST, then WATCH until `stop`; relist only when the watch cannot resume. Every
        re-watch waits a backoff delay; the backoff resets only after a healthy stream."""
        need_list = True
        while not stop.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                started = self._clock()
                self.watch_once(stop)
                if self._clock() - started >= self._healthy_after:
                    self._backoff.reset()
                self._restart("closed")
            except Gone:
                self._restart("gone")
                need_list = True
            except ApiError as e:
                if stop.is_set():
                    break
                self._metrics.api_errors.labels(e.code_label).inc()
                self._restart("error")
                if e.status == 410:
                    need_list = True
                log.warning(
                    "watch %s failed (%s)", self.name, e,
                    extra={"resource": self.name, "code": e.code_label},
                )
            except Exception:  # a bug must not kill the thread silently
                log.exception("watch %s crashed; relisting", self.name)
                self._restart("error")
                need_list = True
            if stop.is_set():
                break
            delay = self._backoff.next()
            log.debug("re-watching %s in %.2fs", self.name, delay)
            stop.wait(delay)

    def _restart(self, reason: str) -> None:
        self._metrics.watch_restarts.labels(self.name, reason).inc()

    def relist(self) -> None:
        """Paginated LIST; replaces the cache and reports the differences as events."""
        fresh: dict[str, JSON] = {}
        rv = ""
        token = ""
        path = self.spec.resource.collection(self.spec.namespace)
        while True:
            query = {**self.spec.query(), "limit": str(self._page_size)}
            if token:
                query["continue"] = token
            try:
                page = self._transport.request("GET", path, query=query)
            except ApiError as e:
                if e.status == 410 and token:
                    # The continue token expired mid-list: start over.
                    fresh, token = {}, ""
                    continue
                raise
            for item in page.get("items") or []:
                fresh[object_key(item)] = slim(item, self.spec.resource)
            meta = page.get("metadata") or {}
            rv = str(meta.get("resourceVersion", ""))
            token = str(meta.get("continue") or "")
            if not token:
                break
        self._metrics.relists.labels(self.name).inc()
        with self._lock:
            old = self._items
            self._items = fresh
            self.resource_version = rv
            self._fresh_at = self._clock()
        self._synced.set()
        self._report_relist(old, fresh)
        log.debug("listed %d %s at rv %s", len(fresh), self.name, rv)

    def _report_relist(self, old: dict[str, JSON], fresh: dict[str, JSON]) -> None:
        if self._on_event is None:
            return
        kind = self.spec.resource.kind
        for key, obj in fresh.items():
            before = old.get(key)
            if resource_version(before) != resource_version(obj):
                self._on_event(kind, before, obj)
        for key, obj in old.items():
            if key not in fresh:
                self._on_event(kind, obj, None)

    def watch_once(self, stop: threading.Event) -> None:
        """One WATCH request from the current resourceVersion until the server ends it."""
        # Randomized like client-go, so many watches do not all end at the same moment.
        timeout = max(1, int(self._watch_timeout * self._rng.uniform(1.0, 2.0)))
        query = {
            **self.spec.query(),
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version,
            "timeoutSeconds": str(timeout),
        }
        events: Iterator[JSON] = self._transport.stream(
            self.spec.resource.collection(self.spec.namespace), query=query, timeout=timeout
        )
        with self._lock:
            self._stream_since = self._last_data = self._clock()
        try:
            for event in events:
                if stop.is_set():
                    return
                self.apply_event(event)
                with self._lock:
                    self._last_data = self._clock()
        finally:
            now = self._clock()
            with self._lock:
                since, self._stream_since = self._stream_since, None
                if since is not None and now - since >= self._healthy_after:
                    # Current up to the end of the stream, or its last data if it went silent.
                    silent = now - self._last_data > self._silent_after
                    self._fresh_at = max(self._fresh_at or 0.0,
                                         self._last_data if silent else now)

    def apply_event(self, event: JSON) -> None:
        kind = str(event.get("type", ""))
        obj: Any = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code", 0) or 0)
            if code == 410:
                raise Gone(str(obj.get("message", "")))
            raise ApiError(code, str(obj.get("reason", "WatchError")), str(obj.get("message", "")))
        rv = resource_version(obj)
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.debug("ignoring watch event type %r for %s", kind, self.name)
            return
        key = object_key(obj)
        obj = slim(obj, self.spec.resource)
        with self._lock:
            before = self._items.get(key)
            if kind == "DELETED":
                self._items.pop(key, None)
            else:
                self._items[key] = obj
            if rv:
                self.resource_version = rv
        if self._on_event is not None:
            self._on_event(self.spec.resource.kind, before, None if kind == "DELETED" else obj)
