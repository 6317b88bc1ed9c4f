"""An in-memory stand-in for the apiserver behind `Transport`, for unit tests only.

It implements just what the controller uses, answering as kube-apiserver does where it
implements something at all: GET of items and collections (label selectors `k`, `k=v`,
`!k`; `limit`/`continue` pagination), watches from a resourceVersion (with `410 Gone` after
`compact`) that stay open until their `timeoutSeconds` (or `close()`), sending a BOOKMARK
every `bookmark_every` seconds while idle, POST (incl. `generateName`), PUT with optimistic
concurrency, and PATCH as JSON merge patch, JSON patch (add, replace, remove, test; list
indices) and strategic merge patch — the latter only for built-in kinds: for custom
resources (`*.x-k8s.io`) it answers 415 like the real apiserver. Objects of kinds with a
status subresource keep their `status` on writes to the main resource, and only their
`status` changes on writes to `.../status`. Failures can be injected per method and path.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from controller.live.api import JSON, JSON_PATCH, STRATEGIC_MERGE_PATCH, ApiError


@dataclass
class _Failure:
    method: str
    path_part: str
    status: int
    times: int
    message: str


# Kinds whose objects have a status subresource (the main resource ignores `status`).
STATUS_SUBRESOURCE = frozenset({"workloads", "clusterqueues", "localqueues", "jobs", "pods",
                                "nodes", "deployments"})


def _subresource(path: str) -> tuple[str, str]:
    """-> (path of the object, subresource or "")."""
    parts = [p for p in path.split("/") if p]
    root_len = 2 if parts and parts[0] == "api" else 3
    rest = parts[root_len:]
    depth = 4 if rest[:1] == ["namespaces"] else 2  # [namespaces, ns,] plural, name
    if len(rest) > depth:
        return "/" + "/".join(parts[: root_len + depth]), "/".join(rest[depth:])
    return path, ""


def _custom(root: str) -> bool:
    """A CustomResourceDefinition's group (kube-apiserver has no strategic merge for those)."""
    return root.startswith("apis/") and root.split("/")[1].endswith(".x-k8s.io")


def _is_discovery(path: str) -> bool:
    """/apis/<group>, /apis/<group>/<version>, /api/<version>: no resource in the path."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    return (parts[:1] == ["apis"] and len(parts) <= 3) or (parts[:1] == ["api"] and len(parts) <= 2)


def _split(path: str) -> tuple[str, str | None, str, str | None]:
    """-> (api root incl. version, namespace, plural, name)."""
    parts = [p for p in path.split("/") if p]
    root_len = 2 if parts[0] == "api" else 3
    root = "/".join(parts[:root_len])
    rest = parts[root_len:]
    namespace = None
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace = rest[1]
        rest = rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    return root, namespace, plural, name


def _selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v:
                return False
        elif term not in labels:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Merge patch, except lists of dicts with `name` merge item by item."""
    if isinstance(patch, list) and isinstance(target, list) and all(
        isinstance(i, dict) and "name" in i for i in patch
    ):
        out = [copy.deepcopy(i) for i in target]
        for item in patch:
            match = next((o for o in out if o.get("name") == item["name"]), None)
            if match is None:
                out.append(copy.deepcopy(item))
            else:
                out[out.index(match)] = strategic_merge_patch(match, item)
        return out
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out_d = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out_d.pop(k, None)
        else:
            out_d[k] = strategic_merge_patch(out_d.get(k), v)
    return out_d


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def json_patch(doc: JSON, ops: list[JSON]) -> JSON:
    out = copy.deepcopy(doc)
    for op in ops:
        tokens = [_unescape(t) for t in str(op["path"]).split("/")[1:]]
        parent: Any = out
        for t in tokens[:-1]:
            if isinstance(parent, list) and t.isdigit() and int(t) < len(parent):
                parent = parent[int(t)]
                continue
            if not isinstance(parent, dict) or t not in parent:
                message = f"missing path {op['path']}"
                raise ApiError(422, "Invalid", json.dumps({"message": message}))
            parent = parent[t]
        last: Any = tokens[-1]
        kind = op["op"]
        if isinstance(parent, list):
            if not last.isdigit() or int(last) >= len(parent) + (kind == "add"):
                raise ApiError(422, "Invalid", json.dumps({"message": "bad index"}))
            last = int(last)
            if kind == "add":
                parent.insert(last, copy.deepcopy(op["value"]))
                continue
        if kind == "test":
            present = (last < len(parent)) if isinstance(parent, list) else (
                isinstance(parent, dict) and last in parent)
            # kube-apiserver's JSON patch: a test for null passes where the key is missing.
            if (not present and op["value"] is not None) or (
                    present and parent[last] != op["value"]):
                # What kube-apiserver 1.36 answers (nothing names the test op).
                raise ApiError(
                    422, "Unprocessable Entity",
                    json.dumps({"message": "the server rejected our request due to an error "
                                           "in our request", "reason": "Invalid"}),
                )
        elif kind in ("add", "replace"):
            if kind == "replace" and last not in parent:
                raise ApiError(422, "Invalid", json.dumps({"message": "replace: missing"}))
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            if isinstance(parent, list):
                del parent[last]
                continue
            if last not in parent:
                raise ApiError(422, "Invalid", json.dumps({"message": "remove: missing"}))
            del parent[last]
        else:
            raise ApiError(422, "Invalid", json.dumps({"message": f"unsupported op {kind}"}))
    return out


class FakeApi:
    """A thread-safe in-memory apiserver speaking the controller's `Transport`."""

    def __init__(self, bookmark_every: float = 0.05) -> None:
        self._lock = threading.Condition()
        self._objects: dict[tuple[str, str, str | None, str], JSON] = {}
        self._log: list[tuple[int, str, str, str, JSON]] = []  # rv, root, plural, type, obj
        self._rv = itertools.count(100)
        self._last_rv = 99
        self._compacted = 0
        self._uids = itertools.count(1)
        self._names = itertools.count(1)
        self._failures: list[_Failure] = []
        self._bookmark_every = bookmark_every
        self._closed = 0  # generation: `close()` ends the watches opened before it
        self.requests: list[tuple[str, str]] = []
        # Fixed answers for GETs of non-object paths (/version, /apis/<group>, ...).
        self.static: dict[str, JSON] = {}
        # SelfSubjectAccessReviews answer allowed unless "<verb> <resource>" is in here.
        self.denied: set[str] = set()

    # -- test helpers ---------------------------------------------------------------------

    def fail(
        self, method: str, path_part: str, status: int, times: int = 1, message: str = ""
    ) -> None:
        """The next `times` requests with this method whose path contains `path_part` fail."""
        with self._lock:
            self._failures.append(_Failure(method, path_part, status, times, message))

    def compact(self) -> None:
        """Forget the watch history: older resourceVersions get 410 Gone."""
        with self._lock:
            self._compacted = self._last_rv
            self._log.clear()

    def put_object(self, path: str, obj: JSON) -> JSON:
        """Create or replace without checks (test set-up)."""
        root, ns, plural, _ = _split(path)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if ns:
            meta["namespace"] = ns
        with self._lock:
            key = (root, plural, meta.get("namespace"), meta["name"])
            kind = "MODIFIED" if key in self._objects else "ADDED"
            if key in self._objects:  # an update keeps the object's identity
                meta.setdefault("uid", self._objects[key]["metadata"]["uid"])
            meta.setdefault("uid", f"uid-{next(self._uids)}")
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
            return self._store(key, obj, kind)

    def get_object(self, path: str) -> JSON | None:
        root, ns, plural, name = _split(path)
        with self._lock:
            obj = self._objects.get((root, plural, ns, name or ""))
            return copy.deepcopy(obj) if obj else None

    def close(self) -> None:
        """End every open watch (what closing the client's connections does)."""
        with self._lock:
            self._closed += 1
            self._lock.notify_all()

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] != "GET"]

    # -- Transport ------------------------------------------------------------------------

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
        method = method.upper()
        with self._lock:
            self.requests.append((method, path))
            self._maybe_fail(method, path)
            if method == "GET" and path in self.static:
                return copy.deepcopy(self.static[path])
            if method == "POST" and "selfsubjectaccessreviews" in path:
                attrs = body["spec"]["resourceAttributes"]
                allowed = f"{attrs['verb']} {attrs['resource']}" not in self.denied
                return {**body, "status": {"allowed": allowed}}
            if method == "GET" and _is_discovery(path):
                # A group or group/version nobody served: the real apiserver says 404.
                raise ApiError(404, "Not Found",
                               f"the server could not find the requested resource ({path})")
            path, sub = _subresource(path)
            root, ns, plural, name = _split(path)
            if method == "POST":
                return self._create(root, plural, ns, body)
            if name is None:
                if method == "GET":
                    return self._list(root, plural, ns, query or {})
                raise ApiError(405, "MethodNotAllowed")
            if method == "GET":
                return copy.deepcopy(self._existing(root, plural, ns, name))
            if method == "PUT":
                return self._replace(root, plural, ns, name, body, sub)
            if method == "PATCH":
                return self._patch(root, plural, ns, name, body, content_type or "", sub)
            if method == "DELETE":
                obj = self._existing(root, plural, ns, name)
                del self._objects[(root, plural, ns, name)]
                self._record(root, plural, "DELETED", obj)
                return obj
        raise ApiError(405, "MethodNotAllowed")

    def stream(
        self, path: str, *, query: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> Iterator[JSON]:
        with self._lock:
            self.requests.append(("GET", path + "?watch"))
            self._maybe_fail("GET", path)
        return self._watch(path, dict(query or {}))

    # -- internals (call with the lock held) ----------------------------------------------

    def _maybe_fail(self, method: str, path: str) -> None:
        for f in self._failures:
            if f.method == method and f.path_part in path and f.times > 0:
                f.times -= 1
                raise ApiError(f.status, "Injected", json.dumps({"message": f.message}))

    def _existing(self, root: str, plural: str, ns: str | None, name: str) -> JSON:
        obj = self._objects.get((root, plural, ns, name))
        if obj is None:
            raise ApiError(404, "NotFound", json.dumps({"message": f"{plural} {name} not found"}))
        return obj

    def _store(self, key: tuple[str, str, str | None, str], obj: JSON, kind: str) -> JSON:
        rv = next(self._rv)
        self._last_rv = rv
        obj["metadata"]["resourceVersion"] = str(rv)
        self._objects[key] = obj
        self._log.append((rv, key[0], key[1], kind, copy.deepcopy(obj)))
        self._lock.notify_all()
        return copy.deepcopy(obj)

    def _record(self, root: str, plural: str, kind: str, obj: JSON) -> None:
        rv = next(self._rv)
        self._last_rv = rv
        self._log.append((rv, root, plural, kind, copy.deepcopy(obj)))
        self._lock.notify_all()

    def _list(self, root: str, plural: str, ns: str | None, query: Mapping[str, str]) -> JSON:
        selector = query.get("labelSelector", "")
        items = [
            copy.deepcopy(o)
            for (r, p, n, _), o in sorted(self._objects.items(), key=lambda kv: str(kv[0]))
            if r == root and p == plural and (ns is None or n == ns)
            and _selector_matches(selector, (o.get("metadata") or {}).get("labels") or {})
        ]
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or 0) or len(items) or 1
        page = items[start : start + limit]
        more = start + limit < len(items)
        return {
            "kind": "List",
            "metadata": {
                "resourceVersion": str(self._last_rv),
                **({"continue": str(start + limit)} if more else {}),
            },
            "items": page,
        }

    def _create(self, root: str, plural: str, ns: str | None, body: Any) -> JSON:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            meta["name"] = f"{meta.get('generateName', 'obj-')}{next(self._names):05d}"
        if ns:
            meta["namespace"] = ns
        key = (root, plural, ns, meta["name"])
        if key in self._objects:
            raise ApiError(409, "AlreadyExists", json.dumps({"message": "already exists"}))
        meta["uid"] = f"uid-{next(self._uids)}"
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        return self._store(key, obj, "ADDED")

    def _replace(
        self, root: str, plural: str, ns: str | None, name: str, body: Any, sub: str = ""
    ) -> JSON:
        old = self._existing(root, plural, ns, name)
        sent_rv = (body.get("metadata") or {}).get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", json.dumps({"message": "the object has been modified"}))
        obj = self._subresource_view(plural, old, copy.deepcopy(body), sub)
        obj["metadata"]["uid"] = old["metadata"]["uid"]
        return self._store((root, plural, ns, name), obj, "MODIFIED")

    @staticmethod
    def _subresource_view(plural: str, old: JSON, new: JSON, sub: str) -> JSON:
        """What a write keeps: only `status` from a write to `/status`; everything but
        `status` from a write to the main resource of a kind with a status subresource."""
        if sub == "status":
            out = copy.deepcopy(old)
            if "status" in new:
                out["status"] = new["status"]
            else:
                out.pop("status", None)
            return out
        if sub:
            raise ApiError(404, "NotFound", json.dumps({"message": f"no subresource {sub}"}))
        if plural in STATUS_SUBRESOURCE:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        return new

    def _patch(
        self, root: str, plural: str, ns: str | None, name: str, body: Any, content_type: str,
        sub: str = "",
    ) -> JSON:
        old = self._existing(root, plural, ns, name)
        if content_type == JSON_PATCH:
            new = json_patch(old, body)
        elif content_type == STRATEGIC_MERGE_PATCH:
            if _custom(root):
                raise ApiError(415, "Unsupported Media Type", json.dumps({
                    "message": "the body of the request was in an unknown format - accepted "
                               "media types include: application/json-patch+json, "
                               "application/merge-patch+json, application/apply-patch+yaml",
                    "reason": "UnsupportedMediaType", "code": 415}))
            new = strategic_merge_patch(old, body)
        else:
            new = merge_patch(old, body)
        new = self._subresource_view(plural, old, new, sub)
        if new.get("metadata", {}).get("uid") != old["metadata"]["uid"]:
            raise ApiError(422, "Invalid", json.dumps({"message": "metadata.uid: immutable"}))
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return copy.deepcopy(old)  # a no-op patch does not bump resourceVersion
        return self._store((root, plural, ns, name), new, "MODIFIED")

    def _watch(self, path: str, query: dict[str, str]) -> Iterator[JSON]:
        """Events after `resourceVersion` as they happen, until `timeoutSeconds` (default
        30 min, as the apiserver's) or `close()`; a BOOKMARK while idle."""
        root, ns, plural, _ = _split(path)
        since = int(query.get("resourceVersion") or 0)
        selector = query.get("labelSelector", "")
        bookmarks = query.get("allowWatchBookmarks") == "true"
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        with self._lock:
            generation = self._closed
            if since < self._compacted:
                yield {"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                   "reason": "Expired", "message": "too old"}}
                return
        while True:
            with self._lock:
                if self._closed != generation:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                if since < self._compacted:
                    yield {"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                       "reason": "Expired", "message": "too old"}}
                    return
                if not any(rv > since for rv, *_ in self._log):
                    self._lock.wait(min(self._bookmark_every, remaining))
                batch = [e for e in self._log if e[0] > since and e[1] == root
                         and e[2] == plural]
                last_rv = self._last_rv
                if self._closed != generation:
                    return
            since = max(since, last_rv)
            for _rv, _root, _plural, kind, obj in batch:
                meta = obj.get("metadata") or {}
                if ns is not None and meta.get("namespace") != ns:
                    continue
                if not _selector_matches(selector, meta.get("labels") or {}):
                    continue
                yield {"type": kind, "object": copy.deepcopy(obj)}
            if bookmarks:
                yield {"type": "BOOKMARK",
                       "object": {"metadata": {"resourceVersion": str(last_rv)}}}
