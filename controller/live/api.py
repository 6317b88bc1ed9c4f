"""The controller's view of the Kubernetes API: a tiny transport protocol plus wrappers.

Nothing here imports the `kubernetes` client (that lives in `controller.live.kube`), so
everything above the transport is testable with an in-memory fake.

Every request goes through one `Transport.request` / `Transport.stream` pair; the wrappers
below use that single choke point to enforce policies structurally:

* `ReadOnlyTransport` refuses every method but GET (dry run: no patch, Event or Lease).
* `CountingTransport` counts requests by method and path class (tests and the benchmark).
* `GuardedTransport` lets writes through only while a predicate holds (only the leader writes),
  and gives each write a deadline (`WRITE_DEADLINE`, checked again by the bottom transport
  right before the request goes on the wire, and used as its timeout).
* `RateLimitedTransport`: a client-side token bucket (QPS + burst) for every request but
  watches.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from controller.domain import KUEUE_GROUP

JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# Monotonic time (time.monotonic) after which the write being sent in this thread must not
# leave the process; set by `GuardedTransport`, enforced by the bottom transport just before
# sending (so a write that waited anywhere in between, e.g. behind the rate limiter or in a
# paused process, is refused instead of landing late).
WRITE_DEADLINE: ContextVar[float | None] = ContextVar("wdrf_write_deadline", default=None)


def write_time_left(method: str, path: str) -> float | None:
    """Seconds left before the current write's deadline (None: no deadline); raises
    `WriteRefused` when it has passed. Called by transports right before sending."""
    deadline = WRITE_DEADLINE.get()
    if deadline is None or method.upper() == "GET":
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise WriteRefused("write deadline passed (leadership not renewed in time)",
                           method.upper(), path)
    return left


class ApiError(Exception):
    """A failed API call. `status` 0 means no HTTP answer (connection refused, timeout)."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:300]}" if body else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def message(self) -> str:
        """The apiserver's `Status.message` when the body is a Status, else the raw body."""
        try:
            parsed = json.loads(self.body)
        except (ValueError, TypeError):
            return self.body
        if isinstance(parsed, dict):
            return str(parsed.get("message", self.body))
        return self.body

    @property
    def retriable(self) -> bool:
        return self.status in (0, 429) or self.status >= 500

    @property
    def code_label(self) -> str:
        """A bounded label for metrics: the HTTP status, or 'connection'."""
        return str(self.status) if self.status else "connection"


class WriteRefused(ApiError):
    """A write stopped before it left the process (dry run, or not the leader)."""

    def __init__(self, why: str, method: str, path: str) -> None:
        super().__init__(0, why, f"{method} {path}")
        self.method = method
        self.path = path

    @property
    def retriable(self) -> bool:
        return False


class Transport(Protocol):
    """One HTTP round trip to the apiserver, JSON in and out."""

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Returns the decoded JSON answer; raises `ApiError` on a non-2xx answer."""
        ...

    def stream(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> Iterator[JSON]:
        """A watch: yields one decoded JSON event per line until the server ends it."""
        ...


@dataclass(frozen=True, slots=True)
class Resource:
    """One API resource, enough to build its URLs."""

    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def collection(self, namespace: str | None = None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{quote(namespace, safe='')}/{self.plural}"
        return f"{root}/{self.plural}"

    def item(self, name: str, namespace: str | None = None) -> str:
        return f"{self.collection(namespace)}/{quote(name, safe='')}"

    def with_version(self, version: str) -> Resource:
        return Resource(self.group, version, self.plural, self.kind, self.namespaced)


WORKLOADS = Resource(KUEUE_GROUP, "v1beta2", "workloads", "Workload")
CLUSTER_QUEUES = Resource(KUEUE_GROUP, "v1beta2", "clusterqueues", "ClusterQueue", False)
LOCAL_QUEUES = Resource(KUEUE_GROUP, "v1beta2", "localqueues", "LocalQueue")
ADMISSION_CHECKS = Resource(KUEUE_GROUP, "v1beta2", "admissionchecks", "AdmissionCheck", False)
JOBS = Resource("batch", "v1", "jobs", "Job")
PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", False)
EVENTS = Resource("", "v1", "events", "Event")
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
SELF_SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False
)


def path_class(method: str, path: str) -> str:
    """A bounded description of a request for counting: 'PATCH workloads'."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if "namespaces" in parts:
        i = parts.index("namespaces")
        parts = parts[:i] + parts[i + 2 :]
    # /api/v1/<plural>[/name] or /apis/<group>/<version>/<plural>[/name]
    start = 2 if parts[:1] == ["api"] else 3
    plural = parts[start] if len(parts) > start else "/".join(parts) or "/"
    return f"{method} {plural}"


class CountingTransport:
    """Counts every request by `path_class`, then passes it on. Thread-safe."""

    def __init__(
        self, inner: Transport, on_request: Callable[[str, str], None] | None = None
    ) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._on_request = on_request
        self.counts: Counter[str] = Counter()

    def _count(self, method: str, path: str, query: Mapping[str, str] | None) -> None:
        label = path_class(method, path)
        if query and query.get("watch") in ("1", "true"):
            label = "WATCH " + label.split(" ", 1)[1]
        with self._lock:
            self.counts[label] += 1
        if self._on_request is not None:
            verb, resource = label.split(" ", 1)
            self._on_request(verb, resource)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    def writes(self) -> int:
        with self._lock:
            return sum(n for k, n in self.counts.items() if k.split(" ", 1)[0] in WRITE_METHODS)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        self._count(method, path, query)
        return self._inner.request(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )

    def stream(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> Iterator[JSON]:
        self._count("GET", path, {**(query or {}), "watch": "1"})
        return self._inner.stream(path, query=query, timeout=timeout)


class GuardedTransport:
    """Passes reads through; passes writes only while `allowed()` says so, else `WriteRefused`.

    `allowed()` returns a bool, or the seconds the write may still take (<= 0: refused): that
    becomes the write's deadline (`WRITE_DEADLINE`) and caps its timeout. The leader passes
    the time left before its Lease could be taken by another replica, so a write that is
    delayed past it is refused at the bottom of the stack instead of landing late.
    `ReadOnlyTransport` is the special case `allowed = lambda: False`.
    """

    def __init__(
        self, inner: Transport, allowed: Callable[[], bool | float], why: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._allowed = allowed
        self._why = why
        self._clock = clock

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        if method.upper() == "GET":
            return self._inner.request(
                method, path, query=query, body=body, content_type=content_type,
                timeout=timeout)
        allowed = self._allowed()
        if allowed is False or (not isinstance(allowed, bool) and allowed <= 0):
            raise WriteRefused(self._why, method.upper(), path)
        if isinstance(allowed, bool):
            return self._inner.request(
                method, path, query=query, body=body, content_type=content_type,
                timeout=timeout)
        deadline = time.monotonic() + float(allowed)
        outer = WRITE_DEADLINE.get()
        token = WRITE_DEADLINE.set(deadline if outer is None else min(outer, deadline))
        try:
            return self._inner.request(
                method, path, query=query, body=body, content_type=content_type,
                timeout=float(allowed) if timeout is None else min(timeout, float(allowed)))
        finally:
            WRITE_DEADLINE.reset(token)

    def stream(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> Iterator[JSON]:
        return self._inner.stream(path, query=query, timeout=timeout)


class TokenBucket:
    """`qps` tokens per second, at most `burst` saved; `take()` blocks until one is there."""

    def __init__(
        self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.qps = float(qps)
        self.burst = max(1, int(burst))
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._at = clock()
        self.waited = 0.0  # seconds spent waiting in total (metrics, tests)

    def take(self) -> float:
        """Take one token, waiting if needed; returns the seconds waited."""
        if self.qps <= 0:
            return 0.0
        with self._lock:  # callers queue up in order
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            wait = 0.0
            if self._tokens < 1:
                wait = (1 - self._tokens) / self.qps
                self._sleep(wait)
                self._at = self._clock()
                self._tokens = 1.0
            self._tokens -= 1
            self.waited += wait
            return wait


class RateLimitedTransport:
    """Every request (not watches) takes a token from `bucket` first (client-side QPS)."""

    def __init__(self, inner: Transport, bucket: TokenBucket) -> None:
        self._inner = inner
        self.bucket = bucket

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        self.bucket.take()
        return self._inner.request(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout)

    def stream(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> Iterator[JSON]:
        return self._inner.stream(path, query=query, timeout=timeout)


class ReadOnlyTransport(GuardedTransport):
    """The dry-run client: every non-GET request is refused before it is sent."""

    def __init__(self, inner: Transport) -> None:
        super().__init__(inner, lambda: False, "dry run: writes are disabled")
