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
* `managedFields` are dropped on arrival: they are most of a Workload's bytes and unused. Of
  a Workload only what the controller reads is kept (`WORKLOAD_FIELDS`): not the rest of its
  pod template, condition messages (but the Evicted condition's: it names the preemptor) or
  `status.resourceRequests`.
* Each object arrives in its own JSON document, so without sharing every Workload holds its
  own copy of every key and of what most Workloads have in common (kinds, queue and flavor
  names, timestamps; pod sets, conditions, admissions). Keys and short strings are interned,
  and equal subtrees are one object (`Shared`, one table per informer, pruned as it goes): at
  50,000 Workloads of `bench/memory_bench.py` the caches hold 42 MiB instead of 186 MiB.
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True, slots=True)
class Keep:
    """The fields of a mapping to keep (each whole, or as its own `Keep` says), or with `each`
    those of every mapping in a list. A value of another shape than described is kept whole,
    as is a mapping without a string under `typed` (the parser quotes such values whole in the
    problems it reports)."""

    fields: Mapping[str, Keep | None]
    each: bool = False
    typed: str = ""
    # More fields to keep of a mapping whose `typed` value is a key here (e.g. the message of
    # one condition type only).
    more: Mapping[str, Mapping[str, Keep | None]] = field(default_factory=dict)


# What the controller reads from a Workload: the parser (`controller.parse.parse_workload`),
# the prompt-cycle check, the owner lookups and the priority patch (`controller.workload`:
# spec.priority, the annotations, whether status and status.admission exist, the UID). The
# rest (the pod template's other fields, condition messages but the Evicted condition's, which
# names the preemptor, status.resourceRequests, ...) is dropped on arrival;
# `tests/unit/test_live_cache.py` checks that the parser reads the same from both.
_CONDITION: Mapping[str, Keep | None] = {
    "type": None, "status": None, "reason": None, "lastTransitionTime": None}
WORKLOAD_FIELDS = Keep({
    "apiVersion": None, "kind": None,
    "metadata": Keep({"name": None, "namespace": None, "uid": None, "resourceVersion": None,
                      "creationTimestamp": None, "labels": None, "annotations": None,
                      "ownerReferences": None}),
    "spec": Keep({
        "queueName": None, "priority": None, "priorityClassRef": None,
        "priorityClassName": None, "priorityClassSource": None, "active": None,
        "podSets": Keep({"name": None, "count": None, "template": Keep({
            "metadata": Keep({"annotations": None}),
            "spec": Keep({"containers": Keep({"name": None, "resources": None}, each=True)}),
        })}, each=True),
    }),
    "status": Keep({
        "conditions": Keep(_CONDITION, each=True, typed="type",
                           more={"Evicted": {**_CONDITION, "message": None}}),
        "admission": None,
    }),
})


def project(value: Any, keep: Keep | None) -> Any:
    """`value` with only the fields `keep` names (new containers where something is dropped;
    what is kept is not copied)."""
    if keep is None:
        return value
    if keep.each:
        if not isinstance(value, list):
            return value
        return [_pick(v, keep) if isinstance(v, dict) else v for v in value]
    return _pick(value, keep) if isinstance(value, dict) else value


def _pick(value: dict[str, Any], keep: Keep) -> dict[str, Any]:
    if keep.typed:
        kind = value.get(keep.typed)
        if not isinstance(kind, str):
            return value
        fields = keep.more.get(kind) or keep.fields
    else:
        fields = keep.fields
    return {k: project(v, fields[k]) for k, v in value.items() if k in fields}


_TRUE, _FALSE = ("true",), ("false",)  # keys of the booleans (True == 1 as a key otherwise)
_UNIQUE = object()  # the key of a subtree that is never shared
# In a mapping with a uid (an object's metadata, an owner reference): values of its own.
_OWN_VALUES = frozenset({"uid", "name", "resourceVersion"})


class Shared:
    """One object for equal subtrees of the objects one informer caches.

    Each object arrives in its own JSON document, so without it every Workload holds its own
    copy of everything it has in common with others: its pod sets, its conditions, its
    admission, its labels and annotations are mostly equal to those of other Workloads of the
    same queue and size. A subtree is shared when it is equal to one seen before, with its
    dict keys in the same order and its values of the same types; a mapping with a `uid`
    (metadata, an owner reference) is one object's own, and so is what holds it. Cached
    objects are never changed (the cache replaces them), which is what makes sharing safe.
    Dict keys and short strings are interned (`sys.intern`) in any case.

    One instance per informer, used by its thread only. `prune` forgets the subtrees no cached
    object holds any more."""

    def __init__(self) -> None:
        self._table: dict[Any, Any] = {}  # key of a subtree -> the one object for it
        self._since_prune = 0  # objects shared since the last prune
        self._kept = 0  # entries the last prune kept

    def __len__(self) -> int:
        return len(self._table)

    def __call__(self, value: Any) -> Any:
        self._since_prune += 1
        return self._one(value)[0]

    def _one(self, value: Any) -> tuple[Any, Any]:
        """(the shared value, its key): the key tells equal subtrees apart by content and
        type; _UNIQUE for one object's own."""
        kind = type(value)
        if kind is str:
            if len(value) <= _SHARED_STRING_MAX:
                value = sys.intern(value)
            return value, value
        if kind is dict:
            out: dict[Any, Any] = {}
            parts: list[Any] = ["{"]
            unique = "uid" in value
            for k, v in value.items():
                if type(k) is str:
                    k = sys.intern(k)
                if unique and k in _OWN_VALUES and type(v) is str:
                    out[k] = v  # never shared: interning it would only cost a table slot
                    continue
                child, key = self._one(v)
                out[k] = child
                if key is _UNIQUE:
                    unique = True
                elif not unique:
                    parts += (k, key)
            return (out, _UNIQUE) if unique else self._find(out, tuple(parts))
        if kind is list:
            items: list[Any] = []
            parts = ["["]
            unique = False
            for v in value:
                child, key = self._one(v)
                items.append(child)
                if key is _UNIQUE:
                    unique = True
                elif not unique:
                    parts.append(key)
            return (items, _UNIQUE) if unique else self._find(items, tuple(parts))
        if kind is bool:
            return value, _TRUE if value else _FALSE
        if kind is int or value is None:
            return value, value
        return value, (kind.__name__, value)  # a float: 1.0 must not share with 1

    def _find(self, value: Any, key: tuple[Any, ...]) -> tuple[Any, Any]:
        table = self._table
        found = table.get(key)
        if found is None:
            table[key] = found = value
        return found, key

    def prune(self) -> None:
        """Forget the subtrees only this table holds. Newest first: a subtree is added after
        the subtrees it holds, so one pass frees a forgotten subtree's parts too."""
        table = self._table
        for key in reversed(list(table)):
            if sys.getrefcount(table[key]) <= 2:  # the table's reference and the argument's
                del table[key]
        self._since_prune, self._kept = 0, len(table)

    def due(self) -> bool:
        """Whether to prune: after as many new objects as the last prune kept entries (at
        least 1,000), so that pruning costs a constant share of the work."""
        return self._since_prune >= max(1000, self._kept)


def slim(obj: JSON, resource: Resource | None, shared: Shared) -> JSON:
    """Drop what the controller never reads and what costs the most memory; name the kind;
    share repeated strings and, through `shared` (the informer's table), equal subtrees with
    the other cached objects.

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
        kept = project(obj, WORKLOAD_FIELDS) if resource and resource.kind == "Workload" else obj
        out: JSON = shared(kept)
    except RecursionError:  # nested deeper than the interpreter allows: keep it as it came
        return obj
    return out


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
        self._shared = Shared()
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
                fresh[object_key(item)] = slim(item, self.spec.resource, self._shared)
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
        del old
        self._shared.prune()
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
        obj = slim(obj, self.spec.resource, self._shared)
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
        if self._shared.due():
            del before, obj
            self._shared.prune()
