"""The objects' own history as the witness of which controller replica changed what.

Independent of the audit log: a watch, started before the writes, reports every change of
every Workload of a namespace with its resourceVersion (etcd's commit order, one order for
all objects) and its managedFields. Each replica writes under its own field manager
(`wdrf-controller/<identity>`, as its User-Agent), and the apiserver stamps a manager's entry
with the time (to the second) of every write of that manager that changed the object. So a
change was written by the managers whose entry it added, re-stamped, or gave fields the entry
did not own before. A replica writing the same object twice within one second leaves its
entry as it was; such a change of a field only the controller writes is given to the one
replica whose entry carries the object's latest stamp, or marked ambiguous.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s

from controller.domain import KUEUE_PRIORITY_BOOST_ANNOTATION, PRIORITY_TERMS_ANNOTATION
from tests.plane.live_audit import UA_PREFIX
from tests.support import kube

Obj = dict[str, Any]


@dataclass(frozen=True)
class Entry:
    time: str
    operation: str
    fields: frozenset[str]


@dataclass(frozen=True)
class Change:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    name: str
    writers: frozenset[str]  # field managers the change is attributed to
    controller_fields: bool  # the boost, the terms or spec.priority changed
    inferred: bool = False  # a same-second write, given to the latest-stamped replica
    ambiguous: bool = False  # a controller field changed, no single replica to give it to

    def replicas(self) -> frozenset[str]:
        return frozenset(w[len(UA_PREFIX):] for w in self.writers if w.startswith(UA_PREFIX))


def _paths(fields: Any, prefix: str = "") -> Iterator[str]:
    for key, sub in (fields or {}).items():
        path = f"{prefix}/{key}"
        yield path
        yield from _paths(sub, path)


def entries(obj: Obj) -> dict[tuple[str, str, str], Entry]:
    out = {}
    for e in obj["metadata"].get("managedFields") or []:
        key = (str(e.get("manager", "")), str(e.get("operation", "")),
               str(e.get("subresource", "")))
        out[key] = Entry(str(e.get("time", "")), key[1], frozenset(_paths(e.get("fieldsV1"))))
    return out


def _controller_fields(obj: Obj) -> tuple[Any, ...]:
    ann = obj["metadata"].get("annotations") or {}
    return (ann.get(KUEUE_PRIORITY_BOOST_ANNOTATION), ann.get(PRIORITY_TERMS_ANNOTATION),
            (obj.get("spec") or {}).get("priority"))


def attribute(kind: str, before: Obj | None, after: Obj) -> Change:
    """The change from `before` (None: not seen yet) to `after`, with who wrote it."""
    meta = after["metadata"]
    prev = entries(before) if before is not None else {}
    now = entries(after)
    writers = {key[0] for key, e in now.items() if kind != "DELETED" and (
        key not in prev or prev[key].time != e.time or not e.fields <= prev[key].fields)}
    ours = before is not None and _controller_fields(before) != _controller_fields(after)
    inferred = ambiguous = False
    if ours and not any(w.startswith(UA_PREFIX) for w in writers):
        stamped = [(e.time, key[0]) for key, e in now.items() if key[0].startswith(UA_PREFIX)]
        latest = max((t for t, _ in stamped), default="")
        candidates = {m for t, m in stamped if t == latest}
        if len(candidates) == 1:
            writers |= candidates
            inferred = True
        else:
            ambiguous = True
    return Change(int(meta["resourceVersion"]), kind, str(meta["name"]), frozenset(writers),
                  ours, inferred, ambiguous)


class History:
    """Every change of the namespace's Workloads from `start()` to `stop()`, by watching
    from the resourceVersion of a list (re-watching from the last one seen when the server
    ends a watch; a 410 Gone, events lost, is recorded as an error)."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self._api = api
        self._path = kube.kueue_path("workloads", namespace=namespace)
        self._last: dict[str, Obj] = {}  # uid -> the object as last seen
        self._changes: list[Change] = []
        self._rv = ""
        self._stop = threading.Event()
        self._lock = threading.Condition()  # notified at every change
        self._thread = threading.Thread(target=self._run, daemon=True, name="history")
        self.error = ""

    def start(self) -> History:
        listed = kube.request(self._api, "GET", self._path)
        self._rv = str(listed["metadata"]["resourceVersion"])
        for item in listed["items"]:
            self._last[item["metadata"]["uid"]] = item
        self._thread.start()
        return self

    def caught_up(self) -> bool:
        """The watch has seen every Workload as it is now."""
        with self._lock:
            seen = {uid: int(o["metadata"]["resourceVersion"]) for uid, o in self._last.items()}
        return all(seen.get(w["metadata"]["uid"], 0) >= int(w["metadata"]["resourceVersion"])
                   for w in kube.request(self._api, "GET", self._path)["items"])

    def wait_for(self, seen: Callable[[list[Change]], bool], timeout: float, what: str) -> None:
        """Returns as soon as the changes seen so far satisfy `seen` (checked at each change)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not seen(self._changes):
                left = deadline - time.monotonic()
                if left <= 0 or self.error:
                    raise kube.WaitTimeout(f"timed out waiting for {what} "
                                           f"({self.error or f'{len(self._changes)} changes'})")
                self._lock.wait(min(left, 0.5))

    def stop(self) -> list[Change]:
        """Stops the watch; every change seen, in resourceVersion order."""
        self._stop.set()
        self._thread.join(30)
        with self._lock:
            return sorted(self._changes, key=lambda c: c.rv)

    def _run(self) -> None:
        while not self._stop.is_set() and not self.error:
            try:
                self._watch_once()
            except (json.JSONDecodeError, KeyError) as e:
                self.error = f"unreadable watch event: {e!r}"
            except (urllib3.exceptions.HTTPError, OSError):  # broken under load: re-watch
                self._stop.wait(0.5)

    def _watch_once(self) -> None:
        query = {"watch": "1", "resourceVersion": self._rv, "allowWatchBookmarks": "true",
                 "timeoutSeconds": "5"}
        _, url, headers, _, _ = self._api.param_serialize(
            "GET", self._path, query_params=list(query.items()),
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        resp = self._api.rest_client.request("GET", url, headers=headers,
                                             _request_timeout=(10, 30)).response
        try:
            if resp.status != 200:
                self.error = f"watch answered {resp.status}: {resp.data[:200]!r}"
                return
            pending = b""
            for chunk in resp.stream(16 * 1024, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._record(json.loads(line))
                if self._stop.is_set() or self.error:
                    return
        finally:
            resp.release_conn()

    def _record(self, event: Obj) -> None:
        kind, obj = str(event["type"]), event["object"]
        if kind == "ERROR":
            self.error = f"watch error: {obj.get('code')} {obj.get('message')}"
            return
        self._rv = str(obj["metadata"]["resourceVersion"])
        if kind == "BOOKMARK":
            return
        uid = obj["metadata"]["uid"]
        with self._lock:
            self._changes.append(attribute(kind, self._last.get(uid), obj))
            self._last[uid] = obj
            self._lock.notify_all()
